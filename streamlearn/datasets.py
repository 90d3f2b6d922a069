"""Dataset files -> stream rows ``(key, record, ts_ms)`` for ``streamlearn produce``.

Formats (autodetected from the file name and first line; ``--input-format`` overrides):

- ``jsonl``: one JSON object per line, already a record (``text``/``tokens``/``label``/
  ``key``/``item``/``ts``/``weight``);
- ``csv`` / ``tsv``: a text column and an optional label column, chosen by
  ``text_column`` / ``label_column`` (a header name or a 0-based index; ``"1,2"`` joins
  several columns with a space). A first row that names a ``text`` or ``label`` column (or
  the columns asked for by name) is a header. Headerless files get the layouts of the two
  classic corpora: 2 columns are ``label, text`` (SMSSpamCollection), 3 columns are
  ``label, title, description`` with text = title + " " + description (AG News). TSV is
  split on tabs with no quoting; CSV follows RFC 4180 quoting;
- ``movielens``: ``u.data`` (``user<TAB>item<TAB>rating<TAB>unix seconds``), and
  ``movielens-csv``: ``ratings.csv`` (header ``userId,movieId,rating,timestamp``). Both
  become next-item events ``{"key": user, "item": movie, "ts": ms}`` keyed by the user, in
  time order (stable sort, so ties keep file order).

A line that cannot become a valid record stops the read with ``FILE:LINE: reason``, or,
with ``skip_bad_lines``, is counted in :attr:`DatasetReader.bad_lines` (line, reason) for
the caller to report. Blank lines hold no record and are passed over.

>>> import tempfile, pathlib
>>> path = pathlib.Path(tempfile.mkdtemp()) / "SMSSpamCollection"
>>> _ = path.write_text("ham\\tSee you at 5\\nspam\\tWIN a prize now\\n")
>>> [row.record for row in DatasetReader(path)]
[{'text': 'See you at 5', 'label': 'ham'}, {'text': 'WIN a prize now', 'label': 'spam'}]
"""
from __future__ import annotations

import csv
import json
import re
from array import array
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator, NamedTuple

import numpy as np

from .exceptions import RecordError, StreamlearnError
from .records import from_dict

FORMATS = ("jsonl", "csv", "tsv", "movielens", "movielens-csv")
_MOVIELENS_LINE = re.compile(r"\d+\t\d+\t\d+(\.\d+)?\t\d+")
_MOVIELENS_CSV_HEADER = ["userid", "movieid", "rating", "timestamp"]
_HEADER_NAMES = {"text", "label"}
_MAX_SECONDS = ((1 << 63) - 1) // 1000  # the ms timestamp must fit Kafka's int64


class DatasetError(StreamlearnError):
    """A dataset file cannot be read: unknown format, missing column, or a bad line."""


class Row(NamedTuple):
    key: bytes | None  # the message key (None: the producer picks one)
    record: dict[str, Any]  # a valid record (records.from_dict accepts it)
    ts_ms: int | None  # the Kafka timestamp to set (None: the broker's time)


@dataclass(frozen=True)
class ReadOptions:
    format: str | None = None  # one of FORMATS; None: detect_format
    text_column: str | None = None  # csv/tsv: name or 0-based index, "a,b" joins columns
    label_column: str | None = None
    skip_bad_lines: bool = False  # False: the first bad line raises DatasetError


class _BadLine(Exception):
    """One line that cannot become a record (internal: turned into DatasetError or counted)."""


# ---------------------------------------------------------------------------- bundled data

def bundled_path(name: str = "SMSSpamCollection") -> Path:
    """Path of a data file shipped in the wheel (``streamlearn/data/``; licences in its README.md).

    >>> bundled_path().name
    'SMSSpamCollection'
    """
    data = Path(__file__).parent / "data"
    path = data / name
    if Path(name).name != name or name == "README.md" or not path.is_file():
        shipped = sorted(p.name for p in data.iterdir() if p.is_file() and p.name != "README.md")
        raise DatasetError(f"no bundled data file {name!r}; shipped: {', '.join(shipped)}")
    return path


