"""What the store holds, and how a row id maps to its shard and its key.

These are the persisted formats: changing any of them means a new ``SCHEMA_VERSION``.

- A table (:class:`TableSpec`) is ``rows`` x ``width`` values of one ``dtype``, split into
  S shards by :func:`shard_of`.
- A row key is the row id as 8 bytes big-endian (:func:`encode_ids`), so a cursor walks a
  shard in id order; a row value is the row's raw little-endian bytes (``width * itemsize``),
  followed from schema 2 on by its checksum (:mod:`.codec`).
- A checkpoint (:class:`Checkpoint`) is what one commit writes; the manifest
  (:class:`Manifest`) is what the store says about the last commit.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

SCHEMA_VERSION = 2  # 2: every stored value carries a checksum; 1 (read too): none
SHARD_FN = "splitmix64-mod"  # recorded in the store; readers check it
MAX_DBS = 2048  # LMDB named databases per environment: 3 + shards * tables must fit
KEY_LIMIT = 511  # LMDB's default maximum key size, bytes
DTYPES = ("float16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8")

_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)


@dataclass(frozen=True)
class TableSpec:
    """A row table: ids in ``[0, rows)``, each row ``width`` values of ``dtype``."""

    name: str
    rows: int
    width: int
    dtype: str = "float32"

    @property
    def row_bytes(self) -> int:
        return self.width * np.dtype(self.dtype).itemsize


@dataclass
class Checkpoint:
    """Everything one commit writes; applied all together or not at all.

    ``offsets`` and ``records_applied`` are keyed ``"topic:partition"`` and merged into the
    stored ones (partitions not named keep their values). ``rows`` maps a declared table to
    ``(ids (n,) int64, values (n, width))``; a repeated id keeps its last value. ``blobs`` are
    whole objects (None deletes); ``kv`` maps a namespace to key -> value (None deletes).
    ``config`` / ``metrics`` replace the stored ones when not None.
    """

    step: int
    offsets: dict[str, int] = field(default_factory=dict)
    records_applied: dict[str, int] = field(default_factory=dict)
    rows: dict[str, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)
    blobs: dict[str, bytes | None] = field(default_factory=dict)
    kv: dict[str, dict[bytes, bytes | None]] = field(default_factory=dict)
    config: dict | None = None
    metrics: dict | None = None


@dataclass(frozen=True)
class Manifest:
    """The store's account of its last complete commit.

    ``step`` 0 and ``commits`` 0 with ``committed_at`` None mean nothing was committed yet.
    ``committed_at`` is unix seconds.
    """

    step: int = 0
    offsets: dict[str, int] = field(default_factory=dict)
    records_applied: dict[str, int] = field(default_factory=dict)
    tables: dict[str, TableSpec] = field(default_factory=dict)
    config: dict | None = None
    metrics: dict | None = None
    schema_version: int = SCHEMA_VERSION
    committed_at: float | None = None
    commits: int = 0

    def to_dict(self) -> dict[str, Any]:
        """JSON-able; tables as ``{name: {rows, width, dtype}}``."""
        out = asdict(self)
        out["tables"] = {name: _spec_fields(spec) for name, spec in self.tables.items()}
        return out


def _spec_fields(spec: TableSpec) -> dict[str, Any]:
    return {"rows": spec.rows, "width": spec.width, "dtype": spec.dtype}


def specs_to_json(tables: dict[str, TableSpec]) -> dict[str, dict[str, Any]]:
    return {name: _spec_fields(spec) for name, spec in tables.items()}


def specs_from_json(data: dict[str, dict[str, Any]]) -> dict[str, TableSpec]:
    return {name: TableSpec(name=name, **fields) for name, fields in data.items()}


def manifest_record(m: Manifest) -> dict[str, Any]:
    """The part of a manifest stored under the ``manifest`` key (tables live apart)."""
    return {
        "step": m.step, "offsets": m.offsets, "records_applied": m.records_applied,
        "config": m.config, "metrics": m.metrics, "committed_at": m.committed_at,
        "commits": m.commits,
    }


def shard_of(ids: np.ndarray, shards: int) -> np.ndarray:
    """Shard of each row id: ``splitmix64_finalizer(id) mod shards``.  # (n,) int64

    The id is mixed first because ids from hashing schemes can be structured (Bloom's
    ``i * B + h``, strided buckets); plain ``id % S`` would then pile rows into a few
    shards. The function is fixed (it is part of the on-disk format, recorded as
    ``shard_fn``); changing it needs a new schema version.

    >>> shard_of(np.array([0, 1, 2, 3]), 8).tolist()
    [0, 5, 2, 0]
    """
    x = np.asarray(ids).astype(np.uint64)
    x = (x ^ (x >> np.uint64(30))) * _M1
    x = (x ^ (x >> np.uint64(27))) * _M2
    x = x ^ (x >> np.uint64(31))
    return (x % np.uint64(shards)).astype(np.int64)


def encode_ids(ids: np.ndarray) -> np.ndarray:
    """Row keys: 8-byte big-endian ids as a (n,) ``V8`` array (``.tolist()`` gives bytes)."""
    return np.ascontiguousarray(ids, dtype=">u8").view("V8")


def decode_ids(keys: bytes | bytearray) -> np.ndarray:
    """Inverse of :func:`encode_ids` over concatenated keys.  # (n,) int64"""
    return np.frombuffer(keys, dtype=">u8").astype(np.int64)


def row_db_name(table: str, shard: int) -> bytes:
    return f"rows:{table}:{shard:03d}".encode()


def kv_key(namespace: str, key: bytes) -> bytes:
    """One LMDB key per (namespace, key): ``namespace NUL key`` so a namespace is a prefix."""
    return namespace.encode() + b"\x00" + bytes(key)


def json_safe(value: Any) -> Any:
    """Non-finite floats become None (strict JSON has no NaN; a NaN loss must not stop a
    commit); numpy scalars become Python numbers."""
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value
