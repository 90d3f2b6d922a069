"""Validation shared by both backends, done before anything is written.

A checkpoint that fails here raises :class:`StateError` and leaves the store untouched:
this is step 1 of the commit protocol (see :mod:`streamlearn.state.lmdb_store`).
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from .exceptions import StateError
from .schema import (
    DTYPES, KEY_LIMIT, MAX_DBS, Checkpoint, Manifest, TableSpec, json_safe, kv_key,
)

_NAME = re.compile(r"^[A-Za-z0-9_.\-]{1,200}$")


@dataclass(frozen=True)
class RowUpdate:
    ids: np.ndarray  # (n,) int64, sorted, unique
    values: np.ndarray  # (n, width) of the table's dtype, C-contiguous


@dataclass(frozen=True)
class Prepared:
    """A validated checkpoint: unique sorted ids, values cast to their table's dtype,
    kv keys joined to their namespace, config and metrics made JSON-safe."""

    step: int
    offsets: dict[str, int]
    records_applied: dict[str, int]
    rows: dict[str, RowUpdate]
    blobs: dict[str, bytes | None]
    kv: dict[bytes, bytes | None]
    config: dict | None
    metrics: dict | None

    @property
    def nbytes(self) -> int:
        """Bytes of keys and values this checkpoint writes (sizes the map growth)."""
        rows = sum(u.values.nbytes + 8 * len(u.ids) for u in self.rows.values())
        blobs = sum(len(k) + len(v or b"") for k, v in self.blobs.items())
        kv = sum(len(k) + len(v or b"") for k, v in self.kv.items())
        return rows + blobs + kv


def check_specs(specs: Sequence[TableSpec], stored: Mapping[str, TableSpec], shards: int) -> list[TableSpec]:
    """Validate declared tables against the stored ones; return the new ones.

    A table declared again with the same spec is fine (declaring is idempotent); with a
    different spec it is an error, since rows already written would be misread.
    """
    new: dict[str, TableSpec] = {}
    for spec in specs:
        _check_spec(spec)
        known = stored.get(spec.name) or new.get(spec.name)
        if known is None:
            new[spec.name] = spec
        elif known != spec:
            raise StateError(
                f"table {spec.name!r} is stored as {known} but declared as {spec}; a table's "
                "rows, width and dtype cannot change: use a new --state directory"
            )
    total = len(stored) + len(new)
    if 3 + shards * total > MAX_DBS:
        raise StateError(
            f"{total} tables x store.shards={shards} needs {3 + shards * total} LMDB databases, "
            f"more than {MAX_DBS}: lower store.shards or declare fewer tables"
        )
    return list(new.values())


def _check_spec(spec: TableSpec) -> None:
    if not isinstance(spec, TableSpec):
        raise StateError(f"declare_tables takes TableSpec objects, got {type(spec).__name__}")
    if not isinstance(spec.name, str) or not _NAME.match(spec.name):
        raise StateError(f"table name {spec.name!r} must be 1-200 characters of A-Z a-z 0-9 _ . -")
    for what in ("rows", "width"):
        value = getattr(spec, what)
        if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value <= 0:
            raise StateError(f"table {spec.name!r}: {what} must be a positive int, got {value!r}")
    if spec.rows > 2**63 - 1:
        raise StateError(f"table {spec.name!r}: rows must fit in int64, got {spec.rows}")
    if spec.dtype not in DTYPES:
        raise StateError(f"table {spec.name!r}: dtype {spec.dtype!r} is not one of {DTYPES}")


def check_ids(spec: TableSpec, ids: Any) -> np.ndarray:
    """Row ids as (n,) int64, each in ``[0, spec.rows)``; else :class:`StateError`."""
    arr = np.asarray(ids)
    if arr.ndim != 1:
        raise StateError(f"table {spec.name!r}: ids must be 1-D, got shape {arr.shape}")
    if arr.size and arr.dtype.kind not in "iu":
        raise StateError(f"table {spec.name!r}: ids must be integers, got dtype {arr.dtype}")
    arr = arr.astype(np.int64, copy=False)
    if arr.size and (arr.min() < 0 or arr.max() >= spec.rows):
        bad = arr[(arr < 0) | (arr >= spec.rows)][0]
        raise StateError(f"table {spec.name!r}: row id {bad} is outside [0, {spec.rows})")
    return arr


def _check_values(spec: TableSpec, values: Any, n: int) -> np.ndarray:
    arr = np.asarray(values)
    if arr.shape != (n, spec.width):
        raise StateError(
            f"table {spec.name!r}: values must have shape ({n}, {spec.width}), got {arr.shape}"
        )
    if not np.can_cast(arr.dtype, spec.dtype, casting="same_kind"):
        raise StateError(f"table {spec.name!r}: values of dtype {arr.dtype} cannot be stored as {spec.dtype}")
    return np.ascontiguousarray(arr, dtype=spec.dtype)


def _rows(spec: TableSpec, ids: Any, values: Any) -> RowUpdate:
    arr = check_ids(spec, ids)
    vals = _check_values(spec, values, len(arr))
    if len(arr) < 2 or bool(np.all(arr[1:] > arr[:-1])):
        return RowUpdate(arr, vals)
    # Last occurrence wins, as if the rows were written one by one; np.unique sorts the ids.
    uniq, first_in_reversed = np.unique(arr[::-1], return_index=True)
    last = len(arr) - 1 - first_in_reversed
    return RowUpdate(uniq, np.take(vals, last, axis=0))  # take: fast row gather


def _check_partitions(what: str, values: Any) -> dict[str, int]:
    if not isinstance(values, Mapping):
        raise StateError(f"checkpoint {what} must be a dict 'topic:partition' -> int")
    out = {}
    for key, value in values.items():
        topic, sep, part = str(key).rpartition(":")
        if not isinstance(key, str) or not sep or not topic or not part.isdigit():
            raise StateError(f"checkpoint {what} key {key!r} must look like 'topic:partition'")
        if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 0:
            raise StateError(f"checkpoint {what}[{key!r}] must be an int >= 0, got {value!r}")
        out[key] = int(value)
    return out


def _check_blobs(blobs: Any) -> dict[str, bytes | None]:
    out = {}
    for name, value in dict(blobs).items():
        if not isinstance(name, str) or not name or len(name.encode()) > KEY_LIMIT:
            raise StateError(f"blob name {name!r} must be a non-empty str of <= {KEY_LIMIT} bytes")
        out[name] = None if value is None else _as_bytes(f"blob {name!r}", value)
    return out


def _check_kv(kv: Any) -> dict[bytes, bytes | None]:
    out = {}
    for namespace, entries in dict(kv).items():
        if not isinstance(namespace, str) or not namespace or "\x00" in namespace:
            raise StateError(f"kv namespace {namespace!r} must be a non-empty str without NUL")
        for key, value in dict(entries).items():
            full = kv_key(namespace, _as_bytes(f"kv key in {namespace!r}", key))
            if len(full) > KEY_LIMIT:
                raise StateError(
                    f"kv key {key!r} in {namespace!r} is {len(full)} bytes with its namespace; "
                    f"LMDB keys are at most {KEY_LIMIT}: hash long keys first"
                )
            out[full] = None if value is None else _as_bytes(f"kv value for {key!r}", value)
    return out


def _as_bytes(what: str, value: Any) -> bytes:
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    raise StateError(f"{what} must be bytes, got {type(value).__name__}")


def _check_json(what: str, value: Any) -> dict | None:
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise StateError(f"checkpoint {what} must be a dict or None, got {type(value).__name__}")
    safe = json_safe(dict(value))
    try:
        json.dumps(safe, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise StateError(f"checkpoint {what} is not JSON-serialisable: {exc}") from exc
    return safe


def prepare_checkpoint(ckpt: Checkpoint, tables: Mapping[str, TableSpec]) -> Prepared:
    """Step 1 of the commit protocol: validate everything, raise before any write."""
    if not isinstance(ckpt, Checkpoint):
        raise StateError(f"commit takes a Checkpoint, got {type(ckpt).__name__}")
    if not isinstance(ckpt.step, (int, np.integer)) or isinstance(ckpt.step, bool) or ckpt.step < 0:
        raise StateError(f"checkpoint step must be an int >= 0, got {ckpt.step!r}")
    rows = {}
    for table, pair in dict(ckpt.rows).items():
        if table not in tables:
            raise StateError(f"table {table!r} is not declared: call declare_tables first (known: {sorted(tables)})")
        if not isinstance(pair, tuple) or len(pair) != 2:
            raise StateError(f"checkpoint rows[{table!r}] must be a tuple (ids, values)")
        rows[table] = _rows(tables[table], *pair)
    return Prepared(
        step=int(ckpt.step),
        offsets=_check_partitions("offsets", ckpt.offsets),
        records_applied=_check_partitions("records_applied", ckpt.records_applied),
        rows=rows,
        blobs=_check_blobs(ckpt.blobs),
        kv=_check_kv(ckpt.kv),
        config=_check_json("config", ckpt.config),
        metrics=_check_json("metrics", ckpt.metrics),
    )


def next_manifest(prev: Manifest, prep: Prepared, now: float) -> Manifest:
    """The manifest after ``prep``: offsets merged per partition, config/metrics kept when
    the checkpoint has none. A step that goes backwards is refused: it means a stale or
    second writer, whose rows would silently undo newer ones."""
    if prep.step < prev.step:
        raise StateError(
            f"checkpoint step {prep.step} is behind the stored step {prev.step}: a stale or "
            "second writer? restore the learner from this store before committing"
        )
    return Manifest(
        step=prep.step,
        offsets={**prev.offsets, **prep.offsets},
        records_applied={**prev.records_applied, **prep.records_applied},
        tables=prev.tables,
        config=prev.config if prep.config is None else prep.config,
        metrics=prev.metrics if prep.metrics is None else prep.metrics,
        schema_version=prev.schema_version,
        committed_at=now,
        commits=prev.commits + 1,
    )
