"""The ``meta`` database of an LMDB state: written whole when the state is created, then
checked by every opener; the one reader and writer of its records.

Keys: ``format`` (``streamlearn-state``), ``schema_version`` and ``shards`` (ASCII ints),
``shard_fn``, ``tables`` (JSON table list) and ``manifest`` (JSON: the last commit's step,
offsets, records applied, config, metrics). All six must be there: a state missing one is
damaged and refused (it is never completed with defaults: an empty manifest over existing
rows is a model that re-learns its whole topic). From schema 2 on, every meta value but
``format`` and ``schema_version`` carries its checksum (:mod:`.codec`), so a damaged
manifest is refused even when it still parses.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import lmdb

from .codec import RawCodec, codec_for
from .exceptions import NotAStoreError, StateError, damaged
from ..config import MAX_SHARDS
from .schema import SCHEMA_VERSION, SHARD_FN, Manifest, TableSpec, manifest_record, specs_from_json

FORMAT = b"streamlearn-state"
META, BLOBS, KV = b"meta", b"blobs", b"kv"
READABLE_VERSIONS = (1, 2)  # 1: values without checksums (before streamlearn checked them)
_PLAIN = (b"format", b"schema_version")  # read before the encoding is known: never checksummed
_RECORDS = (b"manifest", b"tables", b"schema_version")  # what a Manifest is parsed from


@dataclass(frozen=True)
class StoreMeta:
    schema_version: int
    shards: int
    codec: RawCodec


def write_new(env: lmdb.Environment, shards: int) -> None:
    """One transaction: the meta, blobs and kv databases and every meta record."""
    codec = codec_for(SCHEMA_VERSION)
    with env.begin(write=True) as txn:
        meta = env.open_db(META, txn=txn, create=True)
        for name in (BLOBS, KV):
            env.open_db(name, txn=txn, create=True)
        empty = json.dumps(manifest_record(Manifest()), sort_keys=True).encode()
        for key, value in (
            (b"format", FORMAT), (b"schema_version", str(SCHEMA_VERSION).encode()),
            (b"shards", str(shards).encode()), (b"shard_fn", SHARD_FN.encode()),
            (b"tables", b"{}"), (b"manifest", empty),
        ):
            put_record(txn, meta, codec, key, value)


def read_meta(txn: lmdb.Transaction, meta: Any, path: str) -> StoreMeta:
    """Check every meta record; the schema, shard count and value encoding they give."""
    fmt = txn.get(b"format", None, meta)
    if fmt is None:
        raise damaged(path, "meta record 'format' is missing")
    if bytes(fmt) != FORMAT:
        raise NotAStoreError(f"{path} is not a streamlearn state directory (meta format {bytes(fmt)[:40]!r})")
    version = _int(path, b"schema_version", txn.get(b"schema_version", None, meta))
    if version not in READABLE_VERSIONS:
        raise StateError(
            f"{path} has state schema version {version}; this streamlearn reads versions "
            f"{READABLE_VERSIONS}: use the streamlearn version that wrote it")
    codec = codec_for(version)
    shards = _int(path, b"shards", get_record(txn, meta, codec, b"shards", path))
    if not 1 <= shards <= MAX_SHARDS:
        raise damaged(path, f"meta record 'shards' says {shards}, outside [1, {MAX_SHARDS}]")
    shard_fn = get_record(txn, meta, codec, b"shard_fn", path).decode(errors="replace")
    if shard_fn != SHARD_FN:
        raise StateError(f"{path} shards rows with {shard_fn!r}; this streamlearn uses {SHARD_FN!r}")
    parse_manifest(manifest_records(txn, meta), codec, path)  # tables and manifest parse
    return StoreMeta(version, shards, codec)


def get_record(txn: lmdb.Transaction, meta: Any, codec: RawCodec, key: bytes, path: str) -> bytes:
    """A meta record's value, checked; a missing or damaged one raises DamagedStoreError."""
    stored = txn.get(key, None, meta)
    return _decode(codec, key, None if stored is None else bytes(stored), path)


def put_record(txn: lmdb.Transaction, meta: Any, codec: RawCodec, key: bytes, value: bytes) -> None:
    txn.put(key, value if key in _PLAIN else codec.encode_value(META, key, value), db=meta)


def manifest_records(txn: lmdb.Transaction, meta: Any) -> tuple[bytes | None, ...]:
    """The stored records a Manifest is parsed from (manifest, tables, schema version), as
    stored: comparing them tells whether the parse of an earlier read still holds."""
    return tuple(None if (v := txn.get(key, None, meta)) is None else bytes(v) for key in _RECORDS)


def parse_manifest(records: tuple[bytes | None, ...], codec: RawCodec, path: str,
                   tables: dict[str, TableSpec] | None = None) -> Manifest:
    """``tables``: the already parsed table list, or None to parse the stored one."""
    manifest, table_list, version = (_decode(codec, key, stored, path) for key, stored in zip(_RECORDS, records))
    if tables is None:
        tables = parse_tables(table_list, path)
    try:
        return Manifest(tables=dict(tables), schema_version=int(version), **json.loads(manifest))
    except (ValueError, TypeError) as exc:
        raise damaged(path, f"meta record 'manifest' does not parse ({exc})") from exc


def parse_tables(raw: bytes, path: str) -> dict[str, TableSpec]:
    try:
        return specs_from_json(json.loads(raw))
    except (ValueError, TypeError, AttributeError) as exc:
        raise damaged(path, f"meta record 'tables' does not parse ({exc})") from exc


def _decode(codec: RawCodec, key: bytes, stored: bytes | None, path: str) -> bytes:
    if stored is None:
        raise damaged(path, f"meta record {key.decode()!r} is missing")
    if key in _PLAIN:
        return stored
    value = codec.decode_value(META, key, stored)
    if value is None:
        raise damaged(path, f"meta record {key.decode()!r} fails its checksum")
    return value


def _int(path: str, key: bytes, stored: bytes | None) -> int:
    if stored is None:
        raise damaged(path, f"meta record {key.decode()!r} is missing")
    try:
        return int(bytes(stored))
    except ValueError as exc:
        raise damaged(path, f"meta record {key.decode()!r} holds {bytes(stored)[:20]!r}, not a number") from exc
