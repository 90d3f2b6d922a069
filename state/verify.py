"""``Store.verify()``: a full scan that reports what is damaged, rather than stopping at the
first bad value as a read does (``streamlearn inspect --verify``).

Checked for every stored row: its key (8 bytes, id in ``[0, rows)``, in the shard
``shard_of`` puts it in), its length, its checksum (schema 2) and, for float tables, that
its values are finite (except the tables the caller names as ``words``: float32 words
that hold hashed keys or codes, where a key may read as NaN); for every blob and kv entry: its checksum (schema 2) and, for kv,
that the key names a namespace. A database LMDB cannot walk (pages overwritten or lost)
is reported and the scan goes on with the next one. States of schema 1 carry no
checksums: their values are checked for length and finiteness only, and the report says so.
"""
from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from .codec import RawCodec
from .exceptions import StateError
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

    @classmethod
    def from_dict(cls, d: dict) -> "VerifyReport":
        return cls(d["path"], d["schema_version"], d["encoding"], dict(d["checked"]), list(d["problems"]))


def check_row_batch(report: VerifyReport, codec: RawCodec, spec: TableSpec, shard: int, shards: int,
                    pairs: list[tuple[bytes, bytes]], numbers: bool = True) -> None:
    """One batch of ``(key, value)`` pairs of a table's shard database; ``numbers``: its
    float values are numbers (checked finite), not words holding bits."""
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
    if numbers and values.dtype.kind == "f":
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


# -- in child processes: LMDB may abort instead of reporting ---------------------------------
def verify_in_child(path: str, timeout_s: float = 3600.0, words: Sequence[str] = ()) -> VerifyReport:
    """``Store.verify(words=words)`` of the LMDB state at ``path``, run in a child process.

    LMDB trusts its pages: a cursor that steps onto an overwritten leaf aborts the process
    (an assertion, SIGABRT) instead of returning an error. A child that dies so is reported
    as damage of the database it was reading, and the scan goes on in a new child that
    skips it, so one bad database does not hide the state of the others."""
    skip: list[str] = []
    crashes: list[str] = []
    while True:
        out = subprocess.run([sys.executable, "-m", "streamlearn.state.verify", path, *skip,
                              *(f"--words={name}" for name in words)],
                             capture_output=True, text=True, timeout=timeout_s)
        lines = out.stdout.splitlines()
        if out.returncode == 0 and lines and lines[-1].startswith("report "):
            report = VerifyReport.from_dict(json.loads(lines[-1][len("report "):]))
            report.problems[:0] = crashes
            return report
        reading = next((line[len("database "):] for line in reversed(lines) if line.startswith("database ")), None)
        last = (out.stderr.strip().splitlines() or ["no message"])[-1]
        if out.returncode >= 0 or reading is None or reading in skip:
            raise StateError(f"verifying {path} failed (exit status {out.returncode}): {last}")
        crashes.append(f"database {reading}: LMDB stopped the process reading it ({signal.Signals(-out.returncode).name}: "
                       f"{last}): pages overwritten or lost")
        skip.append(reading)


def main(argv: list[str] | None = None) -> int:
    """The child of :func:`verify_in_child`: ``database NAME`` before each database, then
    ``report {json}``."""
    from ..exceptions import StreamlearnError
    from .factory import open_store

    parser = argparse.ArgumentParser(prog="python -m streamlearn.state.verify")
    parser.add_argument("path")
    parser.add_argument("skip", nargs="*", help="databases not to read")
    parser.add_argument("--words", action="append", default=[], help="a table whose floats hold bits")
    args = parser.parse_args(argv)
    try:
        with open_store(args.path, readonly=True, backend="lmdb") as store:
            report = store.verify(skip=args.skip, words=args.words,
                                  progress=lambda name: print("database", name, flush=True))
    except StreamlearnError as exc:
        print(exc, file=sys.stderr)
        return 2
    print("report", json.dumps(report.to_dict()), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
