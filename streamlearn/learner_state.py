"""A :class:`~streamlearn.learner.Learner`'s checkpoint parts, and their restore.

What a checkpoint holds (``checkpoint_parts`` returns ``(table_specs, rows, blobs, kv)``;
the worker wraps them in a ``state.Checkpoint`` with its offsets):

- tables: each embedding row table (``"E"``, ``"P"``, ...) and its row-optimizer state
  (``"E.sum"`` for Adagrad; ``"E.exp_avg"``, ``"E.exp_avg_sq"`` for lazy Adam), float32,
  same ids; with the Naive Bayes part on (``learner.nb_weight > 0``), its count table
  ``"nb.counts"`` (zero-initialised). Only rows changed since the previous checkpoint
  are written (all with ``full=True``). A row never written is still its seeded init, which the config
  rebuilds bit for bit, so restoring starts from the init and overlays the stored rows.
- blobs: ``learner.config`` (JSON), ``learner.meta`` (counters), ``model.dense`` (every
  non-row weight, ``torch.save``), ``optim.dense`` (AdamW), ``optim.rows`` (the row
  optimizer's step count), ``learner.labels`` (the label table).
- kv: namespace ``history`` (key -> [key, items], msgpack; keys of changed histories
  only) and ``candidates`` (8-byte big-endian sequence number -> token; only tokens
  added since the previous checkpoint, replayed in order on restore).
"""
from __future__ import annotations

import io
import json
from typing import TYPE_CHECKING

import msgpack
import numpy as np
import torch
import xxhash

from .config import Config
from .embeddings import build_embedding
from .exceptions import StreamlearnError
from .objectives import Histories, LabelTable
from .state.schema import TableSpec

if TYPE_CHECKING:
    from .learner import Learner

FORMAT = 3  # 2: the Naive Bayes counts index tokens by hash embeddings' D1 where it is wide enough;
#            3: the task's head is the model's one ``head`` (dense keys "head.*")
# Dense keys of the heads before format 3, renamed on load (the weights are the same).
_OLD_HEADS = ("label_head.", "hashed_head.", "tfree_head.")
_SHORT_KEY = 256  # longer history keys are stored under their xxh3-128 digest


def checkpoint_parts(learner: "Learner", full: bool):
    """``(table_specs, rows, blobs, kv)``; consumes the dirty rows, changed histories
    and new candidates (see ``Learner.checkpoint_parts``)."""
    tables = row_tables(learner)
    dirty = learner.take_dirty()
    rows = {}
    for name, t in tables.items():
        ids = np.arange(t.shape[0], dtype=np.int64) if full else dirty.get(name)
        if ids is not None and len(ids):
            rows[name] = (ids, t.detach()[torch.from_numpy(ids).to(t.device)].float().cpu().numpy())
    specs = [TableSpec(name, int(t.shape[0]), int(t.shape[1]), "float32") for name, t in tables.items()]
    return specs, rows, _blobs(learner), _kv(learner, full)


def row_tables(learner: "Learner") -> dict[str, torch.Tensor]:
    """Every row table and row-optimizer state table, by store name."""
    return {**learner.value_tables(), **learner.row_optim.state_tables()}


def _save(obj) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def _load(data: bytes):
    return torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)


def dense_weights(data: bytes, device: torch.device | str = "cpu") -> dict[str, torch.Tensor]:
    """The ``model.dense`` blob as a state dict on ``device``, keys of an older format
    renamed to this one's."""
    state = torch.load(io.BytesIO(data), map_location=device, weights_only=True)
    return {_current_key(k): v for k, v in state.items()}


def _current_key(key: str) -> str:
    old = next((p for p in _OLD_HEADS if key.startswith(p)), None)
    return key if old is None else "head." + key[len(old):]


def _dense_state(learner: "Learner") -> dict[str, torch.Tensor]:
    rows = {id(p) for p in learner.model.row_tables().values()}
    skip = {n for n, p in learner.model.named_parameters() if id(p) in rows}
    return {k: v for k, v in learner.model.state_dict().items() if k not in skip}


def _blobs(learner: "Learner") -> dict[str, bytes]:
    meta = {"format": FORMAT, "steps": learner.steps, "prepared": learner.prep.prepared,
            "applied": learner._applied, "candidates": learner.index.mark if learner.index else 0}
    return {
        "learner.config": learner.cfg.to_json().encode(),
        "learner.meta": msgpack.packb(meta),
        **({"learner.labels": learner.label_table.to_bytes()} if learner.label_table is not None else {}),
        "model.dense": _save(_dense_state(learner)),
        "optim.dense": _save(learner.dense_optim.state_dict()),
        "optim.rows": msgpack.packb(learner.row_optim.state_dict()),
    }


def _history_key(key: str) -> bytes:
    raw = key.encode("utf-8")
    return raw if len(raw) <= _SHORT_KEY else b"\x01" + xxhash.xxh3_128_digest(raw)


