"""How values are laid out in the LMDB store, and how each one is checked when read.

Two encodings, fixed per state directory by its schema version (``meta/schema_version``):

- schema 1, ``raw`` (states written before values were checked): a row value is its raw
  little-endian bytes, a blob or kv value its bytes; nothing detects a value overwritten on
  disk, only a length that does not fit.
- schema 2, ``xxh3_64``: every value is followed by 8 bytes, the little-endian
  ``xxh3_64(value, seed)``. The seed binds the value to where it belongs: for a row,
  ``xxh3_64(table name) XOR row id``; for a blob, kv or meta value,
  ``xxh3_64(database name NUL key)``. A value moved to another key, table or database no
  longer matches, nor does one whose bytes changed (every float of ``emb.E`` set to NaN,
  a page overwritten with the B-tree left intact).

Cost (64 float32 a row, 1,024 rows at a time): about 0.2-0.3 us a row to encode and as
much to check, against 4-5 us a row for a commit and 1.2-1.6 us for a random read; 8 bytes
a row (3% of a 256-byte row); docs/benchmarks.md has ``bench/checkpoint.py`` before and after. Checked on every read: restore (``iter_rows``), queries
(``read_rows``), blobs and kv, and by ``Store.verify`` (``streamlearn inspect --verify``).
"""
from __future__ import annotations

import numpy as np
import xxhash

_DIGEST = 8
_CHUNK = 1024  # rows encoded or checked at a time: about 256 KB, which stays in cache
_hash = xxhash.xxh3_64_intdigest


def value_seed(db: bytes, key: bytes) -> int:
    """The checksum seed of a blob, kv or meta value: its database and key."""
    return _hash(db + b"\x00" + key)


def table_seed(table: str) -> np.uint64:
    """XORed with each row id to seed that row's checksum."""
    return np.uint64(_hash(table.encode()))


class RawCodec:
    """Schema 1: values stored as they are; only a row's length can be checked."""

    name = "raw"
    checksums = False
    overhead = 0

    def encode_rows(self, table: str, ids: np.ndarray, values: np.ndarray) -> list[bytes]:
        """One stored value per row of ``values`` (n, width), C-contiguous."""
        return values.view(f"V{values.shape[1] * values.itemsize}").ravel().tolist()

    def decode_rows(self, table: str, ids: np.ndarray, stored: list[bytes], width: int,
                    dtype: str) -> tuple[np.ndarray, np.ndarray]:
        """``(values (n, width), bad (n,) bool)`` from the stored values of rows ``ids``;
        a bad row (wrong length, checksum mismatch) reads as zeros."""
        row_bytes = width * np.dtype(dtype).itemsize
        bad = np.fromiter((len(v) != row_bytes for v in stored), bool, len(stored))
        if not bad.any():
            return np.frombuffer(bytearray().join(stored), dtype=dtype).reshape(-1, width), bad
        good = bytearray().join(v for v, b in zip(stored, bad.tolist()) if not b)
        out = np.zeros((len(stored), width), dtype)  # (n, width)
        out[~bad] = np.frombuffer(good, dtype=dtype).reshape(-1, width)
        return out, bad

    def encode_value(self, db: bytes, key: bytes, value: bytes) -> bytes:
        return value

    def decode_value(self, db: bytes, key: bytes, stored: bytes) -> bytes | None:
        """The value, or None when its check fails."""
        return bytes(stored)


