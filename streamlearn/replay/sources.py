"""Where replayed records come from: a log file or a Kafka range, in a deterministic order.

Every source yields :class:`Item` s: a validated :class:`~streamlearn.records.Record`, or
the reason why a line / message / object could not become one (never skipped silently:
the runner counts and reports each reason). ``origin`` says where the item was read
(``FILE:LINE``, ``FILE#N`` for the N-th msgpack object, ``topic:partition@offset``).

- :class:`FileSource`: JSON lines, CSV/TSV and MovieLens through the same
  :class:`~streamlearn.datasets.DatasetReader` as ``streamlearn produce``, plus
  ``msgpack``: a stream of concatenated msgpack maps (the message values of a topic dump).
- :class:`KafkaSource`: a topic over an offset range per partition, or a time range turned
  into offsets with ``offsets_for_times``. Partitions are merged by (Kafka timestamp,
  partition, offset), which does not depend on how the broker batches fetches, so the
  same range replays in the same order every time.

Range ends are taken from the fetch responses' high watermark as well as from ListOffsets,
and ``offsets_for_times`` answers are used as lower bounds refined by the records'
timestamps: some Kafka-compatible brokers (the embedded Tansu) answer ListOffsets per
record *batch* (the end of a 40-record batch comes back as 1; a time lookup as the batch's
base offset), which would otherwise cut a range short.
"""
from __future__ import annotations

import re
import time
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Iterator

import msgpack

from ..broker import BrokerError, client_options, topic_partitions
from ..config import KafkaConfig
from ..datasets import FORMATS as DATASET_FORMATS
from ..datasets import DatasetError, DatasetReader, ReadOptions, detect_format, file_problem, is_msgpack_name
from ..exceptions import RecordError, StreamlearnError
from ..records import Record, decode, from_dict

__all__ = ["FILE_FORMATS", "FileSource", "Item", "KafkaRange", "KafkaSource", "ReplaySourceError",
           "first_records", "parse_offsets", "parse_time"]

FILE_FORMATS = (*DATASET_FORMATS, "msgpack")
_NOT_A_MAP = "invalid-msgpack: expected a map"
_MAX_NON_MAPS = 8  # objects in a row that are not maps: the file is not a msgpack stream of records
_MAX_BUFFERED = 2_000  # per partition, while merging partitions in timestamp order


class ReplaySourceError(StreamlearnError):
    """The replay source cannot be read: a missing file or topic, a bad range."""


@dataclass(frozen=True)
class Item:
    record: Record | None  # None: ``error`` says why
    error: str | None
    origin: str


# ---------------------------------------------------------------------------- files

