"""The LMDB backend: one environment per state directory, one named database per
(table, shard), plus ``meta`` (format, schema, shards, tables, manifest), ``blobs`` and ``kv``.

Why named databases in one environment and not one environment per shard: LMDB's unit of
atomicity and of snapshot isolation is the environment. With one environment, a
checkpoint's rows in every shard, its blobs, kv entries and its manifest (offsets) go into
one write transaction, and a reader's one read transaction sees all shards at the same
checkpoint. With an environment per shard, neither holds without a protocol of our own on
top (LMDB keeps only the last two meta pages, so a reader could not even pick matching
versions of different shards). Shards still bound each B-tree, give per-shard row counts
for free, and are the unit a distributed worker can own.

Commit protocol (:meth:`LmdbStore.commit`):

1. Validate the whole checkpoint (tables declared, ids in range, shapes, dtypes, names,
   JSON-able config): a bad checkpoint raises here, before anything is written.
2. Encode: repeated ids keep their last value; each id goes to ``shard_of(id, S)``; rows are
   sorted by (shard, id); keys are 8-byte big-endian ids, values raw little-endian bytes.
3. Begin ONE LMDB write transaction. Readers keep seeing the previous checkpoint.
4. Read the previous manifest inside this transaction; refuse a step that goes backwards;
   merge offsets and records applied per partition.
5. Write the rows with ``cursor.putmulti``, one (table, shard) database at a time; put or
   delete blobs and kv entries.
6. Put the new manifest (step, offsets, records applied, config, metrics, commits,
   committed_at) in the same transaction.
7. Commit. LMDB writes the changed pages copy-on-write (never over pages the last
   checkpoint uses), flushes them (``store.sync``), then writes and flushes the meta page
   that points at the new tree. That one page write is the switch: killed before it, the
   directory reopens at the previous checkpoint with the previous offsets; after it, at
   this one. Nothing in between is ever visible.
8. If the map filled during 5-6, LMDB aborted the transaction (nothing written): with
   ``store.grow_map`` the map doubles and 3-7 run again, else :class:`MapFullError` names
   ``store.map_size_gb``.
9. The caller commits the same offsets to Kafka afterwards. That commit is advisory: on
   restart the offsets in the manifest win.

``store.sync=False`` skips the flushes of step 7: a killed process loses nothing (its
writes are in the OS page cache), but an OS crash or power loss can lose the last commits
and, depending on the filesystem, damage the file.
"""
from __future__ import annotations

import json
import logging
import operator
import os
import threading
import time
from contextlib import contextmanager
from itertools import islice
from typing import Any, Callable, Iterator, Sequence

import lmdb
import numpy as np

from ..config import StoreConfig
from .base import Store
from .exceptions import MapFullError, NotAStoreError, StateError
from .lmdb_env import (
    SharedEnv, acquire, check_state_dir, empty_dest, release, take_writer_lock, wrap_lmdb, wrap_os,
)
from .prepare import Prepared, check_ids, check_specs, next_manifest, prepare_checkpoint
from .schema import (
    SCHEMA_VERSION, SHARD_FN, Checkpoint, Manifest, TableSpec, decode_ids, encode_ids,
    kv_key, manifest_record, row_db_name, shard_of, specs_from_json, specs_to_json,
)

log = logging.getLogger(__name__)

FORMAT = b"streamlearn-state"
_META, _BLOBS, _KV = b"meta", b"blobs", b"kv"
_GROW_ATTEMPTS = 12
_PAGE = 4096


