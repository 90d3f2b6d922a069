"""Dataset files -> stream rows ``(key, record, ts_ms)`` for ``streamlearn produce``.

Formats (autodetected from the file name and first line; ``--input-format`` overrides):

- ``jsonl``: one JSON object per line, already a record (``text``/``tokens``/``label``/
  ``key``/``item``/``ts``/``weight``);
- ``csv`` / ``tsv``: a text column and an optional label column, chosen by
  ``text_column`` / ``label_column`` (a header name or a 0-based index; ``"1,2"`` joins
  several columns with a space) or else by the rules of :data:`COLUMN_RULES` (the same
  text is in ``streamlearn produce --help`` and docs/quickstart.md): a first row is a
  header when it names a column asked for or a known column name (``text``, ``message``,
  ``review``, ``label``, ``category``, ...), or when its cells are short names above
  wordy data; the label column is the one short column whose values repeat, the text is
  every other non-numeric wordy column, joined in order. When that cannot be decided the
  read stops and asks for ``--text-column`` / ``--label-column``, listing the columns.
  TSV is split on tabs with no quoting; CSV follows RFC 4180 quoting. :attr:`DatasetReader.layout`
  says what was decided, :attr:`DatasetReader.notes` counts blank lines, extra columns and
  records that span several lines (a stray quote merges lines);
- ``movielens``: ``u.data`` (``user<TAB>item<TAB>rating<TAB>unix seconds``), and
  ``movielens-csv``: ``ratings.csv`` (header ``userId,movieId,rating,timestamp``). Both
  become next-item events ``{"key": user, "item": movie, "ts": ms}`` keyed by the user, in
  time order (stable sort, so ties keep file order);
- ``text``: plain running text (a book, a log of messages; ``.txt`` files whose first
  line has no tab): a token stream whose words, in file order and across line breaks,
  are cut into records ``{"text": ...}`` of :data:`TEXT_WORDS` words (the last one
  shorter), for the token tasks (``next-token``, ``mlm``). Each Han ideograph and kana
  character counts as a word (Chinese and Japanese put no space between words, and the
  tokenizer reads each as a token: ``hashing.scripts``), and so does each run of other
  characters between them; a record may then end inside a space-separated word.

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
import itertools
import json
import re
from array import array
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, BinaryIO, Iterable, Iterator, NamedTuple

import numpy as np

from .exceptions import RecordError, StreamlearnError
from .hashing import has_split_chars, split_pieces
from .records import encode, from_dict

FORMATS = ("jsonl", "csv", "tsv", "movielens", "movielens-csv", "text")
MSGPACK_SUFFIXES = (".msgpack", ".mpk", ".msgpack-stream")  # see is_msgpack_name
# ``text`` files: words per record (the token tasks cut each record to hashing.max_tokens
# tokens, 128 by default, and punctuation marks are tokens: 32 words stay within it)
TEXT_WORDS = 32
_MOVIELENS_LINE = re.compile(r"\d+\t\d+\t\d+(\.\d+)?\t\d+")
_MOVIELENS_CSV_HEADER = ["userid", "movieid", "rating", "timestamp"]
# Column names read as a header (lowercased), and the role they give their column.
TEXT_NAMES = ("text", "message", "msg", "sms", "sentence", "review", "content", "body", "comment", "tweet",
              "document", "doc", "title", "description", "headline", "question", "utterance", "query")
LABEL_NAMES = ("label", "labels", "category", "class", "sentiment", "target", "tag", "topic", "polarity",
               "intent", "stars", "rating", "score", "y")
_CSV_FIELD_LIMIT = 1 << 26  # bytes of one CSV field when no max_line_bytes is given (csv's default: 128 KiB)
_PREVIEW_CHARS = 200  # of the first record, in preview()
_SAMPLE_ROWS = 1000  # rows read ahead to decide a headerless or unnamed layout
COLUMN_RULES = """CSV/TSV columns. --text-column/--label-column (names or 0-based indices; 'a,b' joins
columns with a space) always win. Otherwise:
1. The first row is a header when it names a column you asked for or a known column
   (text: text, message, sms, sentence, review, content, body, comment, tweet, title,
   description, ...; label: label, category, class, sentiment, target, topic, polarity,
   ...), or when every cell of it is a short name (at most 3 words) over data whose
   text has 3 or more words.
2. A header's known names decide: the text is every text-named column, joined in order;
   the label is the label-named one.