# ---------------------------------------------------------------------------- detection

def detect_format(path: str | Path) -> str:
    """The format of ``path`` from its name, else from its first non-blank line."""
    path = Path(path)
    name = path.name.lower()
    if name.endswith((".jsonl", ".ndjson", ".json")):
        return "jsonl"
    if name == "u.data":
        return "movielens"
    first = _first_line(path)
    if name == "ratings.csv" or _split_csv_header(first) == _MOVIELENS_CSV_HEADER:
        return "movielens-csv"
    if first.lstrip().startswith("{"):
        return "jsonl"
    for ext in ("tsv", "csv"):
        if name.endswith("." + ext):
            return ext
    if _MOVIELENS_LINE.fullmatch(first.strip()):
        return "movielens"
    if "\t" in first:
        return "tsv"
    if "," in first:
        return "csv"
    raise DatasetError(f"cannot tell the format of {path}: pass --input-format, one of {', '.join(FORMATS)}")


def _first_line(path: Path) -> str:
    try:
        with path.open("rb") as f:
            for raw in f:
                if raw.strip():
                    return raw.decode("utf-8", "replace").rstrip("\r\n")
    except OSError as exc:
        raise DatasetError(f"cannot read {path}: {exc.strerror}") from exc
    return ""


def _split_csv_header(line: str) -> list[str]:
    return [cell.strip().lower() for cell in line.split(",")]


# ---------------------------------------------------------------------------- recommended configs

# What docs/choosing-a-configuration.md recommends per stream shape, as dotted overrides
# of the defaults (each measured by bench/quality.py against the stream's peer).
RECOMMENDED: dict[str, tuple[str, ...]] = {
    # text classification: the defaults (depth 0, batch 16)
    "classify": (),
    # next item over opaque ids (a few thousand items): an own 4,096-bucket output space
    # instead of the tied 20,000-row one; MovieLens recall@10 1.30x first-order Markov
    "next-item": ("learner.task=next-item", "hashing.tokenizer=ids", "model.tie_output=false",
                  "model.out_B=4096", "embedding.K=100000", "embedding.B=20000", "optim.dense_lr=0.01",
                  "learner.batch_size=256"),
}
_TASK_OF_FORMAT = {"csv": "classify", "tsv": "classify", "movielens": "next-item", "movielens-csv": "next-item"}


def recommended_overrides(path: str | Path, fmt: str | None = None) -> tuple[str, ...]:
    """The :data:`RECOMMENDED` overrides for a dataset file, by its format (``fmt``, or
    detected): csv/tsv are text classification, MovieLens is next-item.

    >>> recommended_overrides("u.data")[:2]
    ('learner.task=next-item', 'hashing.tokenizer=ids')
    """
    fmt = fmt or detect_format(path)
    task = _TASK_OF_FORMAT.get(fmt)
    if task is None:
        raise DatasetError(f"{path}: a {fmt} file can hold any task; pick a config from RECOMMENDED "
                           f"({', '.join(RECOMMENDED)}) or docs/choosing-a-configuration.md")
    return RECOMMENDED[task]


# ---------------------------------------------------------------------------- the reader

