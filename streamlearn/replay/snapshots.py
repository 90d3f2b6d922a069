"""Learners in and out of state directories, for replay.

A replay never writes to the state it starts from: the snapshot is opened read-only and
restored into memory. ``--save DIR`` writes the replayed learner to a *new* directory.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from ..checkpoint import has_checkpoint, read_full, stored_config, write
from ..exceptions import NoCheckpointError, StreamlearnError
from ..learner import Learner

__all__ = ["check_new_dir", "load_learner", "save_learner"]


def load_learner(state: str | os.PathLike, overrides: list[str] = ()) -> Learner:
    """The learner of the last checkpoint in ``state`` (its stored config, then
    ``overrides`` such as ``learner.seed=1``; they must build the same tables)."""
    from ..state import open_store
    from ..state.exceptions import StateError

    if not Path(state).is_dir():
        raise StreamlearnError(f"no state directory {state}: pass a directory a worker or `replay --save` wrote")
    try:
        with open_store(state, readonly=True, backend="lmdb") as store:
            if not has_checkpoint(store):
                raise NoCheckpointError(f"state {state} holds no checkpoint yet: nothing to replay from")
            cfg = stored_config(store).override(*overrides)
            return read_full(store, cfg)
    except StateError as exc:
        raise StreamlearnError(f"cannot open the state {state}: {exc}") from exc


def check_new_dir(path: str | os.PathLike, name: str = "the state directory") -> Path:
    """``path`` as a Path if it is free for a new state (absent, or an empty directory);
    ``name`` is what the caller called it in the error (``--save`` on the command line)."""
    target = Path(path)
    if target.exists() and not target.is_dir():  # was: "the directory exists and is not empty" for a file
        raise StreamlearnError(f"{name} {path}: a file, not a directory; choose a new directory")
    if target.exists() and any(target.iterdir()):
        raise StreamlearnError(f"{name} {path}: the directory exists and is not empty; choose a new directory")
    return target


def save_learner(learner: Learner, path: str | os.PathLike, metrics: dict[str, Any] | None = None) -> int:
    """Write ``learner`` as one full checkpoint into a new state directory ``path``
    (created; an existing non-empty directory is refused, so no state is overwritten).
    Returns the step saved. The manifest holds no Kafka offsets (a replay is no
    consumer position), so a worker started on the directory reads every partition from
    its start, learning on top of the saved model."""
    from ..state import Checkpoint, open_store

    target = check_new_dir(path)
    specs, rows, blobs, kv = write(learner, full=True)
    rows = _beyond_init(learner, rows)
    with open_store(target, learner.cfg.store, backend="lmdb") as store:
        store.declare_tables(specs)
        store.commit(Checkpoint(step=learner.steps, rows=rows, blobs=blobs, kv=kv,
                                config=learner.cfg.to_dict(), metrics=metrics))
    return learner.steps


def _beyond_init(learner: Learner, rows: dict) -> dict:
    """Of a full checkpoint's ``rows`` (``{table: (ids, values)}``), those that differ from
    their seeded init: a row never stored reads back as that init, which the config
    rebuilds bit for bit (:mod:`streamlearn.checkpoint`), so the saved model is the same.
    Was: every row, 150-340 MB for a replay of 1,000-3,000 records (P alone 10^6 rows),
    and a dashboard that showed every table full."""
    init = Learner(learner.cfg).row_tables()
    out = {}
    for name, (ids, values) in rows.items():
        seeded = init[name].detach()[ids].float().cpu().numpy()  # (n, width), as write() reads the table
        # by bits: the count tables' float32 words hold bits, some of them NaN patterns
        keep = (np.ascontiguousarray(values, np.float32).view(np.uint32) != seeded.view(np.uint32)).any(axis=1)
        if keep.any():
            out[name] = (ids[keep], values[keep])
    return out
