"""The store interface: one contract, two backends (LMDB and in-memory).

A store holds the whole model state: row tables (embedding, importance and their row-wise
optimizer state) split into S shards by :func:`~streamlearn.state.schema.shard_of`, blobs
(dense weights, dense optimizer, label table: whole objects rewritten when they change),
key-value namespaces (per-key histories, candidates) and a manifest (step, offsets and
records applied per partition, config, metrics, schema version).

Writers call :meth:`Store.commit` with a :class:`Checkpoint` holding only what changed:
the cost of a commit grows with the rows it carries, not with table size. Readers see one
complete checkpoint per read call, or per ``with store.snapshot():`` block.
"""
from __future__ import annotations

import abc
from contextlib import AbstractContextManager
from typing import Iterator, Sequence

import numpy as np

from .exceptions import StateError
from .schema import Checkpoint, Manifest, TableSpec
from .verify import VerifyReport


class Store(abc.ABC):
    """Model state store. Use :func:`~streamlearn.state.open_store` to get one."""

    backend: str = ""
    path: str | None = None
    readonly: bool = False
    shards: int = 1
    discarded: str | None = None  # opened with reset=True: what the reset moved aside

    # -- writing ---------------------------------------------------------------------
    @abc.abstractmethod
    def declare_tables(self, specs: Sequence[TableSpec]) -> None:
        """Make the tables known (idempotent). A spec differing from the stored one raises
        :class:`StateError`; so does declaring a new table on a read-only store."""

    @abc.abstractmethod
    def commit(self, ckpt: Checkpoint) -> None:
        """Write the checkpoint atomically: all of it, with its offsets, or nothing."""

    # -- reading (each call sees one complete checkpoint) ----------------------------
    @abc.abstractmethod
    def manifest(self) -> Manifest:
        """The manifest of the last complete commit (step 0, commits 0 if none)."""

    @abc.abstractmethod
    def read_rows(self, table: str, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Rows by id: ``(values (n, width), found (n,) bool)``. Rows never written read
        as zeros with ``found=False`` (the learner keeps its own init for them)."""

    @abc.abstractmethod
    def iter_rows(self, table: str, batch: int = 65536) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """Every stored row as ``(ids (b,) int64, values (b, width))`` batches, shard by
        shard, ids ascending within a shard. Each batch is one consistent read; wrap the
        loop in ``with store.snapshot():`` for one view across batches."""

    @abc.abstractmethod
    def changed_rows(self, since: int, until: int) -> dict[str, np.ndarray] | None:
        """The ids of the rows that commits number ``since + 1`` to ``until`` wrote, per
        table (sorted, unique; a table none of them wrote is absent), or None where the
        store no longer knows (a commit more than :data:`~.changes.CHANGE_LOG` back, one
        written before the log existed). Read ``until`` from :meth:`manifest` in the same
        ``snapshot()``: a reader holding commit ``since`` then reads only these rows."""

    @abc.abstractmethod
    def read_blob(self, name: str) -> bytes | None:
        """A blob's bytes, or None if never written (or deleted)."""

    @abc.abstractmethod
    def read_kv(self, namespace: str, key: bytes) -> bytes | None:
        """One key's value in a namespace, or None."""

    @abc.abstractmethod
    def iter_kv(self, namespace: str) -> Iterator[tuple[bytes, bytes]]:
        """Every ``(key, value)`` of a namespace, keys in byte order."""

    @abc.abstractmethod
    def snapshot(self) -> AbstractContextManager["Store"]:
        """``with store.snapshot():`` makes every read in the block (this thread) see the
        same checkpoint. Keep blocks short: an open LMDB snapshot pins old pages."""

    # -- operations -------------------------------------------------------------------
    @abc.abstractmethod
    def compact(self, dest_path: str) -> None:
        """Write a compacted copy of the current state to a new LMDB directory."""

    @abc.abstractmethod
    def verify(self, batch: int = 65536, words: Sequence[str] = ()) -> VerifyReport:
        """Scan every stored value and report what is damaged (``report.ok``,
        ``report.lines()``): checksums, keys, lengths, non-finite floats (except in the
        ``words`` tables, whose floats hold bits). Reads that meet a damaged value raise
        :class:`DamagedStoreError` instead."""

    @abc.abstractmethod
    def stats(self) -> dict:
        """Sizes and row counts: ``{"tables": {name: {"stored", "shard_rows",
        "shard_bytes", ...}}, "blobs": {name: bytes}, "kv": {namespace: keys}, ...}``."""

    @abc.abstractmethod
    def close(self) -> None:
        """Release the store (idempotent)."""

    def file_change(self) -> str | None:
        """How the store's files changed since it opened them: ``"deleted"``, ``"replaced"``
        (another data file at its path: a reset, a restore), or None (the same files, or a
        store without files)."""
        return None

    # -- shared helpers -----------------------------------------------------------------
    def tables(self) -> dict[str, TableSpec]:
        return self.manifest().tables

    def load_table(self, table: str, out: np.ndarray, batch: int = 65536) -> int:
        """Copy every stored row of ``table`` into ``out`` (rows, width) in place, from one
        snapshot; rows never stored keep what ``out`` held. Returns the number of rows."""
        count = 0
        with self.snapshot():
            for ids, values in self.iter_rows(table, batch):
                out[ids] = values
                count += len(ids)
        return count

    def _check_writable(self) -> None:
        if self.readonly:
            raise StateError(f"store {self.path} is open read-only; open it with readonly=False to write")

    def __enter__(self) -> "Store":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        mode = "ro" if self.readonly else "rw"
        return f"<{type(self).__name__} {self.path!s} {mode} shards={self.shards}>"
