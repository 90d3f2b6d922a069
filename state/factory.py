"""``open_store``: the one way to get a :class:`~streamlearn.state.base.Store`."""
from __future__ import annotations

import os

from ..config import StoreConfig
from .base import Store
from .exceptions import StateError
from .schema import MAX_SHARDS

BACKENDS = ("lmdb", "memory")


def open_store(
    path: str | os.PathLike | None,
    cfg: StoreConfig | None = None,
    readonly: bool = False,
    backend: str | None = None,
) -> Store:
    """Open (a writer creates) the state store at ``path``.

    ``backend`` overrides ``cfg.backend``. A read-only LMDB store takes its shard count and
    map size from the directory; a writer's ``cfg.shards`` must match a directory's.

    >>> with open_store(None, backend="memory") as store:
    ...     store.manifest().step
    0
    """
    cfg = cfg or StoreConfig()
    backend = backend or cfg.backend
    _check_config(cfg, backend)
    if backend == "memory":
        from .memory import MemoryStore

        return MemoryStore(None if path is None else os.fspath(path), cfg, readonly)
    if path is None:
        raise StateError("the lmdb backend needs a state directory (--state DIR)")
    from .lmdb_store import LmdbStore

    return LmdbStore(os.fspath(path), cfg, readonly)


def _check_config(cfg: StoreConfig, backend: str) -> None:
    if backend not in BACKENDS:
        raise StateError(f"store.backend={backend!r}; choose one of {BACKENDS}")
    if not 1 <= cfg.shards <= MAX_SHARDS:
        raise StateError(f"store.shards={cfg.shards} must be in [1, {MAX_SHARDS}]")
    if not cfg.map_size_gb > 0:
        raise StateError(f"store.map_size_gb={cfg.map_size_gb} must be > 0")