3. Otherwise the first 1,000 rows decide: the label is the one short column (at most 3
   words a cell) whose values repeat; the text is every other column of 2 or more words a
   cell, joined in order (numbers and ids are left out); the number of cells most rows
   have is the table's width. Ties, no such columns or rows of no common width: the
   command stops and asks for --text-column/--label-column, listing the columns.
Blank lines, rows with extra columns (extra cells ignored) and records that span several
lines (quoted line breaks; a stray quote merges lines) are counted and reported."""
_UTF8_BOM = b"\xef\xbb\xbf"
_SNIFF_BYTES = 1 << 16  # bytes read to tell the line endings
_TAB_SAMPLE = 20  # first lines that tell a .txt table from running text
_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1
_MAX_SECONDS = _INT64_MAX // 1000  # the ms timestamp must fit Kafka's int64


class DatasetError(StreamlearnError):
    """A dataset file cannot be read: unknown format, missing column, or a bad line."""


class TokenStreamQuestion(DatasetError):
    """A file of running text (or unlabelled text records): a token stream, for task
    next-token or mlm; which one, the file cannot say."""


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
    max_line_bytes: int | None = None  # jsonl/csv/tsv: a longer line or CSV field is bad, too-large (None: no
    # limit on a line; a CSV field stops at 64 MiB)
    labels: bool = False  # csv/tsv: a label column is needed (classify): a table without one is refused


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

def detect_format(path: str | Path, also: tuple[str, ...] = ()) -> str:
    """The format of ``path`` from its name, else from its first non-blank line. ``also``:
    further formats the caller reads (replay: msgpack), named when none can be told."""
    path = Path(path)
    name = path.name.lower()
    if name.endswith((".jsonl", ".ndjson", ".json")):
        return "jsonl"
    if name == "u.data":
        return "movielens"
    head = _first_lines(path, _TAB_SAMPLE)  # one read of the head for every rule below
    first = head[0] if head else ""
    if name.endswith(".txt") and not _tab_table(head):
        return "text"
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
    raise DatasetError(f"cannot tell the format of {path}: pass --input-format, one of {', '.join(FORMATS + also)}")


def file_problem(path: Path) -> str | None:
    """Why ``path`` cannot be read as a dataset file (missing, a directory, a FIFO), or None."""
    if not path.exists():
        return f"no such file: {path}"
    if not path.is_file():
        return f"not a regular file: {path}"
    return None


def _refuse_utf16(path: Path) -> None:
    """A UTF-16 file (its byte order mark) as one line, not records of NUL-laden garbage."""
    with _reading(path), path.open("rb") as f:
        head = f.read(2)
    if head in (b"\xff\xfe", b"\xfe\xff"):
        raise DatasetError(f"{path} is UTF-16: convert it to UTF-8 (iconv -f UTF-16 -t UTF-8 FILE > NEW)")


def _raw_lines(f: BinaryIO) -> Iterator[bytes]:
    """The lines of a binary file, each with its line break, the first without a byte order
    mark. A file whose first 64 KiB hold a CR and no LF has classic-Mac line endings and is
    split on CR (was: read as one line with CRs inside)."""
    head = f.read(_SNIFF_BYTES)
    if b"\r" in head and b"\n" not in head:
        return _without_bom(_cr_lines(head, f))
    f.seek(0)
    return _without_bom(f)


def _cr_lines(head: bytes, f: BinaryIO) -> Iterator[bytes]:
    pending = head
    while True:
        *lines, pending = pending.split(b"\r")
        for line in lines:
            yield line + b"\r"
        chunk = f.read(_SNIFF_BYTES)
        if not chunk:
            break
        pending += chunk
    if pending:
        yield pending


def _without_bom(lines: Iterable[bytes]) -> Iterator[bytes]:
    """The lines of a binary file, the first without a UTF-8 byte order mark (Windows
    editors write one; it is not part of the first cell, key or word)."""
    lines = iter(lines)
    first = next(lines, None)
    if first is None:
        return
    yield first.removeprefix(_UTF8_BOM)
    yield from lines


@contextmanager
def _reading(path: Path) -> Iterator[None]:
    """An OSError while opening or reading ``path`` (EIO, permission denied) as a one-line DatasetError."""
    try:
        yield
    except OSError as exc:
        raise DatasetError(f"cannot read {path}: {exc.strerror or exc}") from exc


def _first_lines(path: Path, n: int) -> list[str]:
    """The first ``n`` non-blank lines of ``path`` (fewer if it has fewer)."""
    lines: list[str] = []
    _refuse_utf16(path)  # sniffing the first lines (the name alone reads nothing)
    with _reading(path), path.open("rb") as f:
        for raw in _raw_lines(f):
            if raw.strip():
                lines.append(raw.decode("utf-8", "replace").rstrip("\r\n"))
                if len(lines) == n:
                    break
    return lines


def _tab_table(lines: list[str]) -> bool:
    """Whether a ``.txt`` file whose first non-blank lines are ``lines`` (:data:`_TAB_SAMPLE`
    of them) is a table of tab-separated columns: each holds the same number of tabs (at
    least one). A book whose title line holds a tab, or whose lines are indented with one,
    is running text."""
    tabs = {line.count("\t") for line in lines}
    return len(tabs) == 1 and tabs != {0} and not any(line.startswith("\t") for line in lines)


def _split_csv_header(line: str) -> list[str]:
    return [cell.strip().lower() for cell in line.split(",")]


def is_msgpack_name(path: str | Path) -> bool:
    """Whether the name says a stream of concatenated msgpack maps (``.msgpack``, ``.mpk``,
    ``.msgpack-stream``): replay reads those; ``produce`` takes the formats above only."""
    return Path(path).name.lower().endswith(MSGPACK_SUFFIXES)


# ---------------------------------------------------------------------------- the task of a file

_TASK_OF_FORMAT = {"csv": "classify", "tsv": "classify", "movielens": "next-item", "movielens-csv": "next-item"}


def task_of(path: str | Path, fmt: str | None = None) -> str:
    """The task a dataset file holds, by its format (``fmt``, or detected): csv/tsv are
    text classification, MovieLens is next-item. A task brings its own defaults
    (``streamlearn.tasks.REGISTRY``), so ``learner.task`` is the only setting it needs.

    >>> task_of("u.data")
    'next-item'
    """
    fmt = fmt or detect_format(path)
    task = _TASK_OF_FORMAT.get(fmt)
    if task is None:
        if fmt == "text":
            raise TokenStreamQuestion(f"{path}: a text file is a token stream; pass --task next-token or --task mlm")
        raise DatasetError(f"{path}: a {fmt} file can hold any task; pass --task (or learner.task)")
    return task


def task_of_records(path: str | Path, fmt: str | None = None, sample: int = 20) -> str | None:
    """The task a file says by its format or its first records, for a new model given none:
    MovieLens and JSON lines of ``key``/``item`` are next-item; None where the file does
    not say (tables and msgpack streams are read as classify). Running text, and JSON
    lines of text without labels, raise :class:`DatasetError` asking which token task."""
    if fmt == "msgpack" or (fmt is None and is_msgpack_name(path)) or not Path(path).is_file():
        return None  # the reader says what is wrong with a missing file
    fmt = fmt or detect_format(path, also=("msgpack",))
    if fmt in ("movielens", "movielens-csv", "text"):
        return task_of(path, fmt)
    if fmt != "jsonl":
        return None
    objects = []
    for line in _first_lines(Path(path), sample):
        try:
            obj = json.loads(line)
        except (ValueError, RecursionError):  # the reader reports the line
            continue
        if isinstance(obj, dict):
            objects.append(obj)
    return task_of_fields([set(o) for o in objects], str(path))


def task_of_fields(fields: list[set[str]], where: str) -> str | None:
    """The task a stream's first records say by the fields they hold (a file's JSON lines,
    a topic's records), for a new model given none: ``key`` and ``item`` in every one are
    next-item; None where a record holds a label, or there are none (classify). Text
    without labels raises :class:`TokenStreamQuestion` (which token task?); a mix of
    neither raises :class:`DatasetError` (``where`` names the stream).

    >>> task_of_fields([{"key", "item"}, {"key", "item", "ts"}], "f")
    'next-item'
    """
    if not fields or any("label" in f for f in fields):
        return None
    if all({"key", "item"} <= f for f in fields):
        return "next-item"
    if all("text" in f or "tokens" in f for f in fields):
        raise TokenStreamQuestion(f"{where}: its records hold text without labels, a token stream; pass --task "
                                  "next-token or --task mlm")
    raise DatasetError(f"{where}: its first records hold no labels, and not all of them a key and an item: cannot "
                       "tell the task; pass --task")


# ---------------------------------------------------------------------------- the reader

class DatasetReader:
    """Iterate a dataset file as :class:`Row` s; see the module docstring for the formats."""

    def __init__(self, path: str | Path, options: ReadOptions = ReadOptions()):
        self.path = Path(path)
        problem = file_problem(self.path)
        if problem:
            raise DatasetError(problem)
        _refuse_utf16(self.path)
        self.options = options
        self.format = options.format or detect_format(self.path)
        if self.format not in FORMATS:
            raise DatasetError(f"unknown input format {self.format!r}; choose one of {', '.join(FORMATS)}")
        columns = [flag for flag, spec in (("--text-column", options.text_column),
                                           ("--label-column", options.label_column)) if spec]
        if columns and self.format not in ("csv", "tsv"):  # was: ignored without a word
            raise DatasetError(f"{' and '.join(columns)} {'picks' if len(columns) == 1 else 'pick'} columns of a csv "
                               f"or tsv table; {self.path.name} is read as {self.format}, which has none")
        self.bad_lines: list[tuple[int, str]] = []
        self.layout = ""  # what the reader decided (csv/tsv: the header and the columns), after the first row
        self.notes = ReadNotes()
        self.line: int | None = None  # the line of the row last yielded (its last line, for text; None: MovieLens)
        self._holding, self._held = False, []  # bad lines found while reading ahead, not yet told

    def __iter__(self) -> Iterator[Row]:
        self.bad_lines = []
        self.notes = ReadNotes()
        self.line = None
        self._holding, self._held = False, []
        self._spans: dict[int, int] = {}  # csv: first -> last line of a record of several lines, until read
        readers = {"jsonl": self._jsonl, "csv": self._table, "tsv": self._table,
                   "movielens": self._movielens, "movielens-csv": self._movielens, "text": self._text}
        return readers[self.format]()

    def preview(self) -> str:
        """What a read of this file will give, in two lines: the format and layout (csv/tsv:
        header and columns), then the first record. Reads a fresh pass of the file's first
        rows; the reader itself is not advanced."""
        fresh = DatasetReader(self.path, replace(self.options, format=self.format, skip_bad_lines=True))
        first = next(iter(fresh), None)
        layout = f": {fresh.layout}" if fresh.layout else ""
        shown = "none (no valid record)" if first is None else repr(first.record)
        if len(shown) > _PREVIEW_CHARS:  # was: a 5 MB first record printed in full
            shown = shown[:_PREVIEW_CHARS] + "..."
        return f"reading {self.path} as {self.format}{layout}\nfirst record: {shown}"

    def estimate_rows(self) -> int:
        """Data lines in the file (one pass counting line breaks), for progress bars: exact
        but for blank lines, a CSV/TSV header and CSV fields with quoted line breaks."""
        lines, crs, last = 0, 0, b"\n"
        with _reading(self.path), self.path.open("rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                lines += chunk.count(b"\n")
                crs += chunk.count(b"\r")
                last = chunk[-1:]
        if not lines and crs:  # classic-Mac line endings (see _raw_lines)
            lines, last = crs, last.replace(b"\r", b"\n")
        lines += last != b"\n"  # a last line without a line break
        return max(0, lines - (self.format == "movielens-csv"))

    # ---- shared line handling
    def _lines(self) -> Iterator[tuple[int, str]]:
        """(1-based line number, text without the line break) of each UTF-8 line; where a
        line is a record (not plain text, whose lines are cut into records), a line over
        ``max_line_bytes`` is a bad line, as the worker refuses such a message."""
        limit = self.options.max_line_bytes if self.format in ("jsonl", "csv", "tsv") else None
        with _reading(self.path), self.path.open("rb") as f:
            for lineno, raw in enumerate(_raw_lines(f), 1):
                if limit is not None and len(raw) > limit:
                    self._bad(lineno, f"too-large: {len(raw)} > {limit} bytes (worker.max_record_bytes)")
                    continue
                try:
                    yield lineno, raw.decode("utf-8").rstrip("\r\n")
                except UnicodeDecodeError as exc:
                    self._bad(lineno, f"invalid-utf8: byte 0x{raw[exc.start]:02x} at column {exc.start + 1} is not UTF-8")

    def _bad(self, lineno: int, reason: str) -> None:
        if self._holding:  # reading ahead: told once the read passes the line
            self._held.append((lineno, reason))
            return
        if not self.options.skip_bad_lines:
            raise DatasetError(f"{self.path}:{lineno}: {reason} (--skip-bad-lines counts and skips such lines)")
        self.bad_lines.append((lineno, reason))

    def _guarded(self, numbered: Iterable[tuple[int, Any]], convert) -> Iterator[Any]:
        for lineno, item in numbered:
            try:
                row = convert(item)
            except (_BadLine, RecordError) as exc:
                self._bad(lineno, str(exc))
                continue
            self.line = lineno
            yield row

    def _release(self, before: int | None = None) -> None:
        """Report the bad lines held while reading ahead, in file order: those before line
        ``before`` (None: all)."""
        while self._held and (before is None or self._held[0][0] < before):
            self._bad(*self._held.pop(0))

    # ---- jsonl
    def _jsonl(self) -> Iterator[Row]:
        return self._guarded(self._nonblank(), _jsonl_row)

    def _nonblank(self) -> Iterator[tuple[int, str]]:
        """:meth:`_lines` without the blank ones, which are counted (``notes.blank_lines``)."""
        for n, line in self._lines():
            if line.strip():
                yield n, line
            else:
                self.notes.blank_lines += 1

    # ---- plain text
    def _text(self) -> Iterator[Row]:
        # words: each space-separated word, or (Chinese, Japanese: no spaces) each Han or
        # kana character and each run between them (hashing.split_pieces), as the
        # tokenizer reads them; glued[i]: words[i] continues the word before it, no space
        words: list[str] = []
        glued: list[bool] = []
        lineno = 0
        for lineno, line in self._lines():
            if not has_split_chars(line):
                found = line.split()
                words += found
                glued += [False] * len(found)
            else:
                for word in line.split():
                    pieces = split_pieces(word)
                    words += pieces
                    glued += [False] + [True] * (len(pieces) - 1)
            while len(words) >= TEXT_WORDS:
                yield from self._text_row(lineno, words[:TEXT_WORDS], glued[:TEXT_WORDS])
                del words[:TEXT_WORDS], glued[:TEXT_WORDS]
        if words:
            yield from self._text_row(lineno, words, glued)

    def _text_row(self, lineno: int, words: list[str], glued: list[bool]) -> Iterator[Row]:
        """The record of ``words`` (ending on line ``lineno``; ``glued``: those that continue
        the word before them, joined without a space), or a too-large bad line where its
        encoding is over ``max_line_bytes``, as the worker would refuse the message."""
        if any(glued):
            text = "".join(w if glue or not i else " " + w for i, (w, glue) in enumerate(zip(words, glued)))
        else:
            text = " ".join(words)
        record = {"text": text}
        limit = self.options.max_line_bytes
        if limit is not None and (size := len(encode(record))) > limit:  # msgpack, as produce writes it
            self._bad(lineno, f"too-large: a record of {len(words)} words is {size} > {limit} bytes "
                              "(worker.max_record_bytes)")
            return
        self.line = lineno
        yield Row(None, record, None)

    # ---- csv / tsv
    def _table(self) -> Iterator[Row]:
        rows = self._tsv_rows() if self.format == "tsv" else self._csv_rows()
        # Counted bad lines among the rows read ahead wait until the read passes them, so they
        # are told in file order; without skip_bad_lines the first one stops the read at once,
        # before any record (a produce writes nothing of a file that fails early).
        self._holding = self.options.skip_bad_lines
        sample = list(itertools.islice(rows, _SAMPLE_ROWS + 1))
        self._holding = False
        if not sample:
            self._release()
            return
        columns = _Columns.resolve([cells for _, cells in sample], self.options, self.path)
        self.layout = columns.describe()
        if self.options.labels and columns.label is None:  # was: every row a bad record, exit 0
            raise DatasetError(f"{self.path}: no label column found ({self.layout}), and classify learns from "
                               "labels: pass --label-column (a name or a 0-based index)")
        if columns.header:
            sample = sample[1:]
        self.notes.columns = columns.width
        for lineno, cells in itertools.chain(sample, rows):
            self._release(before=lineno)
            last = self._spans.pop(lineno, lineno)
            if len(cells) > columns.width:
                self.notes.extra_columns.append(lineno)
            try:
                row = columns.row(cells)
            except (_BadLine, RecordError) as exc:  # a bad row of several lines names them all
                span = f" (lines {lineno}-{last} read as one record: a stray quote?)" if last > lineno else ""
                self._bad(lineno, str(exc) + span)
                continue
            self.line = lineno
            yield row
        self._release()

    def _tsv_rows(self) -> Iterator[tuple[int, list[str]]]:
        return ((n, line.split("\t")) for n, line in self._nonblank())

    def _csv_rows(self) -> Iterator[tuple[int, list[str]]]:
        numbered = self._lines()
        starts: list[int] = []

        def text_lines() -> Iterator[str]:
            for lineno, line in numbered:
                starts.append(lineno)
                yield line + "\n"

        reader = csv.reader(text_lines())
        limit = self.options.max_line_bytes or _CSV_FIELD_LIMIT
        while True:
            mark = len(starts)
            csv.field_size_limit(limit)  # process-wide: set before each row, for readers that interleave
            try:
                cells = next(reader)
            except StopIteration:
                return
            except csv.Error as exc:
                self._csv_error(exc, starts[mark] if mark < len(starts) else starts[-1], starts[-1], limit)
                continue
            first, last = starts[mark], starts[-1]
            if last > first:
                self.notes.multiline.append((first, last))
                self._spans[first] = last
            if any(cell.strip() for cell in cells):
                yield first, cells
            else:
                self.notes.blank_lines += 1

    def _csv_error(self, exc: csv.Error, first: int, last: int, limit: int) -> None:
        """A row the csv module refuses, as one bad line that names every line it took:
        a stray quote can merge thousands of lines into one field (noted as multiline)."""
        span = f"lines {first}-{last}" if last > first else f"line {first}"
        if last > first:
            self.notes.multiline.append((first, last))
        if "field limit" in str(exc):
            self._bad(first, f"too-large: a CSV field over {limit} bytes, {span} read as one record "
                             "(an unclosed quote merges lines until the next quote)")
        else:
            self._bad(first, f"bad-value: CSV: {exc} ({span})")

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
        raise _BadLine(f"invalid-json: {str(exc)[:100]}") from exc
    if not isinstance(obj, dict):
        raise _BadLine(f"wrong-type: a JSON line must be an object (a record), got {type(obj).__name__}")
    record = from_dict(obj)
    key = record.key.encode() if record.key is not None else None
    return Row(key, record.to_dict(), record.ts)


def _rating_fields(line: str, sep: str) -> tuple[int, int, int]:
    fields = line.split(sep)
    if len(fields) != 4:
        raise _BadLine(f"bad-value: expected 4 fields user{sep!r}item{sep!r}rating{sep!r}timestamp, got {len(fields)}")
    try:
        user, item, ts = int(fields[0]), int(fields[1]), int(fields[3])
        float(fields[2])
    except ValueError as exc:
        raise _BadLine(f"bad-value: user, item and timestamp must be integers and rating a number: "
                       f"{line[:80]!r}") from exc
    if not 0 <= ts <= _MAX_SECONDS:
        raise _BadLine(f"bad-value: timestamp {ts} is not unix seconds (0 to {_MAX_SECONDS})")
    for name, value in (("user", user), ("item", item)):
        if not _INT64_MIN <= value <= _INT64_MAX:  # the columns are int64 arrays (was: OverflowError)
            raise _BadLine(f"bad-value: {name} {value} does not fit in 64 bits")
    return user, item, ts


# ---------------------------------------------------------------------------- csv/tsv columns

@dataclass
class ReadNotes:
    """What a CSV/TSV read passed over or should be checked, for the caller to report:
    ``blank_lines`` skipped, line numbers of rows with ``extra_columns`` (their extra cells
    are ignored), and records that span several lines (``multiline``: first and last
    line; quoted line breaks, or a stray quote that merged lines)."""

    blank_lines: int = 0
    columns: int = 0  # cells of the layout (the header's, else most rows')
    extra_columns: list[int] = field(default_factory=list)
    multiline: list[tuple[int, int]] = field(default_factory=list)

    def lines(self) -> list[str]:
        """One line per kind of note, empty when there is nothing to say."""
        out = []
        if self.blank_lines:
            out.append(f"{self.blank_lines} blank line(s) skipped")
        if self.extra_columns:
            out.append(f"{len(self.extra_columns)} row(s) with more than {self.columns} columns, extra cells ignored "
                       f"(lines {_some(self.extra_columns)})")
        if self.multiline:
            longest = max(self.multiline, key=lambda span: span[1] - span[0])
            out.append(f"{len(self.multiline)} record(s) span several lines (quoted line breaks; the longest, "
                       f"lines {longest[0]}-{longest[1]}, may be a stray quote merging lines)")
        return out


def _some(lines: list[int], n: int = 5) -> str:
    shown = ", ".join(map(str, lines[:n]))
    return shown + (", ..." if len(lines) > n else "")


@dataclass(frozen=True)
class _Columns:
    header: bool
    text: tuple[int, ...]
    label: int | None
    names: tuple[str, ...]  # the header's names, or "column N"
    width: int  # cells of the header, else of most rows; a wider row's extra cells are ignored
    why: str  # how the layout was decided

    @classmethod
    def resolve(cls, sample: list[list[str]], options: ReadOptions, path: Path) -> "_Columns":
        """The layout of a table from its first rows (see :data:`COLUMN_RULES`); DatasetError
        where the columns chosen cannot give a record (was: every row a bad line)."""
        columns = cls._decide(sample, options, path)
        columns._check(max(len(r) for r in sample), path)
        return columns

    @classmethod
    def _decide(cls, sample: list[list[str]], options: ReadOptions, path: Path) -> "_Columns":
        first = sample[0]
        names = [cell.strip().lower() for cell in first]
        asked = [spec for spec in (options.text_column, options.label_column) if spec]
        by_name = any(not part.strip().isdigit() for spec in asked for part in spec.split(","))
        known = [n for n in names if n in TEXT_NAMES or n in LABEL_NAMES]
        header = by_name or bool(known) or _looks_like_header(first, sample[1:])
        data = sample[1:] if header else sample
        width = len(first) if header else _common_width(sample)
        shown = tuple(first) if header else _column_names((), width)
        if options.text_column:
            text = _indices(options.text_column, names if header else [], path)
            label_spec = options.label_column or (_first_named(names, LABEL_NAMES) if header else None)
            label = _indices(label_spec, names if header else [], path) if label_spec else None
            why = "--text-column/--label-column" if options.label_column else "--text-column"
            return cls._checked(header, text, label, shown, width, why, path)
        if header and known:
            return cls._named(names, shown, options, path)
        text, label, why = _by_content(data, shown, path)
        if options.label_column:
            label = _indices(options.label_column, names if header else [], path)
        return cls._checked(header, text, label, shown, width, why, path)

    @classmethod
    def _named(cls, names: list[str], shown: tuple[str, ...], options: ReadOptions, path: Path) -> "_Columns":
        text = tuple(i for i, n in enumerate(names) if n in TEXT_NAMES)
        if not text:
            raise DatasetError(f"{path}: the header ({', '.join(shown)}) names no text column: pass --text-column "
                               "(a name or a 0-based index)")
        label_spec = options.label_column or _first_named(names, LABEL_NAMES)
        label = _indices(label_spec, names, path) if label_spec else None
        return cls._checked(True, text, label, shown, len(names), "the header's column names", path)

    @classmethod
    def _checked(cls, header: bool, text: tuple[int, ...], label: tuple[int, ...] | None, shown: tuple[str, ...],
                 width: int, why: str, path: Path) -> "_Columns":
        if label is not None and len(label) != 1:
            raise DatasetError(f"--label-column names one column, got {len(label)}")
        return cls(header, text, label[0] if label else None, shown, width, why)

    def _check(self, widest: int, path: Path) -> None:
        """Refuse a column beyond every sampled row, and a label that is also text."""
        names = _column_names(self.names, widest)
        beyond = [i for i in (*self.text, self.label) if i is not None and i >= widest]
        if beyond:
            raise DatasetError(f"{path}: no column {beyond[0]}: the rows have {widest} columns ({', '.join(names)}); "
                               "pass --text-column/--label-column (names or 0-based indices)")
        if self.label in self.text:
            raise DatasetError(f"{path}: --label-column {names[self.label]!r} is also a text column; pass "
                               "another --label-column or --text-column")

    def describe(self) -> str:
        """One line saying what was decided, e.g. for ``produce``'s preview."""
        def name(i: int) -> str:
            return repr(self.names[i]) if i < len(self.names) else f"column {i}"
        text = " + ".join(name(i) for i in self.text)
        label = name(self.label) if self.label is not None else "none"
        return (f"{'a header row' if self.header else 'no header row'}; text: {text}; label: {label} "
                f"(decided by {self.why})")

    def row(self, cells: list[str]) -> Row:
        needed = max(self.text + ((self.label,) if self.label is not None else ()))
        if len(cells) <= needed:
            raise _BadLine(f"missing-field: {len(cells)} field(s), the text/label columns need {needed + 1}")
        record: dict[str, Any] = {"text": " ".join(cells[i] for i in self.text).strip()}
        if self.label is not None:
            label = cells[self.label].strip()
            if not label:
                raise _BadLine("bad-value: empty label")
            record["label"] = label
        return Row(None, from_dict(record).to_dict(), None)