class ChecksumCodec(RawCodec):
    """Schema 2: every value followed by its 8-byte seeded xxh3_64."""

    name = "xxh3_64"
    checksums = True
    overhead = _DIGEST

    def encode_rows(self, table: str, ids: np.ndarray, values: np.ndarray) -> list[bytes]:
        n, row_bytes = len(values), values.shape[1] * values.itemsize
        seeds = _seeds(table, ids)
        out: list[bytes] = []
        for lo in range(0, n, _CHUNK):  # chunks that stay in cache: 4x faster than one pass
            hi = min(lo + _CHUNK, n)
            rows = np.empty((hi - lo, row_bytes + _DIGEST), np.uint8)  # (chunk, row bytes + 8)
            rows[:, :row_bytes] = values[lo:hi].view(np.uint8).reshape(hi - lo, row_bytes)
            digests = _digests(memoryview(rows.reshape(-1)), row_bytes, seeds[lo:hi])
            rows[:, row_bytes:] = digests.view(np.uint8).reshape(hi - lo, _DIGEST)
            out += rows.view(f"V{row_bytes + _DIGEST}").ravel().tolist()
        return out

    def decode_rows(self, table: str, ids: np.ndarray, stored: list[bytes], width: int,
                    dtype: str) -> tuple[np.ndarray, np.ndarray]:
        row_bytes = width * np.dtype(dtype).itemsize
        stride, n = row_bytes + _DIGEST, len(stored)
        if any(len(v) != stride for v in stored):
            return self._decode_uneven(table, ids, stored, width, dtype)
        seeds = _seeds(table, ids)
        values = np.empty((n, width), dtype)  # (n, width)
        bad = np.empty(n, bool)
        for lo in range(0, n, _CHUNK):
            hi = min(lo + _CHUNK, n)
            buf = bytearray().join(stored[lo:hi])
            rows = np.frombuffer(buf, np.uint8).reshape(hi - lo, stride)  # (chunk, row bytes + 8)
            want = _digests(memoryview(buf), row_bytes, seeds[lo:hi])
            bad[lo:hi] = rows[:, row_bytes:].copy().view("<u8")[:, 0] != want
            values[lo:hi] = rows[:, :row_bytes].copy().view(dtype)
        values[bad] = 0
        return values, bad

    def _decode_uneven(self, table: str, ids: np.ndarray, stored: list[bytes], width: int,
                       dtype: str) -> tuple[np.ndarray, np.ndarray]:
        stride = width * np.dtype(dtype).itemsize + _DIGEST
        fits = np.fromiter((len(v) == stride for v in stored), bool, len(stored))
        out = np.zeros((len(stored), width), dtype)  # (n, width)
        kept = [v for v, ok in zip(stored, fits.tolist()) if ok]
        if kept:
            out[fits], bad_kept = self.decode_rows(table, ids[fits], kept, width, dtype)
            fits[np.flatnonzero(fits)[bad_kept]] = False
        return out, ~fits

    def encode_value(self, db: bytes, key: bytes, value: bytes) -> bytes:
        return value + _hash(value, value_seed(db, key)).to_bytes(_DIGEST, "little")

    def decode_value(self, db: bytes, key: bytes, stored: bytes) -> bytes | None:
        if len(stored) < _DIGEST:
            return None
        value, digest = bytes(stored[:-_DIGEST]), bytes(stored[-_DIGEST:])
        return value if _hash(value, value_seed(db, key)).to_bytes(_DIGEST, "little") == digest else None


def _seeds(table: str, ids: np.ndarray) -> list[int]:
    seed = _table_seeds.get(table)
    if seed is None:
        seed = _table_seeds.setdefault(table, table_seed(table))
    return (np.asarray(ids, dtype=np.int64).view(np.uint64) ^ seed).tolist()


def _digests(buf: memoryview, row_bytes: int, seeds: list[int]) -> np.ndarray:
    """(n,) little-endian uint64: the seeded xxh3_64 of each row's first ``row_bytes``;
    rows lie ``row_bytes + 8`` apart in ``buf``. One Python call per row is the floor here
    (about 0.15 us a row): xxhash hashes one buffer per call."""
    stride = row_bytes + _DIGEST
    views = [buf[at:at + row_bytes] for at in range(0, stride * len(seeds), stride)]
    return np.fromiter(map(_hash, views, seeds), "<u8", len(seeds))


_table_seeds: dict[str, np.uint64] = {}


CODECS = {1: RawCodec(), 2: ChecksumCodec()}


def codec_for(schema_version: int) -> RawCodec:
    """The encoding of a state directory of this schema version."""
    return CODECS[schema_version]
