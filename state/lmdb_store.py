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
   sorted by (shard, id); keys are 8-byte big-endian ids, values raw little-endian
   bytes followed by their checksum (schema 2, :mod:`.codec`).
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
   ``store.grow_map`` the map grows to max(2 x its size, its size + 4 x the checkpoint's
   bytes) and 3-7 run again, else :class:`MapFullError` names
   ``store.map_size_gb``.
9. The caller commits the same offsets to Kafka afterwards. That commit is advisory: on
   restart the offsets in the manifest win.

``store.sync=False`` skips the flushes of step 7: a killed process loses nothing (its
writes are in the OS page cache), but an OS crash or power loss can lose the last commits
and, depending on the filesystem, damage the file.
"""
from __future__ import annotations

import functools
import json
import logging
import operator
import os
import shutil
import tempfile
import threading
import time
from contextlib import contextmanager
from itertools import islice
from typing import Any, Callable, Iterator, Sequence

import lmdb
import numpy as np

from ..config import StoreConfig
from .base import Store
from .changes import CHANGE_LOG, change_key, decode_changes, encode_changes, logged, union
from .codec import RawCodec
from .exceptions import MapFullError, NotAStoreError, StateError, damaged
from .lmdb_dir import check_state_dir, create, empty_dest, mark, move_aside, needs_creation, take_writer_lock
from .lmdb_env import DAMAGE, SharedEnv, acquire, release, wrap_lmdb, wrap_os
from .lmdb_file import DATA, check_readable, data_file_change, data_file_identity
from .lmdb_meta import (
    BLOBS, KV, META, StoreMeta, get_record, manifest_records, parse_manifest, parse_tables, put_record,
    read_meta,
    write_new,
)
from .prepare import Prepared, check_ids, check_specs, next_manifest, prepare_checkpoint
from .schema import (
    Checkpoint, Manifest, TableSpec, decode_ids, encode_ids, kv_key, manifest_record, row_db_name,
    shard_of, specs_to_json,
)
from .verify import VerifyReport, check_row_batch, check_value

log = logging.getLogger(__name__)

_GROW_ATTEMPTS = 12
_PAGE = 4096


class LmdbStore(Store):
    """A state directory on disk. Open with ``open_store(path, cfg, readonly=..., reset=...)``.

    Opening checks, before LMDB maps anything: that ``data.mdb`` is as long as its meta
    pages say (:func:`~streamlearn.state.check_readable`), then that every meta record is
    there and parses. A writer creates a state only in an empty or absent directory
    (:mod:`.lmdb_dir`), or after ``reset=True`` moved the old one aside.
    """

    backend = "lmdb"

    def __init__(self, path: str, cfg: StoreConfig, readonly: bool = False, reset: bool = False) -> None:
        self.path = os.path.abspath(path)
        self.readonly = readonly
        self.discarded: str | None = None  # reset=True: what was moved aside, and where
        self._cfg = cfg
        self._local = threading.local()
        self._tables: dict[str, TableSpec] = {}
        self._tables_raw: bytes | None = None  # the stored table list self._tables was parsed from
        self._manifest_memo: tuple[tuple[bytes | None, ...], Manifest] | None = None  # stored records, their parse
        self._lock_fd: int | None = None
        self._shared: SharedEnv | None = None
        self._meta: StoreMeta | None = None
        self._file_id: tuple[int, int] | None = None  # (device, inode) of the data file opened
        if readonly:
            check_state_dir(self.path)
        else:
            self._lock_fd = take_writer_lock(self.path)
        try:
            if not readonly:
                self._prepare_dir(reset)
            check_readable(self.path)
            map_size = _round_pages(int(cfg.map_size_gb * 2**30))
            self._shared = acquire(self.path, readonly, map_size, cfg.sync)
            self._file_id = data_file_identity(self.path)
            self._meta = self._open_meta()
            self.shards = self._meta.shards
            if not readonly:
                self._check_shards()
                mark(self._lock_fd)  # states created before the mark existed get it here
            self._tables = self._load_tables()
        except BaseException:
            self.close()
            raise

    def _check_same_file(self) -> None:
        """The data file is still the one opened: a state directory deleted (or replaced)
        under a writer leaves it writing to an unlinked file, commits that succeed and
        that nobody can open again (was: the worker said "all saved")."""
        if self.file_change() is not None:
            raise StateError(f"the state directory {self.path} was deleted or replaced after this process opened "
                             "it: a commit would go to a file nobody can open again; stop, restore the directory "
                             "(or let the next start create a new state) and start again")

    def file_change(self) -> str | None:
        return data_file_change(self.path, self._file_id)

    # -- opening ----------------------------------------------------------------------
    def _prepare_dir(self, reset: bool) -> None:
        """Writer only, under the writer lock: move an old state aside if asked, and
        create a new one if the directory holds none."""
        with hold_stop_signals():  # a SIGTERM between its two moves left data.mdb aside and lock.mdb behind
            if reset:
                self.discarded = _discard(self.path, self._lock_fd)
        if needs_creation(self.path, self._lock_fd):
            map_size = _round_pages(int(self._cfg.map_size_gb * 2**30))
            create(self.path, self._lock_fd, map_size, lambda env: write_new(env, self._cfg.shards))
            log.info("created a new state in %s", self.path)

    def _open_meta(self) -> StoreMeta:
        """Check the meta records; open the blobs and kv handles (before any transaction
        that uses them: LMDB)."""
        meta_db = self._shared.db(META)  # NotAStoreError: no streamlearn meta at all
        with self._read_txn() as txn:
            meta = read_meta(txn, meta_db, self.path)
        for name in (BLOBS, KV):
            self._db_or_damaged(name)
        return meta

    def _check_shards(self) -> None:
        if self.shards != self._cfg.shards:
            raise StateError(
                f"{self.path} was created with store.shards={self.shards}; set store.shards={self.shards} "
                "to use it (a state keeps its shard count; a compacted copy too)"
            )

    def _db_or_damaged(self, name: bytes) -> Any:
        try:
            return self._shared.db(name)
        except NotAStoreError as exc:
            raise damaged(self.path, f"its database {name.decode()!r} is missing") from exc

    @property
    def _codec(self) -> RawCodec:
        return self._meta.codec

    def _stored_tables(self, txn: lmdb.Transaction) -> bytes:
        raw = txn.get(b"tables", None, self._shared.db(META))
        if raw is None:
            raise damaged(self.path, "meta record 'tables' is missing")
        return bytes(raw)

    def _load_tables(self) -> dict[str, TableSpec]:
        with self._read_txn() as txn:
            raw = self._stored_tables(txn)
        return self._adopt_tables(raw)

    def _adopt_tables(self, raw: bytes) -> dict[str, TableSpec]:
        """Parse the stored table list and open every shard's handle. Handles must be open
        before the transaction that uses them begins (LMDB), hence never inside one."""
        if raw == self._tables_raw:
            return self._tables
        value = self._codec.decode_value(META, b"tables", raw)
        if value is None:
            raise damaged(self.path, "meta record 'tables' fails its checksum")
        tables = parse_tables(value, self.path)
        for name in tables:
            for shard in range(self.shards):
                self._db_or_damaged(row_db_name(name, shard))
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
            meta = self._shared.db(META)
            stored = parse_tables(get_record(txn, meta, self._codec, b"tables", self.path), self.path)
            stored.update({spec.name: spec for spec in new})
            put_record(txn, meta, self._codec, b"tables", json.dumps(specs_to_json(stored), sort_keys=True).encode())
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
        self._check_same_file()
        prep = prepare_checkpoint(ckpt, self._tables)  # 1. validate
        batches = self._encode_rows(prep)  # 2. encode, shard, sort

        def work(txn: lmdb.Transaction) -> None:  # 3. one write transaction (in _write)
            meta = self._shared.db(META)  # 4. previous manifest, step check
            prev = parse_manifest(manifest_records(txn, meta), self._codec, self.path, self._tables)
            manifest = next_manifest(prev, prep, time.time())
            for db, keys, values in batches:  # 5. rows, blobs, kv
                with txn.cursor(db=db) as cur:
                    cur.putmulti(zip(keys, values))
            self._put_blobs_kv(txn, prep)
            record = json.dumps(manifest_record(manifest), sort_keys=True)  # 6. manifest
            put_record(txn, meta, self._codec, b"manifest", record.encode())
            changes = encode_changes({table: update.ids for table, update in prep.rows.items()})
            put_record(txn, meta, self._codec, change_key(manifest.commits), changes)  # the change log
            if manifest.commits > CHANGE_LOG:
                txn.delete(change_key(manifest.commits - CHANGE_LOG), db=meta)

        self._write(work, need=prep.nbytes, what="commit to")  # 7. commit; 8. grow + retry
        # 9. (caller) commit the same offsets to Kafka: advisory.

    def restore_manifest(self, manifest: Manifest) -> None:
        """Overwrite the manifest record as given: a compacted copy keeps its source's
        history (commits, committed_at). For copies only, right after their one commit."""
        record = json.dumps(manifest_record(manifest), sort_keys=True).encode()
        self._write(lambda txn: put_record(txn, self._shared.db(META), self._codec, b"manifest", record), 0, "restore")

    def _put_blobs_kv(self, txn: lmdb.Transaction, prep: Prepared) -> None:
        for db_name, items in ((BLOBS, ((k.encode(), v) for k, v in prep.blobs.items())), (KV, prep.kv.items())):
            db = self._shared.db(db_name)
            for key, value in items:
                if value is None:
                    txn.delete(key, db=db)
                else:
                    txn.put(key, self._codec.encode_value(db_name, key, value), db=db)

    def _encode_rows(self, prep: Prepared) -> list[tuple[Any, list[bytes], list[bytes]]]:
        """Per (table, shard): the database handle, its keys (sorted) and values as bytes."""
        batches = []
        for table, update in prep.rows.items():
            shard = shard_of(update.ids, self.shards)
            order = np.argsort(shard, kind="stable")  # ids are sorted: (shard, id) order
            bounds = np.searchsorted(shard[order], np.arange(self.shards + 1)).tolist()
            keys = encode_ids(update.ids).tolist()
            # One bytes object per row (with its checksum), made once; shards then pick
            # references from these lists: no second copy of the values.
            values = self._codec.encode_rows(table, update.ids, update.values)
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
        raise MapFullError(f"the map of {self.path} kept filling after growing {_GROW_ATTEMPTS} times")

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
        """A read transaction (this thread's snapshot, if one is open). LMDB errors that
        mean damaged pages leave as DamagedStoreError, never as raw lmdb errors."""
        txn = self._local_txn()
        if txn is None and self._shared is None:
            raise StateError(f"store {self.path} is closed")
        try:
            if txn is not None:
                yield txn
                return
            with self._shared.read_txn() as txn:
                yield txn
        except DAMAGE as exc:
            raise wrap_lmdb(exc, self.path, "read") from exc

    @contextmanager
    def snapshot(self) -> Iterator["LmdbStore"]:
        if self._local_txn() is not None:
            yield self
            return
        while True:
            with self._read_txn() as txn:
                raw = self._stored_tables(txn)
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
        the same: comparing them costs microseconds, parsing the JSON (and checking its
        checksum) a tenth of a millisecond. The result is shared between calls; treat it as
        read-only, like any Manifest."""
        with self._read_txn() as txn:
            records = manifest_records(txn, self._shared.db(META))
        memo = self._manifest_memo
        if memo is None or memo[0] != records:
            memo = self._manifest_memo = (records, parse_manifest(records, self._codec, self.path))
        return memo[1]

    def changed_rows(self, since: int, until: int) -> dict[str, np.ndarray] | None:
        commits = logged(since, until)
        if commits is None:
            return None
        keys = [change_key(commit) for commit in commits]
        with self._read_txn() as txn:
            stored = [txn.get(key, None, self._shared.db(META)) for key in keys]
        records = []
        for key, value in zip(keys, stored):
            decoded = None if value is None else self._codec.decode_value(META, key, bytes(value))
            record = None if decoded is None else decode_changes(decoded)
            if record is None:  # gone, or damaged: the reader reads everything, as without a log
                return None
            records.append(record)
        return union(records)

    def read_rows(self, table: str, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Rows by key; every value's checksum is checked (a bad one raises
        DamagedStoreError naming the table and ids)."""
        spec = self._spec(table)
        arr = check_ids(spec, ids)
        keys = encode_ids(arr).tolist()
        dbs = [self._shared.db(row_db_name(table, s)) for s in range(self.shards)]
        shard_dbs = [dbs[s] for s in shard_of(arr, self.shards).tolist()]
        with self._read_txn() as txn:
            get = txn.get
            views = [get(k, None, db) for k, db in zip(keys, shard_dbs)]
        missing = views.count(None)
        if not missing:
            return self._decode_rows(spec, arr, views), np.ones(len(arr), dtype=bool)
        found = np.fromiter((v is not None for v in views), bool, len(views))
        out = np.zeros((len(arr), spec.width), dtype=spec.dtype)  # (n, width)
        out[found] = self._decode_rows(spec, arr[found], [v for v in views if v is not None])
        return out, found

    def _decode_rows(self, spec: TableSpec, ids: np.ndarray, stored: list[bytes]) -> np.ndarray:
        values, bad = self._codec.decode_rows(spec.name, ids, stored, spec.width, spec.dtype)  # (n, width)
        if bad.any():
            shown = ", ".join(str(i) for i in ids[bad][:5].tolist())
            what = "fail their checksum" if self._codec.checksums else "have the wrong length"
            raise damaged(self.path, f"{int(bad.sum()):,} stored rows of table {spec.name!r} {what} "
                          f"(ids {shown}{', ...' if bad.sum() > 5 else ''}); `streamlearn inspect "
                          f"--verify --state {self.path}` lists every damaged value")
        return values

    def iter_rows(self, table: str, batch: int = 65536) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """Every stored row, shard by shard; every value's checksum is checked."""
        spec = self._spec(table)
        if batch <= 0:
            raise StateError(f"iter_rows batch must be > 0, got {batch}")
        for shard in range(self.shards):
            for pairs in self._batches(row_db_name(table, shard), batch):
                ids = decode_ids(b"".join(k for k, _ in pairs))
                yield ids, self._decode_rows(spec, ids, [v for _, v in pairs])

    def _batches(self, db_name: bytes, batch: int, prefix: bytes = b"") -> Iterator[list[tuple[bytes, bytes]]]:
        """A database's ``(key, value)`` pairs as bytes, ``batch`` at a time, each batch
        from its own short read transaction (or this thread's snapshot)."""
        db = self._shared.db(db_name)
        start: bytes | None = prefix
        while start is not None:
            with self._read_txn() as txn:
                pairs, start = _scan(txn, db, start, batch, prefix)
            if pairs:
                yield pairs

    def read_blob(self, name: str) -> bytes | None:
        key = name.encode()
        with self._read_txn() as txn:
            stored = txn.get(key, None, self._shared.db(BLOBS))
        return None if stored is None else self._decode_value(BLOBS, key, stored, f"blob {name!r}")

    def read_kv(self, namespace: str, key: bytes) -> bytes | None:
        full = kv_key(namespace, key)
        with self._read_txn() as txn:
            stored = txn.get(full, None, self._shared.db(KV))
        return None if stored is None else self._decode_value(KV, full, stored, f"kv entry {namespace}/{key[:40]!r}")

    def iter_kv(self, namespace: str, batch: int = 4096) -> Iterator[tuple[bytes, bytes]]:
        prefix = kv_key(namespace, b"")
        for pairs in self._batches(KV, batch, prefix):
            for full, stored in pairs:
                yield full[len(prefix):], self._decode_value(KV, full, stored, f"kv entry {namespace}/{full[len(prefix):][:40]!r}")

    def _decode_value(self, db: bytes, key: bytes, stored: bytes, what: str) -> bytes:
        value = self._codec.decode_value(db, key, stored)
        if value is None:
            raise damaged(self.path, f"{what} fails its checksum")
        return value

    # -- operations ---------------------------------------------------------------------
    def stats(self) -> dict:
        """The contract's sizes and counts, plus LMDB's: ``map_size``, ``used_bytes`` (the
        pages the data holds now), ``file_bytes`` (the file, never shrunk: their difference
        is free pages, which a compacted copy drops) and ``sync`` (whether a commit flushes
        to disk, from ``store.sync``; False: a machine crash can lose the last commits, a
        killed process loses nothing)."""
        env = self._env
        with self._read_txn() as txn:
            info, stat = env.info(), env.stat()
            tables = {name: self._table_stats(txn, spec, stat["psize"]) for name, spec in self._tables.items()}
            overhead = self._codec.overhead
            blobs = {bytes(k).decode(): len(v) - overhead for k, v in txn.cursor(db=self._shared.db(BLOBS))}
            kv = _kv_counts(txn, self._shared.db(KV))
            names = [bytes(name) for name, _ in txn.cursor()]  # the main database lists the named ones
            pages = 2 + _pages(stat) + sum(_pages(txn.stat(self._shared.db(name))) for name in names)  # 2: meta
        return {
            "backend": self.backend, "path": self.path, "shards": self.shards,
            "schema_version": self._meta.schema_version, "encoding": self._codec.name,
            "map_size": info["map_size"], "used_bytes": pages * stat["psize"],
            "file_bytes": os.path.getsize(os.path.join(self.path, DATA)),
            "sync": bool(env.flags()["sync"]), "tables": tables, "blobs": blobs, "kv": kv,
        }

    def _table_stats(self, txn: lmdb.Transaction, spec: TableSpec, psize: int) -> dict:
        rows, sizes = [], []
        for s in range(self.shards):
            st = txn.stat(self._shared.db(row_db_name(spec.name, s)))
            rows.append(st["entries"])
            sizes.append(_pages(st) * psize)
        return {
            "rows": spec.rows, "width": spec.width, "dtype": spec.dtype, "stored": sum(rows),
            "shard_rows": rows, "shard_bytes": sizes,
        }

    def verify(self, batch: int = 65536, skip: Sequence[str] = (),
               progress: Callable[[str], None] | None = None, words: Sequence[str] = ()) -> VerifyReport:
        """Scan every row, blob and kv value (see :mod:`.verify`). Each batch is its own
        short read transaction: a scan of a large state does not pin the writer's pages,
        and every value is checked on its own, so no single snapshot is needed.
        ``skip``: database names not to read; ``progress(name)`` is called before each;
        ``words``: tables whose float32 values are words holding bits (not checked finite).
        LMDB aborts the process on some damaged pages: :func:`.verify.verify_in_child`
        runs this in child processes and reports such a database instead."""
        report = VerifyReport(self.path, self._meta.schema_version, self._codec.name)
        codec = self._codec
        scans: list[tuple[bytes, Callable]] = []
        for name, spec in sorted(self._tables.items()):
            for shard in range(self.shards):
                scans.append((row_db_name(name, shard), functools.partial(
                    check_row_batch, report, codec, spec, shard, self.shards, numbers=name not in words)))
        for db in (BLOBS, KV):
            scans.append((db, functools.partial(_check_values, report, codec, db)))
        for db_name, check in scans:
            if db_name.decode() not in skip:
                if progress is not None:
                    progress(db_name.decode())
                self._verify_db(report, db_name, check, batch)
        return report

    def _verify_db(self, report: VerifyReport, db_name: bytes, check: Callable, batch: int) -> None:
        try:
            for pairs in self._batches(db_name, batch):
                check(pairs)
        except StateError as exc:  # pages LMDB cannot walk: report, go on with the next database
            report.problems.append(f"database {db_name.decode()}: {exc}")

    def compact(self, dest_path: str) -> None:
        """The copy is written in a hidden folder of ``dest`` and its ``data.mdb`` moved
        into place whole, so a failed or killed copy never leaves a file that reads as a
        damaged state (a failure removes the folder; a kill leaves it, and ``dest`` is then
        refused as not empty)."""
        dest = empty_dest(dest_path)
        partial = tempfile.mkdtemp(prefix=".compacting-", dir=dest)
        try:
            while True:
                with self._shared.gate.shared():
                    try:
                        self._env.copy(partial, compact=True)
                        break
                    except lmdb.MapResizedError:
                        pass  # another process grew the map: take its size, copy again
                self._shared.adopt_map_size()
                for name in os.listdir(partial):  # what the failed attempt began
                    os.remove(os.path.join(partial, name))
            os.replace(os.path.join(partial, DATA), os.path.join(dest, DATA))
        except lmdb.Error as exc:
            raise wrap_lmdb(exc, dest, "write a compacted copy to") from exc
        except OSError as exc:
            raise wrap_os(exc, dest, "write a compacted copy to") from exc
        finally:
            shutil.rmtree(partial, ignore_errors=True)

    def close(self) -> None:
        if self._shared is not None:
            release(self._shared)
            self._shared = None
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # closing the descriptor drops the flock
            self._lock_fd = None


# -- helpers (module level: no store state) -----------------------------------------------
def _discard(path: str, lock_fd: int) -> str | None:
    """``reset=True``: move the state in ``path`` aside and say what it was (logged, and
    kept as ``store.discarded``)."""
    what = _describe(path)
    dest = move_aside(path, lock_fd)
    if dest is None:
        return None
    note = f"{what}, moved to {dest}"
    log.warning("reset %s: discarded the previous state (%s); delete that folder once it is no longer needed",
                path, note)
    return note


def _describe(path: str) -> str:
    """A state in a few words (step, commits, offsets, size), or why it cannot be read."""
    data = os.path.join(path, DATA)
    if not os.path.exists(data):
        return "no data.mdb"
    size = f"{os.path.getsize(data) / 2**20:.1f} MB"
    try:
        with LmdbStore(path, StoreConfig(), readonly=True) as old:
            m = old.manifest()
    except StateError as exc:
        return f"unreadable, {size}: {exc}"
    return f"step {m.step}, {m.commits} commits, offsets {m.offsets}, {size}"


def _check_values(report: VerifyReport, codec: RawCodec, db: bytes, pairs: list[tuple[bytes, bytes]]) -> None:
    for key, stored in pairs:
        check_value(report, codec, db, key, stored)


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


def _pages(stat: dict) -> int:
    """Pages a database's tree holds (LMDB's ``mdb_stat``)."""
    return stat["branch_pages"] + stat["leaf_pages"] + stat["overflow_pages"]


def _kv_counts(txn: lmdb.Transaction, db: Any) -> dict[str, int]:
    counts: dict[str, int] = {}
    with txn.cursor(db=db) as cur:
        for key in cur.iternext(values=False):
            namespace = bytes(key).split(b"\x00", 1)[0].decode()
            counts[namespace] = counts.get(namespace, 0) + 1
    return counts


@contextmanager
def hold_stop_signals() -> Iterator[None]:
    """SIGTERM and SIGINT held back meanwhile and delivered after: a step of several file
    moves that must not be cut in two by a stop. Python runs signal handlers in the main
    thread, so the main thread's handlers are swapped for ones that only note the signal
    (blocking it at the OS level is not enough: another thread of the process takes it)."""
    import signal

    if threading.current_thread() is not threading.main_thread():
        yield  # handlers run in the main thread only: a stop cannot cut this thread's moves
        return
    noted: list[int] = []
    previous = {sig: signal.signal(sig, lambda signum, frame: noted.append(signum))
                for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            if handler is not None:  # None: set outside Python, left as it is
                signal.signal(sig, handler)
        for sig in noted:
            signal.raise_signal(sig)


def _round_pages(size: int) -> int:
    return max(_PAGE, -(-size // _PAGE) * _PAGE)
