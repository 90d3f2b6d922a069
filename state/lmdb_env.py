"""One LMDB environment per (process, directory), shared by every store opened on it.

py-lmdb refuses to open the same environment twice in one process, yet a learner and a
snapshot reader may live in one process; so stores on the same directory share a
:class:`SharedEnv` (reference counted). It also owns what must be process-wide:

- the named-database handles (LMDB: ``mdb_dbi_open`` must not run in two transactions of a
  process at once, hence ``db_lock``);
- a gate between read transactions and ``set_mapsize``, which invalidates every open
  transaction of the process: reads hold it shared, map growth takes it exclusively;
- the pid that opened it: an environment must be opened after ``fork()``, never before;
- the identity of the data file it opened: a directory reset or replaced since (another
  process's ``open_store(..., reset=True)``, a state deleted and saved again) holds another
  file, and a store opened on it then gets an environment of its own, never the stale one.
"""
from __future__ import annotations

import errno
import logging
import os
import threading
from contextlib import contextmanager
from typing import Iterator

import lmdb

from .exceptions import DiskFullError, NotAStoreError, StateError, StorePermissionError, damaged
from .lmdb_file import data_file_change, data_file_identity
from .schema import MAX_DBS

log = logging.getLogger(__name__)

_PERMISSION = (errno.EACCES, errno.EPERM, errno.EROFS)
# What LMDB raises on a page it cannot trust; BadTxnError follows any of them on the same
# transaction (LMDB marks it failed), so it means the same.
DAMAGE = (lmdb.CorruptedError, lmdb.PageNotFoundError, lmdb.BadTxnError, lmdb.PanicError)


