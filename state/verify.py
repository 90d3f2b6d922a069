"""``Store.verify()``: a full scan that reports what is damaged, rather than stopping at the
first bad value as a read does (``streamlearn inspect --verify``).

Checked for every stored row: its key (8 bytes, id in ``[0, rows)``, in the shard
``shard_of`` puts it in), its length, its checksum (schema 2) and, for float tables, that
its values are finite; for every blob and kv entry: its checksum (schema 2) and, for kv,
that the key names a namespace. A database LMDB cannot walk (pages overwritten or lost)
is reported and the scan goes on with the next one. States of schema 1 carry no
checksums: their values are checked for length and finiteness only, and the report says so.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .codec import RawCodec
from .schema import TableSpec, decode_ids, shard_of

_SHOWN = 5  # ids named per finding


@dataclass
class VerifyReport:
    """What ``verify`` checked and found. ``ok``: nothing damaged."""

    path: str | None
    schema_version: int
    encoding: str  # "xxh3_64", "raw" (schema 1: no checksums) or "memory"
    checked: dict[str, int] = field(default_factory=dict)  # "rows" / "blobs" / "kv" -> entries
    problems: list[str] = field(default_factory=list)
    _findings: dict[tuple[str, str], list] = field(default_factory=dict, repr=False)

    @property
    def ok(self) -> bool:
        return not self.problems and not self._findings

    @property
    def checksums(self) -> bool:
        return self.encoding == "xxh3_64"

    def count(self, what: str, n: int) -> None:
        self.checked[what] = self.checked.get(what, 0) + n

    def add(self, where: str, what: str, ids: np.ndarray | list) -> None:
        """``len(ids)`` entries of ``where`` have problem ``what``."""
        if len(ids):
            found = self._findings.setdefault((where, what), [0, []])
            found[0] += len(ids)
            found[1].extend(list(ids)[: _SHOWN - len(found[1])])

    def lines(self) -> list[str]:
        """One line per problem, ids summarised."""
        out = list(self.problems)
        for (where, what), (n, shown) in self._findings.items():
            more = ", ..." if n > len(shown) else ""
            out.append(f"{where}: {n:,} {what} ({', '.join(str(i) for i in shown)}{more})")
        return out

    def to_dict(self) -> dict:
        return {"path": self.path, "schema_version": self.schema_version, "encoding": self.encoding,
                "checksums": self.checksums, "checked": dict(self.checked), "ok": self.ok,
                "problems": self.lines()}


def check_row_batch(report: VerifyReport, codec: RawCodec, spec: TableSpec, shard: int, shards: int,
                    pairs: list[tuple[bytes, bytes]]) -> None:
    """One batch of ``(key, value)`` pairs of a table's shard database."""
    where = f"table {spec.name} shard {shard}"
    keys = [k for k, _ in pairs]
    odd = [i for i, k in enumerate(keys) if len(k) != 8]
    report.add(where, "rows whose key is not 8 bytes (positions)", odd)
    if odd:
        pairs = [p for i, p in enumerate(pairs) if len(p[0]) == 8]
    ids = decode_ids(b"".join(k for k, _ in pairs))
    report.add(where, f"row ids outside [0, {spec.rows})", ids[(ids < 0) | (ids >= spec.rows)])
    report.add(where, "rows stored in the wrong shard", ids[shard_of(ids, shards) != shard])
    values, bad = codec.decode_rows(spec.name, ids, [v for _, v in pairs], spec.width, spec.dtype)
    report.add(where, "rows fail their checksum" if codec.checksums else "rows of the wrong length", ids[bad])
    if values.dtype.kind == "f":
        report.add(where, "rows hold NaN or infinite values", ids[~bad & ~np.isfinite(values).all(axis=1)])
    report.count("rows", len(pairs))


def check_value(report: VerifyReport, codec: RawCodec, db: bytes, key: bytes, stored: bytes) -> None:
    """One blob or kv entry."""
    what = "blobs" if db == b"blobs" else "kv"
    if db == b"kv" and b"\x00" not in key:
        report.add("kv", "keys without a namespace", [key[:40]])
    if codec.decode_value(db, key, stored) is None:
        name = key.decode(errors="replace") if what == "blobs" else key.replace(b"\x00", b"/")[:60]
        report.add(what, "values fail their checksum", [name])
    report.count(what, 1)