class FileSource:
    """Records of a dataset file. ``format``: one of :data:`FILE_FORMATS` (None: detected,
    ``msgpack`` from a ``.msgpack`` / ``.mpk`` suffix)."""

    kind = "file"

    def __init__(self, path: str | Path, options: ReadOptions = ReadOptions()):
        self.path = Path(path)
        problem = file_problem(self.path)
        if problem:
            raise ReplaySourceError(f"{problem} (--file)")
        fmt = options.format
        if fmt is None:  # the error for an undetectable file names msgpack too
            fmt = "msgpack" if is_msgpack_name(self.path) else detect_format(self.path, also=("msgpack",))
        if fmt is not None and fmt not in FILE_FORMATS:
            raise ReplaySourceError(f"unknown input format {fmt!r}; choose one of {', '.join(FILE_FORMATS)}")
        self.format = fmt
        self.max_bytes = options.max_line_bytes  # msgpack: a larger object is too-large (None: no limit)
        self._reader = None
        if fmt != "msgpack":  # bad lines are counted, not fatal: replay reports them
            opts = replace(options, format=fmt, skip_bad_lines=True)
            self._reader = DatasetReader(self.path, opts)
            self.format = self._reader.format

    def describe(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": self.kind, "path": str(self.path), "format": self.format}
        if self._reader is not None and self._reader.layout:
            out["layout"] = self._reader.layout
        if self._reader is not None and self._reader.notes.lines():
            out["notes"] = self._reader.notes.lines()
        return out

    def preview(self) -> str:
        """The format, layout and first record, as ``produce`` shows them."""
        if self._reader is None:
            return f"reading {self.path} as msgpack"
        return self._reader.preview()

    def estimate(self) -> int | None:
        return self._reader.estimate_rows() if self._reader is not None else None

    def __iter__(self) -> Iterator[Item]:
        return self._msgpack() if self._reader is None else self._dataset()

    def _dataset(self) -> Iterator[Item]:
        reader, seen_bad = self._reader, 0
        for row in reader:
            # The reader collects bad lines as it passes them: emit them in stream order.
            yield from self._bad_lines(seen_bad)
            seen_bad = len(reader.bad_lines)
            where = self.path.name if reader.line is None else f"{self.path.name}:{reader.line}"
            yield Item(from_dict(row.record), None, where)
        yield from self._bad_lines(seen_bad)

    def _bad_lines(self, start: int) -> Iterator[Item]:
        for lineno, reason in self._reader.bad_lines[start:]:
            yield Item(None, reason, f"{self.path.name}:{lineno}")

    def _msgpack(self) -> Iterator[Item]:
        try:
            yield from _stop_at_non_maps(self._msgpack_items())
        except OSError as exc:  # EIO, permission denied: one line, as DatasetReader has it
            raise DatasetError(f"cannot read {self.path}: {exc.strerror or exc}") from exc

    def _msgpack_items(self) -> Iterator[Item]:
        with self.path.open("rb") as f:
            # Maps are built by _map, so a map with an unhashable key (a list) is one bad
            # object instead of a TypeError that leaves the unpacker mid-object.
            unpacker = msgpack.Unpacker(f, raw=False, strict_map_key=False, max_buffer_size=64 << 20,
                                        object_pairs_hook=_map, list_hook=_list)
            n = 0
            while True:
                start = unpacker.tell()
                try:
                    obj = next(unpacker)
                except StopIteration:
                    break
                except (ValueError, msgpack.UnpackException) as exc:
                    # A corrupt byte stream has no record boundaries left to resync on.
                    yield Item(None, f"invalid-msgpack: at byte {start}: {str(exc)[:100] or type(exc).__name__}; the rest of the "
                               "file cannot be split into records", f"{self.path.name}#{n}")
                    return
                size = unpacker.tell() - start
                if self.max_bytes is not None and size > self.max_bytes:  # as the worker refuses it
                    yield Item(None, f"too-large: {size} > {self.max_bytes} bytes (worker.max_record_bytes)",
                               f"{self.path.name}#{n}")
                else:
                    yield self._msgpack_item(obj, f"{self.path.name}#{n}")
                n += 1
            size = self.path.stat().st_size
            if unpacker.tell() < size:
                yield Item(None, f"truncated-msgpack: the file ends inside an object at byte {unpacker.tell()} "
                           f"of {size}", f"{self.path.name}#{n}")

    @staticmethod
    def _msgpack_item(obj: Any, origin: str) -> Item:
        if isinstance(obj, _UnhashableKeys):
            return Item(None, f"invalid-msgpack: a map key is unhashable ({obj.why})", origin)
        if not isinstance(obj, dict):
            return Item(None, f"{_NOT_A_MAP}, got {type(obj).__name__}", origin)
        try:
            return Item(from_dict(obj), None, origin)
        except RecordError as exc:
            return Item(None, str(exc), origin)


def _stop_at_non_maps(items: Iterator[Item]) -> Iterator[Item]:
    """``items``, but a run of :data:`_MAX_NON_MAPS` objects that are not maps ends the
    stream with one bad record: a text or JSON file read as msgpack is a run of small ints
    (every ASCII byte is one), which was one bad record per byte."""
    held: list[Item] = []
    for item in items:
        if item.error is not None and item.error.startswith(_NOT_A_MAP):
            held.append(item)
            if len(held) == _MAX_NON_MAPS:
                yield Item(None, f"invalid-msgpack: {len(held)} objects in a row from {held[0].origin} are not maps: "
                           "not a stream of msgpack maps (a text or JSON file? pass --input-format); the rest "
                           "of the file is not read", held[0].origin)
                return
            continue
        yield from held
        held = []
        yield item
    yield from held


class _UnhashableKeys:
    """A msgpack map whose keys cannot be dict keys (a list, a map)."""

    def __init__(self, why: str):
        self.why = why

    def __repr__(self) -> str:
        return f"<map with unhashable keys: {self.why}>"


def _map(pairs: list[tuple[Any, Any]]) -> dict[Any, Any] | _UnhashableKeys:
    """A map, or the :class:`_UnhashableKeys` of its own keys or of a map nested in its
    values, so the record says why it is bad instead of a wrong type of a field."""
    try:
        obj = dict(pairs)
    except TypeError as exc:
        return _UnhashableKeys(str(exc))
    return next((v for _, v in pairs if isinstance(v, _UnhashableKeys)), obj)


def _list(items: list[Any]) -> list[Any] | _UnhashableKeys:
    """A list, or the :class:`_UnhashableKeys` of a map inside it (msgpack's list hook)."""
    return next((v for v in items if isinstance(v, _UnhashableKeys)), items)


# ---------------------------------------------------------------------------- kafka ranges

@dataclass(frozen=True)
class KafkaRange:
    """What to read. Offsets: ``{partition: offset}``, or one int for every partition;
    ``end`` is exclusive. Times: ms since the epoch, each mapped to the first offset whose
    timestamp is >= it. Unset bounds: the beginning / the end as of the replay's start."""

    topic: str
    start: dict[int, int] | int | None = None
    end: dict[int, int] | int | None = None
    start_ms: int | None = None
    end_ms: int | None = None
    partitions: tuple[int, ...] | None = None  # None: all

    def __post_init__(self) -> None:
        if (self.start is not None or self.end is not None) and (self.start_ms is not None or self.end_ms is not None):
            raise ReplaySourceError("give an offset range or a time range, not both")
        if self.start_ms is not None and self.end_ms is not None and self.start_ms > self.end_ms:
            raise ReplaySourceError(f"the time range is inverted: --start-time ({_iso(self.start_ms)}) is after "
                                    f"--end-time ({_iso(self.end_ms)})")
        inverted = _inverted(self.start, self.end)
        if inverted is not None:  # was: accepted, a note per partition (or nothing at all) and exit 0
            where, start, end = inverted
            raise ReplaySourceError(f"the offset range is inverted{where}: --start-offset {start} is after "
                                    f"--end-offset {end} (the end is exclusive)")


@dataclass
class _Partition:
    partition: int
    start: int
    end: int
    start_ms: int | None = None  # skip records before the first one at or after start_ms
    end_ms: int | None = None  # stop at the first record at or after end_ms
    buffer: list = field(default_factory=list)  # fetched, not yet merged
    done: bool = False
    started: bool = False  # a record at or after start_ms was fetched: take every later one
    begin: int | None = None  # the offset of the first record in the range (found by take)
    first: int | None = None  # offsets actually replayed (handed on): [first, last]
    last: int | None = None

    def take(self, msgs: list) -> None:
        """Buffer the fetched messages that fall in the range."""
        for m in msgs:
            if self.done or m.offset >= self.end:
                return
            if m.offset < self.start:
                continue
            if not self.started and self.start_ms is not None and m.timestamp < self.start_ms:
                continue
            if self.end_ms is not None and m.timestamp >= self.end_ms:
                self.end, self.done = m.offset, True
                self.begin = m.offset if self.begin is None else self.begin
                return
            if not self.started:
                self.started, self.begin = True, m.offset
            self.buffer.append(m)

    def pop(self) -> Any:
        """The head of the buffer, counted as replayed (a replay cut short by ``--limit``
        reports what it read, not what was fetched ahead)."""
        m = self.buffer.pop(0)
        self.first = m.offset if self.first is None else self.first
        self.last = m.offset
        return m


class KafkaSource:
    """A topic's records over a :class:`KafkaRange` (see the module docstring).

    Uses a consumer with manually assigned partitions (no group, nothing committed), so a
    replay never disturbs the workers' group offsets. ``security``: the ``[kafka]`` TLS /
    SASL options of every client it builds (None: PLAINTEXT).
    """

    kind = "kafka"

    def __init__(self, bootstrap: str, rng: KafkaRange, max_bytes: int = 1_000_000, timeout_s: float = 10.0,
                 security: KafkaConfig | None = None):
        self.bootstrap, self.range, self.max_bytes, self.timeout_s = bootstrap, rng, max_bytes, timeout_s
        self.security = security
        try:  # the admin API: a metadata request would auto-create a missing topic on Tansu
            n = topic_partitions(bootstrap, rng.topic, timeout_s, security)
        except BrokerError as exc:
            raise ReplaySourceError(str(exc)) from exc
        parts = rng.partitions if rng.partitions is not None else tuple(range(n))
        bad = [p for p in parts if not 0 <= p < n]
        if bad:
            raise ReplaySourceError(f"topic {rng.topic!r} has partitions 0..{n - 1}; no partition {bad[0]}")
        for option, spec in (("--start-offset", rng.start), ("--end-offset", rng.end)):
            named = sorted(spec) if isinstance(spec, dict) else []
            outside = [p for p in named if p not in parts]
            if outside:  # was: ignored, and the whole topic replayed
                raise ReplaySourceError(f"{option} names partition {outside[0]}, which this replay does not read "
                                        f"(topic {rng.topic!r}: partitions "
                                        f"{', '.join(map(str, sorted(parts))) or 'none'})")
        self.partitions = tuple(sorted(parts))
        self._bounds: dict[int, tuple[int, int]] | None = None
        self._found: dict[int, tuple[int, int]] | None = None  # a time range's offsets, as the last pass found them
        self.notes: list[str] = []
        self.replayed: dict[int, list[int]] = {}  # partition -> [first, last] offset of the last pass

    def describe(self) -> dict[str, Any]:
        """``offsets``: per partition, the range ``[start, end)`` selected. A time range's is
        found by reading (its first record at or after ``start_ms``, its first at or after
        ``end_ms`` or the log's end); before any pass, or where a pass cut short by a limit
        did not get there, the estimates of :meth:`bounds` stand. ``replayed``: the
        ``[first, last]`` offsets the last pass read."""
        offsets = self.bounds() if self._found is None else self._found
        protocol = (self.security or KafkaConfig()).security_protocol
        return {"kind": self.kind, "bootstrap": self.bootstrap, "security_protocol": protocol,
                "topic": self.range.topic,
                "offsets": {str(p): [s, e] for p, (s, e) in offsets.items()},
                "start_ms": self.range.start_ms, "end_ms": self.range.end_ms,
                "replayed": {str(p): fl for p, fl in self.replayed.items()}, "notes": list(self.notes)}

    def estimate(self) -> int | None:
        """Records in the range (None: unknown before reading, where ``--end-time`` is set:
        the broker cannot tell the offset of the first record at or after a time exactly,
        and a total from the log's end overstated the range)."""
        if self.range.end_ms is not None:
            return None
        return sum(max(0, e - s) for s, e in self.bounds().values())

    def bounds(self) -> dict[int, tuple[int, int]]:
        """``{partition: (start, end)}`` resolved against the broker (once)."""
        if self._bounds is None:
            consumer = self._consumer()
            try:
                self._bounds = self._resolve(consumer)
            finally:
                consumer.close()
        return self._bounds

    def _consumer(self) -> Any:
        from kafka import KafkaConsumer
        from kafka.errors import KafkaError

        ms = int(self.timeout_s * 1000)
        options = client_options(self.security)
        try:  # a TLS listener answered: the constructor's topic_partitions checked it (check_tls_answers)
            return KafkaConsumer(bootstrap_servers=self.bootstrap, group_id=None, enable_auto_commit=False,
                                 auto_offset_reset="earliest", bootstrap_timeout_ms=ms, request_timeout_ms=ms + 1000,
                                 allow_auto_create_topics=False, fetch_max_bytes=max(52_428_800, self.max_bytes),
                                 max_partition_fetch_bytes=max(1_048_576, self.max_bytes + 65_536), **options)
        except (KafkaError, OSError, ValueError) as exc:
            raise ReplaySourceError(f"cannot reach a Kafka broker at {self.bootstrap}: {exc}; check --bootstrap "
                                    "and the [kafka] security settings") from exc

    def _tps(self) -> list:
        from kafka import TopicPartition

        return [TopicPartition(self.range.topic, p) for p in self.partitions]

    def _resolve(self, consumer: Any) -> dict[int, tuple[int, int]]:
        tps = self._tps()
        low = consumer.beginning_offsets(tps)
        high = self._latest(consumer, tps, low)
        r = self.range
        starts = self._times(consumer, tps, r.start_ms, high) if r.start_ms is not None else _per_partition(r.start, low)
        ends = {tp.partition: high[tp] for tp in tps} if r.end_ms is not None else _per_partition(r.end, high)
        out = {}
        for tp in tps:
            lo, hi = low[tp], high[tp]
            start, end = starts[tp.partition], ends[tp.partition]
            if start > end:  # a start and an end both given were refused by KafkaRange
                given = r.end is not None and (isinstance(r.end, int) or tp.partition in r.end)
                what = f"end offset {end}" if given else f"the log's end ({end})"  # was: "end offset", never given
                self.notes.append(f"partition {tp.partition}: start offset {start} is after {what}: "
                                  "nothing to replay there")
            elif start < lo or start > hi or end > hi:
                self.notes.append(f"partition {tp.partition}: range [{start}, {end}) clamped to the "
                                  f"available offsets [{lo}, {hi})")
            start, end = min(max(start, lo), hi), min(max(end, lo), hi)
            out[tp.partition] = (start, max(start, end))
        return out

    def _latest(self, consumer: Any, tps: list, low: dict) -> dict:
        """Each partition's end offset: the larger of ListOffsets and the high watermark of
        a fetch response (see the module docstring)."""
        listed = consumer.end_offsets(tps)
        consumer.assign(tps)
        for tp in tps:
            consumer.seek(tp, low[tp])
        deadline = time.monotonic() + self.timeout_s
        while any(consumer.highwater(tp) is None for tp in tps) and time.monotonic() < deadline:
            consumer.poll(timeout_ms=200, max_records=1)
        return {tp: max(listed[tp], consumer.highwater(tp) or 0) for tp in tps}

    @staticmethod
    def _times(consumer: Any, tps: list, ms: int, high: dict) -> dict[int, int]:
        found = consumer.offsets_for_times({tp: ms for tp in tps})
        # No record at or after ms: the range bound is the partition's end.
        return {tp.partition: (found[tp].offset if found.get(tp) is not None else high[tp]) for tp in tps}

    def __iter__(self) -> Iterator[Item]:
        bounds, r = self.bounds(), self.range
        parts = {p: _Partition(p, s, e, r.start_ms, r.end_ms, done=s >= e) for p, (s, e) in bounds.items()}
        self.replayed = {}
        if not all(part.done for part in parts.values()):
            consumer = self._consumer()
            try:
                yield from self._merge(consumer, parts)
            finally:
                consumer.close()
                self.replayed = {p: [part.first, part.last] for p, part in parts.items() if part.first is not None}
                self._found = self._time_range_found(parts)
        self._found = self._time_range_found(parts)
        if not self.replayed:
            self._note_nothing_in_time_range()

    def _time_range_found(self, parts: dict[int, _Partition]) -> dict[int, tuple[int, int]] | None:
        """A time range's ``[start, end)`` per partition as the pass found it (None: an offset range)."""
        if self.range.start_ms is None and self.range.end_ms is None:
            return None
        return {p: (part.begin if part.begin is not None else part.end if part.done else part.start, part.end)
                for p, part in parts.items()}

    def _note_nothing_in_time_range(self) -> None:
        """A whole pass over a time range found no record in it (was: 0 records, no word why)."""
        r = self.range
        if r.start_ms is None and r.end_ms is None:
            return
        if r.end_ms is None:
            where = f"at or after {_iso(r.start_ms)}"
        elif r.start_ms is None:
            where = f"before {_iso(r.end_ms)}"
        else:
            where = f"in the time range [{_iso(r.start_ms)}, {_iso(r.end_ms)})"
        note = f"topic {r.topic!r} holds no record {where} (Kafka timestamps): nothing replayed"
        if note not in self.notes:
            self.notes.append(note)

    def _merge(self, consumer: Any, parts: dict[int, _Partition]) -> Iterator[Item]:
        """Emit messages in (timestamp, partition, offset) order: a message is emitted only
        while every unfinished partition has a buffered head to compare it with."""
        from kafka import TopicPartition

        tps = {p: TopicPartition(self.range.topic, p) for p in parts}
        consumer.assign([tps[p] for p in parts if not parts[p].done])
        for p, part in parts.items():
            if not part.done:
                consumer.seek(tps[p], part.start)
        while True:
            waiting = [p for p, part in parts.items() if not part.done and not part.buffer]
            if waiting:
                self._fetch(consumer, parts, tps, waiting)
                continue
            live = [part for part in parts.values() if part.buffer]
            if not live:
                return
            _, p, _ = min((part.buffer[0].timestamp, part.partition, part.buffer[0].offset) for part in live)
            yield self._item(parts[p].pop())

    def _fetch(self, consumer: Any, parts: dict[int, _Partition], tps: dict, waiting: list[int]) -> None:
        """Poll until some waiting partition gets records or finishes; a partition that
        holds enough buffered records is paused so the others can catch up."""
        full = [tps[p] for p, part in parts.items() if len(part.buffer) >= _MAX_BUFFERED]
        consumer.pause(*full)
        consumer.resume(*[tps[p] for p in waiting])
        patience = max(30.0, 3 * self.timeout_s)
        deadline = time.monotonic() + patience
        while True:
            for tp, msgs in consumer.poll(timeout_ms=200).items():
                parts[tp.partition].take(msgs)
            for p in waiting:
                part = parts[p]
                if not part.done and consumer.position(tps[p]) >= part.end:
                    part.done = True
                    consumer.pause(tps[p])
            if any(parts[p].buffer or parts[p].done for p in waiting):
                return
            if time.monotonic() > deadline:
                stuck = [p for p in waiting if not parts[p].done]
                raise ReplaySourceError(
                    f"no records from {self.range.topic!r} partition(s) {stuck} at {self.bootstrap} for "
                    f"{patience:.0f} s although the range is not finished: is the broker up?")

    def _item(self, msg: Any) -> Item:
        origin = f"{msg.topic}:{msg.partition}@{msg.offset}"
        try:
            return Item(decode(msg.value, self.max_bytes), None, origin)
        except RecordError as exc:
            return Item(None, str(exc), origin)


def first_records(source: FileSource | KafkaSource, n: int = 20, scan: int = 200) -> list[Record]:
    """Up to ``n`` valid records among the first ``scan`` items of a pass over ``source``
    (a peek: the pass is closed, and the next one starts from the range's start again)."""
    import contextlib
    import itertools

    with contextlib.closing(iter(source)) as items:  # a Kafka source's consumer closes with it
        records = (item.record for item in itertools.islice(items, scan) if item.record is not None)
        return list(itertools.islice(records, n))


def _per_partition(spec: dict[int, int] | int | None, default: dict) -> dict[int, int]:
    out = {tp.partition: off for tp, off in default.items()}
    if isinstance(spec, int):
        return {p: spec for p in out}
    for p, off in (spec or {}).items():
        out[p] = off
    return out


# ---------------------------------------------------------------------------- CLI parsing

def parse_offsets(spec: str) -> dict[int, int] | int:
    """``"120"`` (every partition) or ``"0:120,1:80"`` (per partition); a partition named
    twice is an error (was: the last one silently won).

    >>> parse_offsets("120"), parse_offsets("0:5,2:7")
    (120, {0: 5, 2: 7})
    """
    spec = spec.strip()
    try:
        if ":" not in spec:
            return _offset(int(spec))
        out = {}
        for part in spec.split(","):
            p, _, off = part.partition(":")
            partition = int(p)
            if partition in out:
                raise ReplaySourceError(f"offset {spec!r} names partition {partition} twice: give each partition once")
            out[partition] = _offset(int(off))
        return out
    except ValueError as exc:
        raise ReplaySourceError(f"offset {spec!r}: use N (every partition) or P:N,P:N with integers "
                                f"0 to {MAX_MS}") from exc


def _offset(n: int) -> int:
    if not 0 <= n <= MAX_MS:  # Kafka's offsets are int64 too
        raise ValueError(n)
    return n


def _inverted(start: dict[int, int] | int | None, end: dict[int, int] | int | None) -> tuple[str, str, str] | None:
    """``(where, start, end)`` of the first partition whose given start is after its given
    end (an int applies to every partition), as the user wrote them; None if none is."""
    if start is None or end is None:
        return None
    if isinstance(start, int) and isinstance(end, int):
        return ("", str(start), str(end)) if start > end else None
    named = set(start) & set(end) if isinstance(start, dict) and isinstance(end, dict) else \
        set(start if isinstance(start, dict) else end)
    for p in sorted(named):
        a, b = (spec if isinstance(spec, int) else spec[p] for spec in (start, end))
        if a > b:
            return (f" for partition {p}", *(str(spec) if isinstance(spec, int) else f"{p}:{spec[p]}"
                                             for spec in (start, end)))
    return None


MAX_MS = 2**63 - 1  # Kafka timestamps (and offsets) are int64


def parse_time(text: str) -> int:
    """ms since the epoch, from an integer (ms) or an ISO 8601 time (UTC unless it says),
    exactly (was: through a float, and 2004-03-15T07:55:47.472Z read 1 ms early); from 0
    (1970-01-01T00:00:00Z) to 2**63 - 1, the range of a Kafka timestamp.

    >>> parse_time("1700000000000"), parse_time("1970-01-01T00:00:01Z"), parse_time("2004-03-15T07:55:47.472Z")
    (1700000000000, 1000, 1079337347472)
    """
    text = text.strip()
    if re.fullmatch(r"[+-]?[0-9]+", text):
        ms = int(text)
    else:
        try:
            when = datetime.fromisoformat(text.replace("Z", "+00:00"))
        except ValueError as exc:
            raise ReplaySourceError(f"time {text!r}: use ms since the epoch or ISO 8601 "
                                    "(2024-05-01T12:00:00Z)") from exc
        if when.tzinfo is None:
            when = when.replace(tzinfo=timezone.utc)
        ms = (when - _EPOCH) // timedelta(milliseconds=1)
    if not 0 <= ms <= MAX_MS:  # was: a traceback from kafka-python (a negative time, struct.error)
        raise ReplaySourceError(f"time {text!r} is out of range: Kafka timestamps run from 1970-01-01T00:00:00Z "
                                f"(0 ms) to {MAX_MS} ms")
    return ms


_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


def _iso(ms: int) -> str:
    """``ms`` since the epoch as ISO 8601 UTC, to the ms (past year 9999: the number)."""
    try:
        return (_EPOCH + timedelta(milliseconds=ms)).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    except OverflowError:
        return f"{ms} ms"
