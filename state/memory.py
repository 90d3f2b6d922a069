"""The in-memory backend: same contract as LMDB, for tests and for replays run without
``--save``. Nothing touches the disk until :meth:`MemoryStore.compact` writes an LMDB copy.

Stores opened on the same ``path`` in one process share one state (a reader opened with
``readonly=True`` sees the writer's commits), as LMDB stores on one directory do. A
``path`` of None gives a private store.

Consistency comes from one lock: a commit applies under it, and each read call (or
``with store.snapshot():`` block) holds it, so a read never sees half a commit. Unlike
LMDB's MVCC, a snapshot block here makes the writer wait until the block ends.

Tables are dense chunks of 65,536 rows allocated on first write, so a huge declared table
costs memory only for the regions that were written.
"""
from __future__ import annotations

import os
import threading
import time
import weakref
from contextlib import contextmanager
from dataclasses import replace
from typing import Iterator, Sequence

import numpy as np

from ..config import StoreConfig
from .base import Store
from .changes import CHANGE_LOG, logged, union
from .exceptions import NotAStoreError, StateError
from .prepare import Prepared, check_ids, check_specs, next_manifest, prepare_checkpoint
from .schema import SCHEMA_VERSION, Checkpoint, Manifest, TableSpec, kv_key, shard_of
from .verify import VerifyReport

_CHUNK_BITS = 16
_CHUNK = 1 << _CHUNK_BITS


