"""The state directory around the LMDB environment: who may write it, when a new state may
be created there, how it is created so that a kill cannot leave half of one, and how an
explicit reset moves an old one aside.

The rule: a new, empty state starts only in an absent or empty directory, or when the
caller asks for a reset. A directory holding anything of a previous state (``data.mdb``,
``lock.mdb``, the writer lock's mark, files we do not know) is opened as it is, or refused
with the reason; it is never initialised over. (Initialising over it made a deleted meta
key or an emptied ``data.mdb`` start a fresh model at offset 0 that learned every record a
second time, without a word.)

Creation is atomic: the environment and its meta are written to ``data.mdb.new`` (LMDB
``subdir=False``, with its own lock file ``data.mdb.new-lock``), flushed, and renamed to
``data.mdb``. So a ``data.mdb`` only ever exists complete; a kill during creation leaves
``*.new`` leftovers, which the next writer removes before it creates again. Once a state
exists, the writer lock file holds a mark (``streamlearn state``), so a directory whose
``data.mdb`` later goes missing still says that it held one.
"""
from __future__ import annotations

import fcntl
import logging
import os
import shutil
import time
from typing import Callable

import lmdb

from .exceptions import NotAStoreError, StateError, StoreBusyError, damaged
from .lmdb_env import wrap_lmdb, wrap_os
from .lmdb_file import DATA
from .schema import MAX_DBS

log = logging.getLogger(__name__)

WRITER_LOCK = "streamlearn-writer.lock"
LOCK = "lock.mdb"
NEW = DATA + ".new"
NEW_LOCK = NEW + "-lock"
DISCARDED = "discarded-"  # prefix of the folders a reset moves old states into
_MARK = b"streamlearn state\n"
_NOT_STATE = {WRITER_LOCK, NEW, NEW_LOCK, "lost+found"}  # lost+found: a volume's root


def check_state_dir(path: str) -> None:
    """For a reader: ``path`` is a directory with a ``data.mdb``, else NotAStoreError."""
    try:
        os.stat(os.path.join(path, DATA))
    except OSError as exc:
        if os.path.isfile(path):
            raise NotAStoreError(f"{path} is a file, not a state directory") from exc
        if isinstance(exc, FileNotFoundError) and not os.path.isdir(path):
            raise NotAStoreError(f"state directory {path} does not exist; a worker creates it (--state {path})") from exc
        if isinstance(exc, FileNotFoundError):
            raise NotAStoreError(f"{path} is not a streamlearn state directory (no data.mdb)") from exc
        raise wrap_os(exc, path, "open") from exc


def take_writer_lock(path: str) -> int:
    """One writer per directory: an exclusive flock, released when the process dies."""
    try:
        os.makedirs(path, exist_ok=True)
        fd = os.open(os.path.join(path, WRITER_LOCK), os.O_RDWR | os.O_CREAT, 0o644)
    except FileExistsError as exc:
        raise NotAStoreError(f"{path} exists and is not a directory") from exc
    except OSError as exc:
        raise wrap_os(exc, path, "open for writing") from exc
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError as exc:
        os.close(fd)
        raise StoreBusyError(
            f"another writer holds {path} (this or another process): one writer per state "
            "directory; stop it, or give this one its own --state"
        ) from exc
    return fd


def needs_creation(path: str, lock_fd: int) -> bool:
    """For the writer holding ``lock_fd``: True when ``path`` holds no state yet (create
    one), False when it holds a ``data.mdb`` (open and check it); otherwise refuse."""
    found = _contents(path)
    if DATA in found:
        return False
    if LOCK in found or is_marked(lock_fd):
        raise damaged(path, f"{DATA} is missing, yet the directory held a state "
                      f"({LOCK if LOCK in found else 'the writer lock says so'})")
    if found:
        shown = ", ".join(found[:5]) + (", ..." if len(found) > 5 else "")
        raise NotAStoreError(
            f"{path} is not empty and holds no streamlearn state (found: {shown}): give --state "
            "a new or empty directory")
    return True


def create(path: str, lock_fd: int, map_size: int, write_meta: Callable[[lmdb.Environment], None]) -> None:
    """Create the environment with ``write_meta``'s first transaction, atomically (see the
    module docstring), then mark the writer lock."""
    new = os.path.join(path, NEW)
    try:
        _remove(path, (NEW, NEW_LOCK))
        env = lmdb.open(new, map_size=map_size, subdir=False, max_dbs=MAX_DBS, sync=True)
        try:
            write_meta(env)
        finally:
            env.close()
        os.rename(new, os.path.join(path, DATA))
        _remove(path, (NEW_LOCK,))
        _fsync_dir(path)
    except lmdb.Error as exc:
        raise wrap_lmdb(exc, path, "create a state in") from exc
    except OSError as exc:
        raise wrap_os(exc, path, "create a state in") from exc
    mark(lock_fd)


def is_marked(lock_fd: int) -> bool:
    return os.pread(lock_fd, len(_MARK), 0) == _MARK


def mark(lock_fd: int) -> None:
    """Record in the writer lock file that this directory holds a state (idempotent)."""
    if not is_marked(lock_fd):
        os.pwrite(lock_fd, _MARK, 0)
        os.fsync(lock_fd)


def move_aside(path: str, lock_fd: int) -> str | None:
    """Move the state in ``path`` (``data.mdb``, ``lock.mdb``, creation leftovers) into a
    new ``path/discarded-<UTC time>/`` and clear the writer lock's mark; returns that
    folder, or None when there was nothing to move. Files that are not ours stay."""
    names = [n for n in (DATA, LOCK, NEW, NEW_LOCK) if os.path.lexists(os.path.join(path, n))]
    if not names and not is_marked(lock_fd):
        return None
    dest = _discard_dir(path)
    try:
        os.mkdir(dest)
        for name in names:
            os.rename(os.path.join(path, name), os.path.join(dest, name))
        os.ftruncate(lock_fd, 0)
        _fsync_dir(path)
    except OSError as exc:
        raise wrap_os(exc, path, "move the old state aside in") from exc
    return dest


def empty_dest(dest_path: str) -> str:
    dest = os.path.abspath(dest_path)
    if os.path.exists(dest) and (not os.path.isdir(dest) or os.listdir(dest)):
        raise StateError(f"compact destination {dest} must be a new or empty directory")
    try:
        os.makedirs(dest, exist_ok=True)
    except OSError as exc:
        raise wrap_os(exc, dest, "create") from exc
    return dest


def _contents(path: str) -> list[str]:
    """What the directory holds besides our own bookkeeping and discarded states."""
    try:
        names = os.listdir(path)
    except OSError as exc:
        raise wrap_os(exc, path, "list") from exc
    return sorted(n for n in names if n not in _NOT_STATE and not n.startswith(DISCARDED))


def _discard_dir(path: str) -> str:
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    dest, n = os.path.join(path, DISCARDED + stamp), 1
    while os.path.lexists(dest):
        n += 1
        dest = os.path.join(path, f"{DISCARDED}{stamp}-{n}")
    return dest


def _remove(path: str, names: tuple[str, ...]) -> None:
    for name in names:
        target = os.path.join(path, name)
        if os.path.isdir(target) and not os.path.islink(target):
            shutil.rmtree(target)
        elif os.path.lexists(target):
            os.remove(target)


def _fsync_dir(path: str) -> None:
    """A rename is durable once its directory is flushed."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