class LmdbStore(Store):
    """A state directory on disk. Open with ``open_store(path, cfg, readonly=...)``."""

    backend = "lmdb"

    def __init__(self, path: str, cfg: StoreConfig, readonly: bool = False) -> None:
        self.path = os.path.abspath(path)
        self.readonly = readonly
        self._cfg = cfg
        self._local = threading.local()
        self._tables: dict[str, TableSpec] = {}
        self._tables_raw = b""  # the stored table list self._tables was parsed from
        self._manifest_memo: tuple[tuple[bytes, ...], Manifest] | None = None  # stored records, their parse
        self._lock_fd: int | None = None
        self._shared: SharedEnv | None = None
        if readonly:
            check_state_dir(self.path)
        else:
            self._lock_fd = take_writer_lock(self.path)
        try:
            map_size = _round_pages(int(cfg.map_size_gb * 2**30))
            self._shared = acquire(self.path, readonly, map_size, cfg.sync)
            if readonly:
                for name in (_META, _BLOBS, _KV):  # handles open before any txn that uses them
                    self._shared.db(name)
            self.shards = self._check_meta() if readonly else self._init_meta()
            self._tables = self._load_tables()
        except BaseException:
            self.close()
            raise

    # -- opening ----------------------------------------------------------------------
    def _init_meta(self) -> int:
        """Create meta/blobs/kv in a new directory, or check an existing one's format."""
        env = self._env

        def work(txn: lmdb.Transaction) -> dict[bytes, Any]:
            foreign = txn.get(_META) is None and txn.cursor().first()  # main db: named dbs only
            if foreign:
                raise NotAStoreError(f"{self.path} holds an LMDB environment that is not a streamlearn state")
            handles = {name: env.open_db(name, txn=txn, create=True) for name in (_META, _BLOBS, _KV)}
            meta = handles[_META]
            if txn.get(b"format", db=meta) is None:
                _write_new_meta(txn, meta, self._cfg.shards)
            return handles

        with self._shared.db_lock:
            handles = self._write(work, need=0, what="initialise")
            self._shared.dbs.update(handles)
        shards = self._check_meta()
        if shards != self._cfg.shards:
            raise StateError(
                f"{self.path} was created with store.shards={shards}; set store.shards={shards} "
                "to use it (or compact it into a new directory)"
            )
        return shards

    def _check_meta(self) -> int:
        meta = self._shared.db(_META)
        with self._read_txn() as txn:
            fmt = txn.get(b"format", None, meta)
            if fmt is None or bytes(fmt) != FORMAT:
                raise NotAStoreError(f"{self.path} is not a streamlearn state directory")
            version = int(bytes(txn.get(b"schema_version", None, meta)))
            shard_fn = bytes(txn.get(b"shard_fn", None, meta)).decode()
            shards = int(bytes(txn.get(b"shards", None, meta)))
        if version != SCHEMA_VERSION:
            raise StateError(
                f"{self.path} has state schema version {version}; this streamlearn reads "
                f"version {SCHEMA_VERSION}: use the streamlearn version that wrote it"
            )
        if shard_fn != SHARD_FN:
            raise StateError(f"{self.path} shards rows with {shard_fn!r}; this streamlearn uses {SHARD_FN!r}")
        return shards

    def _load_tables(self) -> dict[str, TableSpec]:
        meta = self._shared.db(_META)
        with self._read_txn() as txn:
            raw = bytes(txn.get(b"tables", None, meta))
        return self._adopt_tables(raw)

    def _adopt_tables(self, raw: bytes) -> dict[str, TableSpec]:
        """Parse the stored table list and open every shard's handle. Handles must be open
        before the transaction that uses them begins (LMDB), hence never inside one."""
        if raw == self._tables_raw:
            return self._tables
        tables = specs_from_json(json.loads(raw))
        for name in tables:
            for shard in range(self.shards):
                self._shared.db(row_db_name(name, shard))
        self._tables_raw = raw
        return tables

    @property
    def _env(self) -> lmdb.Environment:
        if self._shared is None:
            raise StateError(f"store {self.path} is closed")
        self._shared.check_pid()
        return self._shared.env

    # -- writing ----------------------------------------------------------------------
    def declare_tables(self, specs: Sequence[TableSpec]) -> None:
        if self._local_txn() is None:
            self._tables = self._load_tables()
        new = check_specs(list(specs), self._tables, self.shards)
        if not new:
            return
        self._check_writable()
        env = self._env

        def work(txn: lmdb.Transaction) -> dict[bytes, Any]:
            meta = self._shared.db(_META)
            stored = specs_from_json(json.loads(bytes(txn.get(b"tables", db=meta))))
            stored.update({spec.name: spec for spec in new})
            txn.put(b"tables", json.dumps(specs_to_json(stored), sort_keys=True).encode(), db=meta)
            return {
                row_db_name(spec.name, s): env.open_db(row_db_name(spec.name, s), txn=txn, create=True)
                for spec in new for s in range(self.shards)
            }

        with self._shared.db_lock:
            handles = self._write(work, need=0, what="declare tables in")
            self._shared.dbs.update(handles)
        self._tables.update({spec.name: spec for spec in new})

    def commit(self, ckpt: Checkpoint) -> None:
        """Atomic checkpoint; the numbered steps are in this module's docstring."""
        self._check_writable()
        prep = prepare_checkpoint(ckpt, self._tables)  # 1. validate
        batches = self._encode_rows(prep)  # 2. encode, shard, sort

        def work(txn: lmdb.Transaction) -> None:  # 3. one write transaction (in _write)
            meta = self._shared.db(_META)
            prev = _parse_manifest(_manifest_records(txn, meta), self._tables)  # 4. previous manifest, step check
            manifest = next_manifest(prev, prep, time.time())
            for db, keys, values in batches:  # 5. rows, blobs, kv
                with txn.cursor(db=db) as cur:
                    cur.putmulti(zip(keys, values))
            _put_blobs_kv(txn, self._shared.db(_BLOBS), self._shared.db(_KV), prep)
            record = json.dumps(manifest_record(manifest), sort_keys=True)  # 6. manifest
            txn.put(b"manifest", record.encode(), db=meta)

        self._write(work, need=prep.nbytes, what="commit to")  # 7. commit; 8. grow + retry
        # 9. (caller) commit the same offsets to Kafka: advisory.

    def _restore_manifest(self, manifest: Manifest) -> None:
        """Overwrite the manifest record as given (a copy keeps its source's history)."""
        record = json.dumps(manifest_record(manifest), sort_keys=True).encode()
        self._write(lambda txn: txn.put(b"manifest", record, db=self._shared.db(_META)), 0, "restore")

    def _encode_rows(self, prep: Prepared) -> list[tuple[Any, list[bytes], list[bytes]]]:
        """Per (table, shard): the database handle, its keys (sorted) and values as bytes."""
        batches = []
        for table, update in prep.rows.items():
            shard = shard_of(update.ids, self.shards)
            order = np.argsort(shard, kind="stable")  # ids are sorted: (shard, id) order
            bounds = np.searchsorted(shard[order], np.arange(self.shards + 1)).tolist()
            keys = encode_ids(update.ids).tolist()
            # Each row as one fixed-size void: .tolist() makes one bytes object per row in C.
            # Shards then pick references from these lists: no second copy of the values.
            values = update.values.view(f"V{self._tables[table].row_bytes}").ravel().tolist()
            for s in range(self.shards):
                idx = order[bounds[s]:bounds[s + 1]].tolist()
                if idx:
                    db = self._shared.db(row_db_name(table, s))
                    batches.append((db, _pick(keys, idx), _pick(values, idx)))
        return batches

    def _write(self, work: Callable[[lmdb.Transaction], Any], need: int, what: str) -> Any:
        """Run ``work`` in one write transaction; on a full map grow it and rerun (step 8)."""
        env = self._env
        for attempt in range(_GROW_ATTEMPTS):
            try:
                with env.begin(write=True) as txn:
                    result = work(txn)
                return result
            except lmdb.MapFullError as exc:
                self._grow_map(exc, need, attempt)
            except lmdb.Error as exc:
                raise wrap_lmdb(exc, self.path, what, need) from exc
            except OSError as exc:
                raise wrap_os(exc, self.path, what) from exc
        raise MapFullError(f"the map of {self.path} kept filling after {_GROW_ATTEMPTS} doublings")

    def _grow_map(self, exc: lmdb.MapFullError, need: int, attempt: int) -> None:
        size = self._env.info()["map_size"]
        if not self._cfg.grow_map:
            raise MapFullError(
                f"LMDB map full at {self.path} ({size / 2**30:.3g} GiB): raise "
                f"store.map_size_gb (now {self._cfg.map_size_gb}) or set store.grow_map=true"
            ) from exc
        new = _round_pages(max(2 * size, size + 4 * need))
        log.info("LMDB map of %s full at %.3g GiB: growing to %.3g GiB", self.path, size / 2**30, new / 2**30)
        self._shared.set_map_size(new)

    # -- reading ----------------------------------------------------------------------
    def _local_txn(self) -> lmdb.Transaction | None:
        return getattr(self._local, "txn", None)

    @contextmanager
    def _read_txn(self) -> Iterator[lmdb.Transaction]:
        txn = self._local_txn()
        if txn is not None:
            yield txn
            return
        if self._shared is None:
            raise StateError(f"store {self.path} is closed")
        with self._shared.read_txn() as txn:
            yield txn

    @contextmanager
    def snapshot(self) -> Iterator["LmdbStore"]:
        if self._local_txn() is not None:
            yield self
            return
        meta = self._shared.db(_META)
        while True:
            with self._read_txn() as txn:
                raw = bytes(txn.get(b"tables", None, meta))
                if raw == self._tables_raw:  # every table of this snapshot has its handles
                    self._local.txn = txn
                    try:
                        yield self
                    finally:
                        self._local.txn = None
                    return
            self._tables = self._adopt_tables(raw)  # tables declared since: open, begin again

    def _spec(self, table: str) -> TableSpec:
        spec = self._tables.get(table)
        if spec is None and self._local_txn() is None:
            self._tables = self._load_tables()
            spec = self._tables.get(table)
        if spec is None:
            raise StateError(f"unknown table {table!r} in {self.path}; stored tables: {sorted(self._tables)}")
        return spec

    def manifest(self) -> Manifest:
        """The last commit's manifest. A reader polls it on every query (has a new
        checkpoint landed?), so the parse is kept for as long as the stored records are
        the same: comparing them costs microseconds, parsing the JSON a tenth of a
        millisecond. The result is shared between calls; treat it as read-only, like any
        Manifest."""
        with self._read_txn() as txn:
            records = _manifest_records(txn, self._shared.db(_META))
        memo = self._manifest_memo
        if memo is None or memo[0] != records:
            memo = self._manifest_memo = (records, _parse_manifest(records))
        return memo[1]

    def read_rows(self, table: str, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        spec = self._spec(table)
        arr = check_ids(spec, ids)
        keys = encode_ids(arr).tolist()
        dbs = [self._shared.db(row_db_name(table, s)) for s in range(self.shards)]
        shard_dbs = [dbs[s] for s in shard_of(arr, self.shards).tolist()]
        with self._read_txn() as txn:
            get = txn.get
            views = [get(k, None, db) for k, db in zip(keys, shard_dbs)]
            missing = views.count(None)
            if missing:
                found = np.fromiter((v is not None for v in views), bool, len(views))
                views = [v for v in views if v is not None]
            # One copy, straight from the map into the result buffer, before the txn ends.
            buf = bytearray().join(views)
        values = np.frombuffer(buf, dtype=spec.dtype).reshape(-1, spec.width)  # (n_found, width)
        if not missing:
            return values, np.ones(len(arr), dtype=bool)
        out = np.zeros((len(arr), spec.width), dtype=spec.dtype)  # (n, width)
        out[found] = values
        return out, found

    def iter_rows(self, table: str, batch: int = 65536) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        spec = self._spec(table)
        if batch <= 0:
            raise StateError(f"iter_rows batch must be > 0, got {batch}")
        for shard in range(self.shards):
            db = self._shared.db(row_db_name(table, shard))
            start: bytes | None = b""
            while start is not None:
                with self._read_txn() as txn:
                    pairs, start = _scan(txn, db, start, batch)
                    keys = b"".join(k for k, _ in pairs)
                    buf = bytearray().join(v for _, v in pairs)
                if pairs:
                    yield decode_ids(keys), np.frombuffer(buf, dtype=spec.dtype).reshape(-1, spec.width)

    def read_blob(self, name: str) -> bytes | None:
        with self._read_txn() as txn:
            value = txn.get(name.encode(), None, self._shared.db(_BLOBS))
            return None if value is None else bytes(value)

    def read_kv(self, namespace: str, key: bytes) -> bytes | None:
        with self._read_txn() as txn:
            value = txn.get(kv_key(namespace, key), None, self._shared.db(_KV))
            return None if value is None else bytes(value)

    def iter_kv(self, namespace: str, batch: int = 4096) -> Iterator[tuple[bytes, bytes]]:
        prefix = kv_key(namespace, b"")
        db = self._shared.db(_KV)
        start: bytes | None = prefix
        while start is not None:
            with self._read_txn() as txn:
                pairs, start = _scan(txn, db, start, batch, prefix)
                items = [(bytes(k)[len(prefix):], bytes(v)) for k, v in pairs]
            yield from items

    # -- operations ---------------------------------------------------------------------
    def stats(self) -> dict:
        """The contract's sizes and counts, plus LMDB's: ``map_size``, ``used_bytes``,
        ``file_bytes`` and ``sync`` (whether a commit flushes to disk, from ``store.sync``;
        False: a machine crash can lose the last commits, a killed process loses nothing)."""
        env = self._env
        with self._read_txn() as txn:
            info, stat = env.info(), env.stat()
            tables = {name: self._table_stats(txn, spec, stat["psize"]) for name, spec in self._tables.items()}
            blobs = {bytes(k).decode(): len(v) for k, v in txn.cursor(db=self._shared.db(_BLOBS))}
            kv = _kv_counts(txn, self._shared.db(_KV))
        return {
            "backend": self.backend, "path": self.path, "shards": self.shards,
            "map_size": info["map_size"], "used_bytes": (info["last_pgno"] + 1) * stat["psize"],
            "file_bytes": os.path.getsize(os.path.join(self.path, "data.mdb")),
            "sync": bool(env.flags()["sync"]), "tables": tables, "blobs": blobs, "kv": kv,
        }

    def _table_stats(self, txn: lmdb.Transaction, spec: TableSpec, psize: int) -> dict:
        rows, sizes = [], []
        for s in range(self.shards):
            st = txn.stat(self._shared.db(row_db_name(spec.name, s)))
            rows.append(st["entries"])
            sizes.append((st["branch_pages"] + st["leaf_pages"] + st["overflow_pages"]) * psize)
        return {
            "rows": spec.rows, "width": spec.width, "dtype": spec.dtype, "stored": sum(rows),
            "shard_rows": rows, "shard_bytes": sizes,
        }

    def compact(self, dest_path: str) -> None:
        dest = empty_dest(dest_path)
        env = self._env
        try:
            with self._shared.gate.shared():
                env.copy(dest, compact=True)
        except lmdb.Error as exc:
            raise wrap_lmdb(exc, dest, "write a compacted copy to") from exc
        except OSError as exc:
            raise wrap_os(exc, dest, "write a compacted copy to") from exc

    def close(self) -> None:
        if self._shared is not None:
            release(self._shared)
            self._shared = None
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # closing the descriptor drops the flock
            self._lock_fd = None


# -- helpers (module level: no store state) -----------------------------------------------
def _write_new_meta(txn: lmdb.Transaction, meta: Any, shards: int) -> None:
    empty = json.dumps(manifest_record(Manifest()), sort_keys=True)
    for key, value in (
        (b"format", FORMAT), (b"schema_version", str(SCHEMA_VERSION).encode()),
        (b"shards", str(shards).encode()), (b"shard_fn", SHARD_FN.encode()),
        (b"tables", b"{}"), (b"manifest", empty.encode()),
    ):
        txn.put(key, value, db=meta)


def _manifest_records(txn: lmdb.Transaction, meta: Any) -> tuple[bytes, ...]:
    """The stored records a Manifest is parsed from: manifest, table list, schema version."""
    return tuple(bytes(txn.get(key, None, meta)) for key in (b"manifest", b"tables", b"schema_version"))


def _parse_manifest(records: tuple[bytes, ...], tables: dict[str, TableSpec] | None = None) -> Manifest:
    """``tables``: the already parsed table list, or None to parse the stored one."""
    manifest, table_list, version = records
    if tables is None:
        tables = specs_from_json(json.loads(table_list))
    return Manifest(tables=dict(tables), schema_version=int(version), **json.loads(manifest))


def _put_blobs_kv(txn: lmdb.Transaction, blobs_db: Any, kv_db: Any, prep: Prepared) -> None:
    for name, value in prep.blobs.items():
        if value is None:
            txn.delete(name.encode(), db=blobs_db)
        else:
            txn.put(name.encode(), value, db=blobs_db)
    for key, value in prep.kv.items():
        if value is None:
            txn.delete(key, db=kv_db)
        else:
            txn.put(key, value, db=kv_db)


def _pick(seq: list, idx: list[int]) -> Sequence:
    return [seq[idx[0]]] if len(idx) == 1 else operator.itemgetter(*idx)(seq)


def _scan(
    txn: lmdb.Transaction, db: Any, start: bytes, batch: int, prefix: bytes = b""
) -> tuple[list[tuple[Any, Any]], bytes | None]:
    """Up to ``batch`` (key, value) pairs from ``start`` on (keys starting with ``prefix``),
    and the key to resume from (None when done)."""
    with txn.cursor(db=db) as cur:
        if not (cur.set_range(start) if start else cur.first()):
            return [], None
        pairs = list(islice(cur.iternext(), batch))
    if prefix:
        kept = [(k, v) for k, v in pairs if bytes(k[: len(prefix)]) == prefix]
        if len(kept) < len(pairs):
            return kept, None
    if len(pairs) < batch:
        return pairs, None
    return pairs, bytes(pairs[-1][0]) + b"\x00"  # the smallest key after the last one


def _kv_counts(txn: lmdb.Transaction, db: Any) -> dict[str, int]:
    counts: dict[str, int] = {}
    with txn.cursor(db=db) as cur:
        for key in cur.iternext(values=False):
            namespace = bytes(key).split(b"\x00", 1)[0].decode()
            counts[namespace] = counts.get(namespace, 0) + 1
    return counts


def _round_pages(size: int) -> int:
    return max(_PAGE, -(-size // _PAGE) * _PAGE)