def _kv(learner: "Learner", full: bool) -> dict[str, dict[bytes, bytes]]:
    kv = {}
    if learner.histories is not None:
        histories = dict(learner.histories.items()) if full else learner.histories.take_dirty()
        if full:
            learner.histories.take_dirty()
        kv["history"] = {_history_key(k): msgpack.packb([k, list(v)]) for k, v in histories.items()}
    if learner.index is not None:
        start = 0 if full else learner._index_mark
        fresh = learner.index.new_since(start)
        kv["candidates"] = {(start + i).to_bytes(8, "big"): t.encode("utf-8") for i, t in enumerate(fresh)}
        learner._index_mark = start + len(fresh)
    return {ns: entries for ns, entries in kv.items() if entries}


# ---------------------------------------------------------------------------- restore

def stored_config(store) -> Config:
    """The config a store's learner was checkpointed with."""
    data = store.read_blob("learner.config")
    if data is None:
        raise StreamlearnError(f"store {store.path} holds no learner checkpoint (no learner.config blob)")
    return Config.from_dict(json.loads(data))


def load_into(learner: "Learner", store) -> None:
    """Overwrite ``learner`` with the store's last checkpoint (see the module docstring)."""
    meta_bytes = store.read_blob("learner.meta")
    if meta_bytes is None:
        raise StreamlearnError(f"store {store.path} holds no learner checkpoint (no learner.meta blob)")
    meta = msgpack.unpackb(meta_bytes)
    check_format(learner, meta, store)
    with store.snapshot():
        _check_tables(learner, store)
        _load_rows(learner, store)
        _load_blobs(learner, store)
        _load_kv(learner, store, meta["candidates"])
    learner.steps, learner.prep.prepared, learner._applied = meta["steps"], meta["prepared"], meta["applied"]
    learner._dirty = {}


def check_format(learner: "Learner", meta: dict, store) -> None:
    """Refuse Naive Bayes counts stored by checkpoint format 1, which indexed tokens by a
    hash of their own (format 2 reuses D1), rather than read them as wrong counts. A
    format-1 state without counts restores with the part on: it starts counting then."""
    if "nb.counts" in learner.task.count_tables() and meta.get("format", 1) < 2 and "nb.counts" in store.tables():
        raise StreamlearnError(
            f"this checkpoint's Naive Bayes counts were written by an older streamlearn (checkpoint "
            f"format {meta.get('format', 1)}, this one reads {FORMAT}) and index tokens differently: "
            "restore with learner.nb_weight=0, or train into a new state directory")


def _check_tables(learner: "Learner", store) -> None:
    stored = store.tables()
    for name, t in row_tables(learner).items():
        spec = stored.get(name)
        if spec is not None and (spec.rows, spec.width) != tuple(t.shape):
            raise StreamlearnError(
                f"stored table {name!r} is {spec.rows}x{spec.width} but this config builds "
                f"{t.shape[0]}x{t.shape[1]}: restore with the stored config (Learner.restore(store))"
            )


@torch.no_grad()
def _load_rows(learner: "Learner", store) -> None:
    # Start every table from its seeded init (rows never stored keep it), state from zero.
    fresh = build_embedding(learner.cfg.embedding, learner.cfg.hashing.seed)[1].row_tables()
    stored = store.tables()
    for name, t in row_tables(learner).items():
        host = fresh[name].detach().clone() if name in fresh else torch.zeros(t.shape, dtype=t.dtype)
        if name in stored:
            store.load_table(name, host.numpy())
        t.copy_(host.to(t.device))


def _load_blobs(learner: "Learner", store) -> None:
    dense = dense_weights(store.read_blob("model.dense"))
    missing, unexpected = learner.model.load_state_dict(dense, strict=False)
    expected_missing = set(learner.model.state_dict()) - set(_dense_state(learner))
    if unexpected or set(missing) != expected_missing:
        raise StreamlearnError(
            f"stored dense weights do not fit this model (missing {sorted(set(missing) - expected_missing)}, "
            f"unexpected {sorted(unexpected)}): restore with the stored config"
        )
    learner.dense_optim.load_state_dict(_load(store.read_blob("optim.dense")))
    learner.row_optim.load_state_dict(msgpack.unpackb(store.read_blob("optim.rows")))
    if learner.label_table is not None:
        learner.label_table.replace(LabelTable.from_bytes(store.read_blob("learner.labels")).labels)


def _load_kv(learner: "Learner", store, n_candidates: int) -> None:
    if learner.histories is not None:
        histories = Histories(learner.cfg.learner.history)
        for _, value in store.iter_kv("history"):
            key, items = msgpack.unpackb(value)
            histories.load(key, items)
        learner.prep.histories = histories
    if learner.index is None:
        return
    learner.task.reset_index()
    tokens = [v.decode("utf-8") for _, v in store.iter_kv("candidates")]
    if len(tokens) != n_candidates:
        raise StreamlearnError(
            f"store holds {len(tokens)} candidates but its checkpoint counted {n_candidates}: "
            "the candidates namespace was altered"
        )
    learner.index.extend(tokens)
    learner._index_mark = learner.index.mark