class DatasetReader:
    """Iterate a dataset file as :class:`Row` s; see the module docstring for the formats."""

    def __init__(self, path: str | Path, options: ReadOptions = ReadOptions()):
        self.path = Path(path)
        if not self.path.is_file():
            raise DatasetError(f"no such file: {self.path}")
        self.options = options
        self.format = options.format or detect_format(self.path)
        if self.format not in FORMATS:
            raise DatasetError(f"unknown input format {self.format!r}; choose one of {', '.join(FORMATS)}")
        self.bad_lines: list[tuple[int, str]] = []

    def __iter__(self) -> Iterator[Row]:
        self.bad_lines = []
        readers = {"jsonl": self._jsonl, "csv": self._table, "tsv": self._table,
                   "movielens": self._movielens, "movielens-csv": self._movielens}
        return readers[self.format]()

    def estimate_rows(self) -> int:
        """Data lines in the file (one pass counting line breaks), for progress bars: exact
        but for blank lines, a CSV/TSV header and CSV fields with quoted line breaks."""
        lines, last = 0, b"\n"
        with self.path.open("rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                lines += chunk.count(b"\n")
                last = chunk[-1:]
        lines += last != b"\n"  # a last line without a line break
        return max(0, lines - (self.format == "movielens-csv"))

    # ---- shared line handling
    def _lines(self) -> Iterator[tuple[int, str]]:
        """(1-based line number, text without the line break) of each UTF-8 line."""
        with self.path.open("rb") as f:
            for lineno, raw in enumerate(f, 1):
                try:
                    yield lineno, raw.decode("utf-8").rstrip("\r\n")
                except UnicodeDecodeError as exc:
                    self._bad(lineno, f"not UTF-8 (byte 0x{raw[exc.start]:02x} at column {exc.start + 1})")

    def _bad(self, lineno: int, reason: str) -> None:
        if not self.options.skip_bad_lines:
            raise DatasetError(f"{self.path}:{lineno}: {reason} (--skip-bad-lines counts and skips such lines)")
        self.bad_lines.append((lineno, reason))

    def _guarded(self, numbered: Iterable[tuple[int, Any]], convert) -> Iterator[Any]:
        for lineno, item in numbered:
            try:
                yield convert(item)
            except (_BadLine, RecordError) as exc:
                self._bad(lineno, str(exc))

    # ---- jsonl
    def _jsonl(self) -> Iterator[Row]:
        numbered = ((n, line) for n, line in self._lines() if line.strip())
        return self._guarded(numbered, _jsonl_row)

    # ---- csv / tsv
    def _table(self) -> Iterator[Row]:
        rows = self._tsv_rows() if self.format == "tsv" else self._csv_rows()
        first = next(rows, None)
        if first is None:
            return
        columns = _Columns.resolve(first[1], self.options, self.path)
        if not columns.header:
            rows = _chain_first(first, rows)
        yield from self._guarded(rows, columns.row)

    def _tsv_rows(self) -> Iterator[tuple[int, list[str]]]:
        return ((n, line.split("\t")) for n, line in self._lines() if line.strip())

    def _csv_rows(self) -> Iterator[tuple[int, list[str]]]:
        numbered = self._lines()
        starts: list[int] = []

        def text_lines() -> Iterator[str]:
            for lineno, line in numbered:
                starts.append(lineno)
                yield line + "\n"

        reader = csv.reader(text_lines())
        while True:
            mark = len(starts)
            try:
                cells = next(reader)
            except StopIteration:
                return
            except csv.Error as exc:
                self._bad(starts[mark] if mark < len(starts) else starts[-1], f"CSV: {exc}")
                continue
            if any(cell.strip() for cell in cells):
                yield starts[mark], cells

    # ---- movielens
    def _movielens(self) -> Iterator[Row]:
        users, items, seconds = self._movielens_columns()
        order = np.argsort(np.frombuffer(seconds, dtype=np.int64), kind="stable")
        for i in order.tolist():
            user, ts_ms = str(users[i]), seconds[i] * 1000
            yield Row(user.encode(), {"key": user, "item": items[i], "ts": ts_ms}, ts_ms)

    def _movielens_columns(self) -> tuple[array, array, array]:
        users, items, seconds = array("q"), array("q"), array("q")
        sep = "\t" if self.format == "movielens" else ","
        lines = self._lines()
        if self.format == "movielens-csv":
            self._check_ratings_header(next(lines, (1, ""))[1])
        for lineno, line in lines:
            if not line.strip():
                continue
            try:
                user, item, ts = _rating_fields(line, sep)
            except _BadLine as exc:
                self._bad(lineno, str(exc))
                continue
            users.append(user)
            items.append(item)
            seconds.append(ts)
        return users, items, seconds

    def _check_ratings_header(self, line: str) -> None:
        if _split_csv_header(line) != _MOVIELENS_CSV_HEADER:
            raise DatasetError(f"{self.path}:1: expected the header userId,movieId,rating,timestamp, got {line[:80]!r}")


def _chain_first(first: Any, rest: Iterator[Any]) -> Iterator[Any]:
    yield first
    yield from rest


def _jsonl_row(line: str) -> Row:
    try:
        obj = json.loads(line)
    except (ValueError, RecursionError) as exc:
        raise _BadLine(f"not valid JSON: {str(exc)[:100]}") from exc
    if not isinstance(obj, dict):
        raise _BadLine(f"a JSON line must be an object (a record), got {type(obj).__name__}")
    record = from_dict(obj)
    key = record.key.encode() if record.key is not None else None
    return Row(key, record.to_dict(), record.ts)


def _rating_fields(line: str, sep: str) -> tuple[int, int, int]:
    fields = line.split(sep)
    if len(fields) != 4:
        raise _BadLine(f"expected 4 fields user{sep!r}item{sep!r}rating{sep!r}timestamp, got {len(fields)}")
    try:
        user, item, ts = int(fields[0]), int(fields[1]), int(fields[3])
        float(fields[2])
    except ValueError as exc:
        raise _BadLine(f"user, item and timestamp must be integers and rating a number: {line[:80]!r}") from exc
    if not 0 <= ts <= _MAX_SECONDS:
        raise _BadLine(f"timestamp {ts} is not unix seconds (0 to {_MAX_SECONDS})")
    return user, item, ts


# ---------------------------------------------------------------------------- csv/tsv columns

@dataclass(frozen=True)
class _Columns:
    header: bool
    text: tuple[int, ...]
    label: int | None

    @classmethod
    def resolve(cls, first: list[str], options: ReadOptions, path: Path) -> "_Columns":
        names = [cell.strip().lower() for cell in first]
        asked = [spec for spec in (options.text_column, options.label_column) if spec]
        by_name = any(not part.strip().isdigit() for spec in asked for part in spec.split(","))
        header = by_name or bool(_HEADER_NAMES & set(names))
        if header:
            label_default = "label" if "label" in names else None
            text = _indices(options.text_column or "text", names, path)
            label_spec = options.label_column or label_default
        else:
            text, label_spec = cls._headerless(len(first), options, path)
        label = _indices(label_spec, names if header else [], path) if label_spec else None
        if label is not None and len(label) != 1:
            raise DatasetError(f"--label-column names one column, got {label_spec!r}")
        return cls(header, text, label[0] if label else None)

    @staticmethod
    def _headerless(width: int, options: ReadOptions, path: Path) -> tuple[tuple[int, ...], str | None]:
        if options.text_column:
            return _indices(options.text_column, [], path), options.label_column
        layouts = {2: ("1", "0"), 3: ("1,2", "0")}  # SMSSpamCollection; AG News
        if width not in layouts:
            raise DatasetError(
                f"{path} has {width} columns and no header naming a text column: pass --text-column "
                "(and --label-column), as names or 0-based indices"
            )
        text, label = layouts[width]
        return _indices(text, [], path), options.label_column or label

    def row(self, cells: list[str]) -> Row:
        needed = max(self.text + ((self.label,) if self.label is not None else ()))
        if len(cells) <= needed:
            raise _BadLine(f"{len(cells)} field(s), the text/label columns need {needed + 1}")
        record: dict[str, Any] = {"text": " ".join(cells[i] for i in self.text).strip()}
        if self.label is not None:
            label = cells[self.label].strip()
            if not label:
                raise _BadLine("empty label")
            record["label"] = label
        return Row(None, from_dict(record).to_dict(), None)


def _indices(spec: str, names: list[str], path: Path) -> tuple[int, ...]:
    out = []
    for part in (p.strip() for p in spec.split(",")):
        if part.lower() in names:
            out.append(names.index(part.lower()))
        elif part.isdigit():
            out.append(int(part))
        else:
            shown = ", ".join(names) if names else "no header"
            raise DatasetError(f"{path}: no column {part!r} (columns: {shown}); pass --text-column/--label-column")
    return tuple(out)