class _Table:
    """A table as dense chunks: ``values (CHUNK, width)`` and ``found (CHUNK,)`` each."""

    def __init__(self, spec: TableSpec) -> None:
        self.spec = spec
        self.chunks: dict[int, tuple[np.ndarray, np.ndarray]] = {}

    def _chunk(self, index: int) -> tuple[np.ndarray, np.ndarray]:
        chunk = self.chunks.get(index)
        if chunk is None:
            rows = min(_CHUNK, self.spec.rows - (index << _CHUNK_BITS))
            chunk = (np.zeros((rows, self.spec.width), self.spec.dtype), np.zeros(rows, bool))
            self.chunks[index] = chunk
        return chunk

    def write(self, ids: np.ndarray, values: np.ndarray) -> None:
        """``ids`` sorted and unique (as prepared), so each chunk is one slice."""
        chunk_of = ids >> _CHUNK_BITS
        starts = np.flatnonzero(np.r_[True, chunk_of[1:] != chunk_of[:-1]])
        for lo, hi in zip(starts.tolist(), [*starts[1:].tolist(), len(ids)]):
            vals, found = self._chunk(int(chunk_of[lo]))
            offsets = ids[lo:hi] & (_CHUNK - 1)
            vals[offsets] = values[lo:hi]
            found[offsets] = True

    def read(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        out = np.zeros((len(ids), self.spec.width), self.spec.dtype)  # (n, width)
        found = np.zeros(len(ids), bool)
        chunk_of = ids >> _CHUNK_BITS
        for index in np.unique(chunk_of).tolist():
            chunk = self.chunks.get(index)
            if chunk is not None:
                at = np.flatnonzero(chunk_of == index)
                offsets = ids[at] & (_CHUNK - 1)
                out[at] = chunk[0][offsets]
                found[at] = chunk[1][offsets]
        out[~found] = 0
        return out, found

    def stored_ids(self) -> np.ndarray:
        parts = [(i << _CHUNK_BITS) + np.flatnonzero(f) for i, (_, f) in sorted(self.chunks.items())]
        return np.concatenate(parts).astype(np.int64) if parts else np.zeros(0, np.int64)


class _State:
    def __init__(self, shards: int) -> None:
        self.lock = threading.RLock()
        self.shards = shards
        self.tables: dict[str, _Table] = {}
        self.blobs: dict[str, bytes] = {}
        self.kv: dict[bytes, bytes] = {}
        self.manifest = Manifest()
        self.changes: dict[int, dict[str, np.ndarray]] = {}  # the change log (.changes), by commit


_shared: "weakref.WeakValueDictionary[str, _State]" = weakref.WeakValueDictionary()
_shared_lock = threading.Lock()


class MemoryStore(Store):
    backend = "memory"

    def __init__(self, path: str | None, cfg: StoreConfig, readonly: bool = False, reset: bool = False) -> None:
        self.path = None if path is None else os.path.abspath(path)
        self.readonly = readonly
        self.discarded: str | None = None
        self._cfg = cfg
        self._state: _State | None = self._attach(cfg.shards, reset)
        self.shards = self._state.shards

    def _attach(self, shards: int, reset: bool) -> _State:
        """The state shared under ``self.path``; ``reset``: a new one replaces it (stores
        still open on the old one keep it)."""
        with _shared_lock:
            state = None if self.path is None else _shared.get(self.path)
            if state is not None and reset:
                m = state.manifest
                self.discarded = f"step {m.step}, {m.commits} commits, offsets {m.offsets} (in memory)"
                state = None
            if state is None:
                if self.readonly:
                    raise NotAStoreError(f"no in-memory store is open at {self.path} in this process")
                state = _State(shards)
                if self.path is not None:
                    _shared[self.path] = state
            return state

    @property
    def _s(self) -> _State:
        if self._state is None:
            raise StateError(f"store {self.path} is closed")
        return self._state

    # -- writing ----------------------------------------------------------------------
    def declare_tables(self, specs: Sequence[TableSpec]) -> None:
        s = self._s
        with s.lock:
            stored = {name: t.spec for name, t in s.tables.items()}
            new = check_specs(list(specs), stored, s.shards)
            if new:
                self._check_writable()
            for spec in new:
                s.tables[spec.name] = _Table(spec)
            if new:
                tables = {**s.manifest.tables, **{spec.name: spec for spec in new}}
                s.manifest = replace(s.manifest, tables=tables)

    def commit(self, ckpt: Checkpoint) -> None:
        """1. validate (nothing touched on error); 2. under the lock: check the step, apply
        rows, blobs, kv and the new manifest together."""
        self._check_writable()
        s = self._s
        with s.lock:
            prep = prepare_checkpoint(ckpt, {name: t.spec for name, t in s.tables.items()})
            manifest = next_manifest(s.manifest, prep, time.time())
            self._apply(s, prep)
            s.manifest = manifest
            s.changes[manifest.commits] = {table: update.ids.copy() for table, update in prep.rows.items()}
            s.changes.pop(manifest.commits - CHANGE_LOG, None)

    @staticmethod
    def _apply(s: _State, prep: Prepared) -> None:
        for table, update in prep.rows.items():
            s.tables[table].write(update.ids, update.values)
        for name, value in prep.blobs.items():
            if value is None:
                s.blobs.pop(name, None)
            else:
                s.blobs[name] = value
        for key, value in prep.kv.items():
            if value is None:
                s.kv.pop(key, None)
            else:
                s.kv[key] = value

    # -- reading ----------------------------------------------------------------------
    @contextmanager
    def snapshot(self) -> Iterator["MemoryStore"]:
        with self._s.lock:
            yield self

    def _table(self, table: str) -> _Table:
        t = self._s.tables.get(table)
        if t is None:
            raise StateError(f"unknown table {table!r}; stored tables: {sorted(self._s.tables)}")
        return t

    def manifest(self) -> Manifest:
        with self._s.lock:
            return self._s.manifest

    def changed_rows(self, since: int, until: int) -> dict[str, np.ndarray] | None:
        commits = logged(since, until)
        if commits is None:
            return None
        with self._s.lock:
            records = [self._s.changes.get(commit) for commit in commits]
        return None if any(r is None for r in records) else union(records)

    def read_rows(self, table: str, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        with self._s.lock:
            t = self._table(table)
            return t.read(check_ids(t.spec, ids))

    def iter_rows(self, table: str, batch: int = 65536) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        if batch <= 0:
            raise StateError(f"iter_rows batch must be > 0, got {batch}")
        with self._s.lock:
            t = self._table(table)
            ids = t.stored_ids()
        shard = shard_of(ids, self.shards)
        ids = ids[np.argsort(shard, kind="stable")]  # shard by shard, ascending within
        shard = np.sort(shard, kind="stable")
        lo = 0
        while lo < len(ids):
            # A batch never straddles shards, as in the LMDB backend.
            hi = min(lo + batch, int(np.searchsorted(shard, shard[lo], side="right")))
            with self._s.lock:
                values, found = t.read(ids[lo:hi])
            yield ids[lo:hi][found], values[found]
            lo = hi

    def read_blob(self, name: str) -> bytes | None:
        with self._s.lock:
            return self._s.blobs.get(name)

    def read_kv(self, namespace: str, key: bytes) -> bytes | None:
        with self._s.lock:
            return self._s.kv.get(kv_key(namespace, key))

    def iter_kv(self, namespace: str) -> Iterator[tuple[bytes, bytes]]:
        prefix = kv_key(namespace, b"")
        with self._s.lock:
            items = sorted((k, v) for k, v in self._s.kv.items() if k.startswith(prefix))
        for key, value in items:
            yield key[len(prefix):], value

    # -- operations ---------------------------------------------------------------------
    def stats(self) -> dict:
        s = self._s
        with s.lock:
            tables = {name: _table_stats(t, s.shards) for name, t in s.tables.items()}
            blobs = {name: len(v) for name, v in s.blobs.items()}
            kv: dict[str, int] = {}
            for key in s.kv:
                namespace = key.split(b"\x00", 1)[0].decode()
                kv[namespace] = kv.get(namespace, 0) + 1
        return {"backend": self.backend, "path": self.path, "shards": s.shards,
                "tables": tables, "blobs": blobs, "kv": kv}

    def verify(self, batch: int = 65536, words: Sequence[str] = ()) -> VerifyReport:
        """Nothing here is on disk to be damaged: checks only that float rows are finite
        (not in the ``words`` tables)."""
        report = VerifyReport(self.path, SCHEMA_VERSION, "memory")
        for name, t in sorted(self._s.tables.items()):
            for ids, values in self.iter_rows(name, batch):
                if values.dtype.kind == "f" and name not in words:
                    report.add(f"table {name}", "rows hold NaN or infinite values", ids[~np.isfinite(values).all(axis=1)])
                report.count("rows", len(ids))
        return report

    def compact(self, dest_path: str) -> None:
        """Write this state, manifest included, to a new LMDB directory."""
        from .lmdb_dir import empty_dest
        from .lmdb_store import LmdbStore

        empty_dest(dest_path)
        with self.snapshot():
            manifest = self.manifest()
            ckpt = Checkpoint(
                step=manifest.step, offsets=manifest.offsets,
                records_applied=manifest.records_applied,
                rows={name: self._all_rows(name) for name in self._s.tables},
                blobs=dict(self._s.blobs), kv=_split_kv(self._s.kv),
                config=manifest.config, metrics=manifest.metrics,
            )
        cfg = replace(self._cfg, shards=self.shards)
        with LmdbStore(dest_path, cfg) as out:
            out.declare_tables(list(manifest.tables.values()))
            out.commit(ckpt)
            out.restore_manifest(manifest)  # keep commits and committed_at as they were

    def _all_rows(self, table: str) -> tuple[np.ndarray, np.ndarray]:
        t = self._table(table)
        ids = t.stored_ids()
        return ids, t.read(ids)[0]

    def close(self) -> None:
        self._state = None


def _table_stats(t: _Table, shards: int) -> dict:
    ids = t.stored_ids()
    rows = np.bincount(shard_of(ids, shards), minlength=shards).tolist()
    return {
        "rows": t.spec.rows, "width": t.spec.width, "dtype": t.spec.dtype, "stored": len(ids),
        "shard_rows": rows, "shard_bytes": [n * (t.spec.row_bytes + 8) for n in rows],
    }


def _split_kv(kv: dict[bytes, bytes]) -> dict[str, dict[bytes, bytes | None]]:
    out: dict[str, dict[bytes, bytes | None]] = {}
    for full, value in kv.items():
        namespace, key = full.split(b"\x00", 1)
        out.setdefault(namespace.decode(), {})[key] = value
    return out