def _first_named(names: list[str], known: tuple[str, ...]) -> str | None:
    return next((n for n in names if n in known), None)


def _words(cell: str) -> int:
    return len(cell.split())


def _is_number(cell: str) -> bool:
    try:
        float(cell)
    except ValueError:
        return False
    return True


def _looks_like_header(first: list[str], data: list[list[str]]) -> bool:
    """Rule 1's last case: every cell of the first row is a short name (at most 3 words,
    not a number) and the data under it is wordy (some column averages >= 3 words)."""
    if not data or any(_words(c) > 3 or _is_number(c.strip()) or not c.strip() for c in first):
        return False
    width = len(first)
    mean_words = [sum(_words(r[i]) for r in data if i < len(r)) / len(data) for i in range(width)]
    return max(mean_words) >= 3 and all(_words(c) < max(mean_words) / 2 for c in first)


def _column_names(names: tuple[str, ...], width: int) -> tuple[str, ...]:
    """``names``, then "column N" for each column past them up to ``width``."""
    return tuple(names) + tuple(f"column {i}" for i in range(len(names), width))


def _common_width(rows: list[list[str]]) -> int:
    """The most common number of cells (ties: the earliest row's). Was: the widest row's,
    so one row with an extra column decided the layout alone and every other row was bad."""
    counts = Counter(len(r) for r in rows)
    return counts.most_common(1)[0][0] if counts else 0


