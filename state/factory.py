"""``open_store``: the one way to get a :class:`~streamlearn.state.base.Store`."""
from __future__ import annotations

import dataclasses
import os

from ..config import StoreConfig
from .base import Store
from .exceptions import StateError


def open_store(
    path: str | os.PathLike | None,
    cfg: StoreConfig | None = None,
    readonly: bool = False,
    backend: str | None = None,
    reset: bool = False,
) -> Store:
    """Open (a writer creates) the state store at ``path``.

    ``backend`` overrides ``cfg.backend`` (and is checked as ``store.backend`` is). A
    read-only LMDB store takes its shard count and map size from the directory; a
    writer's ``cfg.shards`` must match a directory's.

    A writer creates a new state only in an absent or empty directory. A directory that
    holds a state which is damaged or incomplete (a meta record missing, ``data.mdb``
    empty, cut short or gone) raises :class:`DamagedStoreError`: it is never reset
    silently. ``reset=True`` (writers only) discards what the directory holds first: the
    LMDB files move into ``path/discarded-<UTC time>/`` (files that are not the store's
    stay where they are), a WARNING says what they held (step, commits, offsets, size),
    ``store.discarded`` keeps that line, and a new, empty state starts; a worker then
    consumes its topics from the start.

    >>> with open_store(None, backend="memory") as store:
    ...     store.manifest().step
    0
    """
    cfg = cfg or StoreConfig()
    if backend is not None:
        cfg = dataclasses.replace(cfg, backend=backend)
    if reset and readonly:
        raise StateError("reset=True discards a state: only a writer may do it (readonly=False)")
    if cfg.backend == "memory":
        from .memory import MemoryStore

        return MemoryStore(None if path is None else os.fspath(path), cfg, readonly, reset)
    if path is None:
        raise StateError("the lmdb backend needs a state directory (--state DIR)")
    from .lmdb_store import LmdbStore

    return LmdbStore(os.fspath(path), cfg, readonly, reset)

