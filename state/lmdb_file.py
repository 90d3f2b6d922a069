"""LMDB's own record of ``data.mdb``, read with plain file I/O before the file is mapped.

Why: LMDB maps the file and trusts it. A file cut short (``truncate``, a copy that stopped,
a restore onto a full disk) is mapped all the same, and the first read of a page past its
end kills the process with SIGBUS: no exception, no message, exit status 135. An empty
``data.mdb`` is worse: LMDB takes it for a new environment and starts a fresh one. Both are
caught here, from the two meta pages at the start of the file, which say how many pages
the last commit uses.

Layout (LMDB 0.9 ``mdb.c``, 64-bit, native byte order): meta page ``i`` starts at
``i * page_size``. A 16-byte page header (``mp_pgno`` u64, ``mp_pad`` u16, ``mp_flags``
u16 with ``P_META`` = 0x08, 4 more bytes), then ``MDB_meta``: ``mm_magic`` u32 (0xBEEFC0DE),
``mm_version`` u32 (1), ``mm_address`` u64, ``mm_mapsize`` u64, ``mm_dbs[2]`` (48 bytes each;
the first u32 of the free-list DB is the page size), ``mm_last_pg`` u64, ``mm_txnid`` u64.
LMDB reads the same two pages the same way (``mdb_env_read_header``) and uses the one with
the larger ``mm_txnid``; pages ``0 .. mm_last_pg`` must lie in the file.
"""
from __future__ import annotations

import os
import struct
from dataclasses import dataclass

from .exceptions import NotAStoreError, damaged

DATA = "data.mdb"


def data_file_identity(directory: str) -> tuple[int, int]:
    """(device, inode) of a state directory's data file: another file at the same path
    (the directory deleted and created again, a state restored over it) differs.
    OSError (FileNotFoundError when it is gone) as ``os.stat`` raises it."""
    st = os.stat(os.path.join(directory, DATA))
    return st.st_dev, st.st_ino


def data_file_change(directory: str, opened: tuple[int, int] | None) -> str | None:
    """How ``directory``'s data file changed since the one of identity ``opened`` (from
    :func:`data_file_identity`) was opened: ``"deleted"``, ``"replaced"`` or None."""
    try:
        now = data_file_identity(directory)
    except OSError:
        return "deleted"
    return None if now == opened else "replaced"

_MAGIC = 0xBEEFC0DE
_VERSION = 1
_P_META = 0x08
_HEADER = struct.Struct("=QHH")  # mp_pgno, mp_pad, mp_flags (then 4 bytes: 16 in all)
_META_AT = 16
_META = struct.Struct("=IIQQ")  # mm_magic, mm_version, mm_address, mm_mapsize
_PSIZE_AT = 40  # mm_dbs[FREE_DBI].md_pad
_TAIL_AT = 136  # mm_last_pg, mm_txnid
_TAIL = struct.Struct("=QQ")
_READ = _TAIL_AT + _TAIL.size
_MIN_PAGE, _MAX_PAGE = 512, 65536


@dataclass(frozen=True)
class MapRecord:
    """What the newest meta page says about the file."""

    page_size: int
    last_page: int  # pages 0 .. last_page are in use
    txnid: int
    map_size: int

    @property
    def used_bytes(self) -> int:
        return (self.last_page + 1) * self.page_size


def check_readable(path: str | os.PathLike) -> MapRecord:
    """Raise :class:`DamagedStoreError` unless ``path/data.mdb`` holds two valid LMDB meta
    pages and is at least as long as the newest one says; ``NotAStoreError`` when there
    is no ``data.mdb``. Costs two small reads and a ``stat`` (microseconds): a long-lived
    reader runs it before each reopen or refresh, since a mapped file that is later cut
    short kills the process on its next read.

    The meta page is read before the size: a writer extends the file before it writes
    the meta page that points past the old end, so the file is never shorter than a meta
    page read earlier says, unless it was cut.
    """
    directory = os.fspath(path)
    data = os.path.join(directory, DATA)
    try:
        with open(data, "rb") as f:
            record = _read_record(directory, f)
            size = os.fstat(f.fileno()).st_size
    except FileNotFoundError as exc:
        raise NotAStoreError(f"{directory} has no {DATA}: not a streamlearn state directory") from exc
    except OSError as exc:
        raise damaged(directory, f"{DATA} cannot be read ({exc})") from exc
    if size < record.used_bytes:
        raise damaged(directory, f"{DATA} is {size:,} bytes but its last commit uses {record.used_bytes:,} "
                      f"(pages 0-{record.last_page} of {record.page_size} bytes): the file was cut short")
    return record


def _read_record(directory: str, f) -> MapRecord:
    first = _read_meta(directory, f, 0, None)
    second = _read_meta(directory, f, 1, first.page_size)
    return first if first.txnid >= second.txnid else second


def _read_meta(directory: str, f, index: int, page_size: int | None) -> MapRecord:
    f.seek(index * (page_size or 0))
    raw = f.read(_READ)
    where = f"{DATA} meta page {index}"
    if index == 0 and not raw:
        raise damaged(directory, f"{DATA} is empty (0 bytes)")
    if len(raw) < _READ:
        raise damaged(directory, f"{DATA} is {f.seek(0, 2):,} bytes, too short for its meta page {index}")
    flags = _HEADER.unpack_from(raw)[2]
    magic, version, _, map_size = _META.unpack_from(raw, _META_AT)
    if not flags & _P_META or magic != _MAGIC:
        raise damaged(directory, f"{where} is overwritten (not an LMDB meta page)")
    if version != _VERSION:
        raise damaged(directory, f"{where} has LMDB data version {version}; this LMDB reads {_VERSION}")
    psize = struct.unpack_from("=I", raw, _PSIZE_AT)[0]
    if not _MIN_PAGE <= psize <= _MAX_PAGE or psize & (psize - 1) or (page_size and psize != page_size):
        raise damaged(directory, f"{where} records a page size of {psize} bytes")
    last, txnid = _TAIL.unpack_from(raw, _TAIL_AT)
    return MapRecord(psize, last, txnid, map_size)