def _by_content(data: list[list[str]], shown: tuple[str, ...], path: Path) -> tuple[tuple[int, ...], tuple[int, ...], str]:
    """Rule 3: the label is the one short column whose values repeat, the text every other
    wordy non-numeric column. DatasetError (asking for the columns) when undecidable."""
    width = _common_width(data)
    widest = max((len(r) for r in data), default=0)
    if 2 * sum(len(r) == width for r in data) < len(data):  # no width holds most rows: prose, not a table
        named = _column_names(shown, widest)
        raise _ask(path, named, data, "rows differ in their number of cells: not a table?")
    shown = _column_names(shown, width)  # most rows wider than the header
    rows = [r[:width] for r in data if len(r) >= width] or data  # a wider row's extra cells are ignored
    n = max(len(rows), 1)
    cols = [[r[i].strip() for r in rows if i < len(r)] for i in range(width)]
    numeric = [bool(c) and sum(map(_is_number, c)) >= 0.9 * len(c) for c in cols]
    words = [sum(map(_words, c)) / max(len(c), 1) for c in cols]
    distinct = [len(set(c)) for c in cols]
    short = [i for i in range(width) if words[i] <= 3 and max(map(len, cols[i]), default=0) <= 40]
    repeats = [i for i in short if distinct[i] < n or n <= 3]  # a label's values repeat (tiny samples: cannot tell)
    ids = {i for i in range(width) if numeric[i] and distinct[i] == n and n > 3}  # a row number, not a label
    labels = sorted((i for i in repeats if i not in ids), key=lambda i: (distinct[i], words[i]))
    text = [i for i in range(width) if words[i] >= 2 and not numeric[i]]
    label = None
    if labels:
        best = labels[0]
        rival = next((i for i in labels[1:] if i not in text), None)
        if rival is not None and distinct[rival] < 2 * distinct[best]:
            raise _ask(path, shown, rows, f"columns {shown[best]!r} and {shown[rival]!r} both look like labels")
        label = best
    text = [i for i in text if i != label]
    if not text:
        raise _ask(path, shown, rows, "no column holds text of 2 or more words a cell")
    if label is None:
        raise _ask(path, shown, rows, "no short column repeats its values as labels do")
    return tuple(text), (label,), "the content of the first rows"


def _ask(path: Path, shown: tuple[str, ...], rows: list[list[str]], why: str) -> DatasetError:
    preview = " | ".join(c[:30] for c in rows[0]) if rows else ""
    return DatasetError(f"{path}: cannot tell the text and label columns ({why}). Columns: {', '.join(shown)}; "
                        f"first row: {preview!r}. Pass --text-column and --label-column (names or 0-based "
                        "indices; see streamlearn produce --help), or --input-format text if the file is "
                        "running text (a token stream)")


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