class Gate:
    """Many readers or one exclusive holder (for ``set_mapsize``)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._readers = 0
        self._exclusive = False
        self._mine = threading.local()

    def held_by_me(self) -> bool:
        return getattr(self._mine, "count", 0) > 0

    @contextmanager
    def shared(self) -> Iterator[None]:
        with self._cond:
            while self._exclusive:
                self._cond.wait()
            self._readers += 1
        self._mine.count = getattr(self._mine, "count", 0) + 1
        try:
            yield
        finally:
            self._mine.count -= 1
            with self._cond:
                self._readers -= 1
                self._cond.notify_all()

    @contextmanager
    def exclusive(self) -> Iterator[None]:
        if self.held_by_me():
            raise StateError(
                "the LMDB map must be resized while this thread holds a read snapshot: "
                "commit outside `with store.snapshot():` blocks"
            )
        with self._cond:
            while self._exclusive or self._readers:
                self._cond.wait()
            self._exclusive = True
        try:
            yield
        finally:
            with self._cond:
                self._exclusive = False
                self._cond.notify_all()


class SharedEnv:
    """An open ``lmdb.Environment`` and the process-wide state that goes with it."""

    def __init__(self, path: str, env: lmdb.Environment, readonly: bool) -> None:
        self.path = path
        self.env = env
        self.readonly = readonly
        self.pid = os.getpid()
        self.dbs: dict[bytes, object] = {}
        self.db_lock = threading.RLock()
        self.gate = Gate()
        self.refs = 0
        try:
            self.file_id: tuple[int, int] | None = data_file_identity(path)  # (device, inode) of the file opened
        except OSError:
            self.file_id = None  # gone already: stale at once

    def stale(self) -> bool:
        """Whether the directory now holds another data file than the one this opened
        (or none): reset, replaced or deleted since."""
        return data_file_change(self.path, self.file_id) is not None

    def check_pid(self) -> None:
        if os.getpid() != self.pid:
            raise StateError(
                f"the store at {self.path} was opened before fork(); open stores in the "
                "process that uses them (LMDB environments do not survive fork)"
            )

    def db(self, name: bytes) -> object:
        """The handle of an existing named database (opened on first use)."""
        handle = self.dbs.get(name)
        if handle is None:
            with self.db_lock:
                handle = self.dbs.get(name)
                if handle is None:
                    try:
                        handle = self.env.open_db(name, create=False)
                    except lmdb.NotFoundError as exc:
                        raise NotAStoreError(
                            f"{self.path} has no database {name.decode()!r}: not a streamlearn "
                            "state directory, or written by another version"
                        ) from exc
                    self.dbs[name] = handle
        return handle

    @contextmanager
    def read_txn(self) -> Iterator[lmdb.Transaction]:
        """A short read transaction over one consistent snapshot. Values come as bytes
        (``buffers=False``): py-lmdb's zero-copy views cost more than the copy they save
        (random gets 0.8 vs 0.33 us a row; a 65,536-row scan 30x slower holding its views)."""
        self.check_pid()
        while True:
            with self.gate.shared():
                try:
                    txn = self.env.begin()
                except lmdb.MapResizedError:
                    txn = None
                except lmdb.Error as exc:
                    raise wrap_lmdb(exc, self.path, "read") from exc
                if txn is not None:
                    with txn:
                        yield txn
                    return
            self.adopt_map_size()

    def adopt_map_size(self) -> None:
        """Another process grew the map: take its size (``set_mapsize(0)``)."""
        with self.gate.exclusive():
            self.env.set_mapsize(0)
        log.debug("adopted the grown LMDB map of %s", self.path)

    def set_map_size(self, size: int) -> None:
        with self.gate.exclusive():
            self.env.set_mapsize(size)


_registry: dict[tuple[int, str], SharedEnv] = {}
_registry_lock = threading.Lock()


def acquire(path: str, readonly: bool, map_size: int, sync: bool) -> SharedEnv:
    """The shared environment of ``path`` in this process, opened on first use.

    A read-only store reuses a writer's environment; a writer cannot reuse a read-only one
    (LMDB fixes the mode at open), and says so. An environment whose data file the
    directory no longer holds (:meth:`SharedEnv.stale`) is left to the stores using it
    and a new one is opened: a store opened now reads the directory as it is now.
    """
    key = (os.getpid(), os.path.realpath(path))
    with _registry_lock:
        shared = _registry.get(key)
        if shared is not None and shared.stale():
            del _registry[key]  # its stores keep it until they close (release)
            shared = None
        if shared is None:
            shared = SharedEnv(key[1], _open_env(path, readonly, map_size, sync), readonly)
            _registry[key] = shared
        elif shared.readonly and not readonly:
            raise StateError(
                f"{path} is already open read-only in this process; close those readers "
                "before opening it for writing (or open the writer first)"
            )
        shared.refs += 1
        return shared


def release(shared: SharedEnv) -> None:
    with _registry_lock:
        shared.refs -= 1
        if shared.refs > 0:
            return
        key = (shared.pid, shared.path)
        if _registry.get(key) is shared:  # not a newer environment opened on a replaced directory
            del _registry[key]
        if shared.pid == os.getpid():
            shared.env.close()


def _open_env(path: str, readonly: bool, map_size: int, sync: bool) -> lmdb.Environment:
    try:
        return lmdb.open(
            path,
            map_size=0 if readonly else map_size,  # 0: a reader adopts the file's map size
            subdir=True,
            readonly=readonly,
            create=not readonly,
            max_dbs=MAX_DBS,
            sync=sync,
            max_spare_txns=1,  # reuse one reader slot: per-query transactions stay cheap
        )
    except lmdb.Error as exc:
        raise wrap_lmdb(exc, path, "open") from exc
    except OSError as exc:
        raise wrap_os(exc, path, "open") from exc


def wrap_lmdb(exc: lmdb.Error, path: str, what: str, need: int = 0) -> StateError:
    """An LMDB error as a :class:`StateError` that says what to change. ``need``: bytes the
    failed write wanted (LMDB reports a short write on a full disk as EIO, not ENOSPC)."""
    code = getattr(exc, "code", 0)
    full = code == errno.EIO and _free_bytes(path) < max(need, 1) * 2
    if full or isinstance(exc, lmdb.DiskError) or code in (errno.ENOSPC, errno.EFBIG, errno.EDQUOT):
        return DiskFullError(
            f"cannot {what} {path}: {exc}; free disk space (or raise the file size limit) and "
            "retry; the last complete checkpoint is intact"
        )
    if code == errno.EROFS:
        return _read_only_fs(path, what)
    if isinstance(exc, lmdb.ReadonlyError) or code in _PERMISSION:
        return StorePermissionError(
            f"cannot {what} {path}: permission denied ({exc}); the user running streamlearn "
            "needs write access to the directory and its data.mdb/lock.mdb (readers too: "
            "LMDB readers register in lock.mdb)"
        )
    if code == errno.EIO:
        return StateError(
            f"I/O error while trying to {what} {path}: {exc}; check the disk (dmesg) and its "
            "free space; the last complete checkpoint is intact"
        )
    if isinstance(exc, DAMAGE):
        return damaged(path, f"LMDB reports {exc} while trying to {what} it (pages overwritten or lost)")
    if isinstance(exc, (lmdb.InvalidError, lmdb.VersionMismatchError)):
        return NotAStoreError(f"{path} does not hold a readable LMDB environment: {exc}")
    return StateError(f"LMDB error while trying to {what} {path}: {exc}")


def _read_only_fs(path: str, what: str) -> StorePermissionError:
    return StorePermissionError(f"cannot {what} {path}: the file system is mounted read-only; move the state "
                                "to a writable one (or remount it)")


def wrap_os(exc: OSError, path: str, what: str) -> StateError:
    if exc.errno == errno.EROFS:  # was: "permission denied", which no chmod mends
        return _read_only_fs(path, what)
    if exc.errno in _PERMISSION:
        return StorePermissionError(
            f"cannot {what} {path}: permission denied; the user running streamlearn needs "
            "write access to the state directory"
        )
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return DiskFullError(f"cannot {what} {path}: no space left on the device; free disk space")
    return StateError(f"cannot {what} {path}: {exc}")


def _free_bytes(path: str) -> int:
    try:
        st = os.statvfs(path)
    except OSError:
        return 0
    return st.f_bavail * st.f_frsize
