"""Records on the stream: decode and validate Kafka message values, encode them.

A message value is a msgpack map or a JSON object, told apart by its first byte (JSON:
``{`` after optional whitespace; msgpack maps: 0x80-0x8f, 0xde, 0xdf). Fields:

- ``text`` (str) or ``tokens`` (non-empty list of str/int) -- unless the record is a
  next-item event, which has ``key`` and ``item`` instead;
- ``label`` (str or int), optional, for classification;
- ``key`` (str; an int is taken as its decimal string, as token ids are) and ``item``
  (str or int) for next-item streams;
- a ``label``, ``key`` or ``item`` string names a class or an id, not text: at most
  :data:`MAX_NAME_CHARS` characters (the service's limit of one token; a 900 KB label
  was once a class, rewritten into every checkpoint);
- ``ts`` (int, event time in ms since the epoch), optional; the worker falls back to the
  Kafka timestamp;
- ``weight`` (a number in (0, :data:`MAX_WEIGHT`]), optional, default 1.0. The bound keeps
  a weighted gradient and its square (the optimizers' accumulators) far inside float32:
  a weight of 1e38 once turned every Adagrad accumulator it reached into inf.

``null`` counts as absent; unknown fields are ignored, so producers can carry extra data.
Every failure raises :class:`RecordError` whose message is the *reason*:
``"<code>: <detail>"`` with one of the codes below (:func:`reason_code` extracts it, for
metrics labels and dead-letter headers):

========================  =======================================================
``empty-value``           empty or null (tombstone) message value
``too-large``             value longer than ``max_bytes``
``not-msgpack-or-json``   first byte is neither a msgpack map nor ``{``
``truncated-msgpack``     the value ends inside the msgpack map
``invalid-msgpack``       trailing bytes, nesting too deep, bad map keys...
``invalid-json``          starts with ``{`` but is not a JSON object
``invalid-utf8``          text bytes that are not UTF-8 (or a lone surrogate)
``missing-field``         none of text / tokens / key+item
``wrong-type``            a field of the wrong type
``bad-value``             right type, unusable value (empty tokens, ts out of range...)
``bad-weight``            weight not a number in (0, MAX_WEIGHT]
========================  =======================================================

>>> rec = decode(encode({"text": "free prize", "label": "spam"}), max_bytes=1000)
>>> rec.text, rec.label, rec.weight
('free prize', 'spam', 1.0)
>>> decode(b'{"label": 1}', max_bytes=1000)
Traceback (most recent call last):
...
streamlearn.exceptions.RecordError: missing-field: text or tokens (or key and item for a next-item record)
"""
from __future__ import annotations

import json
import math
import numbers
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

import msgpack

from .exceptions import RecordError

_JSON_SPACE = b" \t\r\n"
_MSGPACK_MAP_FIRST = frozenset(range(0x80, 0x90)) | {0xDE, 0xDF}
_INT64_MAX = (1 << 63) - 1
MAX_WEIGHT = 1e6  # record weights are in (0, MAX_WEIGHT] (see the module docstring)
# Every reason code a decode or validation failure starts with (the docstring's table).
REASONS = ("empty-value", "too-large", "not-msgpack-or-json", "truncated-msgpack", "invalid-msgpack",
           "invalid-json", "invalid-utf8", "missing-field", "wrong-type", "bad-value", "bad-weight")
FORMATS = ("msgpack", "json")

Token = str | int


@dataclass(frozen=True)
class Record:
    """One validated stream record (see the module docstring for the fields)."""

    text: str | None = None
    tokens: tuple[Token, ...] | None = None
    label: str | int | None = None
    key: str | None = None
    item: str | int | None = None
    ts: int | None = None  # event time, ms since the epoch
    weight: float = 1.0

    @property
    def is_next_item(self) -> bool:
        return self.key is not None and self.item is not None

    def to_dict(self) -> dict[str, Any]:
        """The fields that are set, as :func:`encode` takes them (weight only if not 1)."""
        out: dict[str, Any] = {}
        for name in ("text", "label", "key", "item", "ts"):
            value = getattr(self, name)
            if value is not None:
                out[name] = value
        if self.tokens is not None:
            out["tokens"] = list(self.tokens)
        if self.weight != 1.0:
            out["weight"] = self.weight
        return out


def reason_code(reason: str) -> str:
    """The machine-friendly code at the front of a reason (``"too-large: ..."`` -> ``"too-large"``)."""
    return reason.split(":", 1)[0]


# ---------------------------------------------------------------------------- decoding

def decode(value: bytes | None, max_bytes: int) -> Record:
    """Decode and validate one message value; raise :class:`RecordError` with the reason."""
    return from_dict(parse(value, max_bytes))


def decode_many(
    values: Iterable[bytes | None], max_bytes: int
) -> tuple[list[tuple[int, Record]], list[tuple[int, str]]]:
    """Decode a batch: ``(records, errors)``, ``records`` as ``(index, Record)`` pairs and
    ``errors`` as ``(index, reason)`` pairs, indices into ``values``; every value lands in
    exactly one of the two lists, so the caller can send each error to the dead-letter topic
    and take the Kafka timestamp of each record's message.
    """
    records: list[tuple[int, Record]] = []
    errors: list[tuple[int, str]] = []
    for i, value in enumerate(values):
        try:
            records.append((i, decode(value, max_bytes)))
        except RecordError as exc:
            errors.append((i, str(exc)))
    return records, errors


def parse(value: bytes | None, max_bytes: int) -> dict[Any, Any]:
    """The raw map of a message value (msgpack or JSON), not yet validated."""
    if value is None:
        raise RecordError("empty-value: null message value (a tombstone)")
    if len(value) == 0:
        raise RecordError("empty-value: zero-length message value")
    if len(value) > max_bytes:
        raise RecordError(f"too-large: {len(value)} > {max_bytes} bytes (worker.max_record_bytes)")
    first = value.lstrip(_JSON_SPACE)[:1]
    if first == b"{":
        return _parse_json(value)
    if value[0] in _MSGPACK_MAP_FIRST:
        return _parse_msgpack(value)
    shown = first.hex() or value[:1].hex()
    raise RecordError(f"not-msgpack-or-json: first byte 0x{shown} starts neither a msgpack map nor a JSON object")


def _parse_json(value: bytes) -> dict[Any, Any]:
    try:
        text = value.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise RecordError(f"invalid-utf8: JSON value has a non-UTF-8 byte at offset {exc.start}") from exc
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        raise RecordError(f"invalid-json: {exc.msg} at offset {exc.pos}") from exc
    except (ValueError, RecursionError) as exc:  # int digit limit, nesting depth
        raise RecordError(f"invalid-json: {type(exc).__name__}: {str(exc)[:80]}") from exc
    return obj  # a dict: the first non-space character was "{"


def _parse_msgpack(value: bytes) -> dict[Any, Any]:
    try:
        obj = msgpack.unpackb(value, raw=False, strict_map_key=True)
    except UnicodeDecodeError as exc:
        raise RecordError(f"invalid-utf8: msgpack str is not UTF-8 ({exc.reason})") from exc
    except msgpack.ExtraData as exc:
        raise RecordError(f"invalid-msgpack: {len(exc.extra)} trailing bytes after the map") from exc
    except msgpack.StackError as exc:
        raise RecordError("invalid-msgpack: nested too deeply") from exc
    except (ValueError, TypeError) as exc:
        raise _msgpack_error(exc) from exc
    if not isinstance(obj, dict):
        raise RecordError(f"invalid-msgpack: expected a map, got {type(obj).__name__}")
    return obj


def _msgpack_error(exc: Exception) -> RecordError:
    message = str(exc)
    # msgpack caps every declared length at the buffer size, so a length that exceeds it
    # means the value was cut short just like "incomplete input".
    if "incomplete input" in message or "exceeds max_" in message:
        return RecordError(f"truncated-msgpack: value ends inside the map ({message})")
    return RecordError(f"invalid-msgpack: {message[:120]}")


# ---------------------------------------------------------------------------- validation

def from_dict(obj: Mapping[Any, Any]) -> Record:
    """Validate a decoded map (or a producer's dict) into a :class:`Record`."""
    get = _getter(obj)
    text, tokens = _text(get("text")), _tokens(get("tokens"))
    key, item = _key(get("key")), _name("item", get("item"))
    if text is None and tokens is None:
        if key is None and item is None:
            raise RecordError("missing-field: text or tokens (or key and item for a next-item record)")
        if key is None or item is None:
            missing = "key" if key is None else "item"
            raise RecordError(f"missing-field: {missing} (a next-item record needs key and item)")
    return Record(
        text=text,
        tokens=tokens,
        label=_name("label", get("label")),
        key=key,
        item=item,
        ts=_ts(get("ts")),
        weight=_weight(get("weight")),
    )


def _getter(obj: Mapping[Any, Any]):
    if not isinstance(obj, Mapping):
        raise RecordError(f"wrong-type: a record must be a map, got {type(obj).__name__}")
    return obj.get


def valid_utf8(name: str, value: str) -> str:
    """``value`` if it encodes as UTF-8; RecordError ``invalid-utf8`` naming ``name`` if it
    holds a lone surrogate (JSON "\\ud800" escapes decode to one; no UTF-8 hasher takes it)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise RecordError(f"invalid-utf8: {name} holds a lone surrogate at {exc.start}") from exc
    return value


def _is_int(value: Any) -> bool:
    """An integer, Python's or numpy's (``numbers.Integral``), not a bool; fields keep it
    as a Python int (:func:`plain_int`)."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def plain_int(value: Any) -> Any:
    """An integer (numpy's too) as a Python int (np.int64 -> int); anything else as it is."""
    return int(value) if _is_int(value) and type(value) is not int else value


def _text(value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise RecordError(f"wrong-type: text must be str, got {type(value).__name__}")
    if not value:
        raise RecordError("bad-value: text is empty")
    return valid_utf8("text", value)


def _tokens(value: Any) -> tuple[Token, ...] | None:
    return None if value is None else token_list("tokens", value)


def token_list(name: str, value: Any, empty: bool = False) -> tuple[Token, ...]:
    """``value`` checked as a list of tokens (str, or int within 64 bits; numpy's as Python
    ints) named ``name`` in errors: a record's ``tokens``, a query's ``exclude`` (which may
    be ``empty``)."""
    if not isinstance(value, (list, tuple)):
        raise RecordError(f"wrong-type: {name} must be a list of str or int, got {type(value).__name__}")
    if not value and not empty:
        raise RecordError(f"bad-value: {name} is empty")
    for i, token in enumerate(value):
        if isinstance(token, str) or _is_int(token):
            _token_field(f"{name}[{i}]", token)  # an int beyond 64 bits: msgpack cannot write it
        else:
            raise RecordError(f"wrong-type: {name}[{i}] must be str or int, got {type(token).__name__}")
    return tuple(map(plain_int, value))


MAX_NAME_CHARS = 1024  # a label, key or item string


def _token_field(name: str, value: Any) -> str | int | None:
    if value is None:
        return value
    if _is_int(value):
        if not -(2**63) <= value < 2**64:  # what msgpack (a checkpoint's labels, a dead letter) can hold
            raise RecordError(f"bad-value: {name} {value} does not fit in 64 bits; send it as a string")
        return plain_int(value)
    if isinstance(value, str):
        return valid_utf8(name, value)
    raise RecordError(f"wrong-type: {name} must be str or int, got {type(value).__name__}")


def _name(name: str, value: Any) -> str | int | None:
    """A label, key or item: a token field of at most :data:`MAX_NAME_CHARS` characters."""
    if isinstance(value, str) and len(value) > MAX_NAME_CHARS:
        raise RecordError(f"bad-value: {name} is {len(value):,} characters, at most {MAX_NAME_CHARS:,}: it names "
                          "a class or an id, not text")
    return _token_field(name, value)


def _key(value: Any) -> str | None:
    # Same identity rule as token ids (hashing.canonical_id): 196 and "196" are one key.
    value = _name("key", value)
    return str(value) if _is_int(value) else value


def _ts(value: Any) -> int | None:
    if value is None:
        return None
    if not _is_int(value):
        raise RecordError(f"wrong-type: ts must be int (ms since the epoch), got {type(value).__name__}")
    if not 0 <= value <= _INT64_MAX:
        raise RecordError(f"bad-value: ts must be in [0, 2**63) ms, got {value}")
    return plain_int(value)


def _weight(value: Any) -> float:
    if value is None:
        return 1.0
    if not _is_number(value):
        raise RecordError(f"wrong-type: weight must be a number, got {type(value).__name__}")
    try:
        weight = float(value)
    except OverflowError as exc:  # an int beyond float range
        raise RecordError(f"bad-weight: weight must be in (0, {MAX_WEIGHT:g}], got an int of "
                          f"{len(str(value))} digits") from exc
    if not (math.isfinite(weight) and 0 < weight <= MAX_WEIGHT):
        raise RecordError(f"bad-weight: weight must be in (0, {MAX_WEIGHT:g}], got {weight!r}")
    return weight


# ---------------------------------------------------------------------------- river inputs

RECORD_FIELDS = ("text", "tokens", "label", "key", "item", "ts", "weight")


def from_features(x: Mapping[Any, Any], max_count: int | None = None, keyed: bool = True) -> dict[str, Any]:
    """A river-style ``x`` as a record dict: a record (a dict with any of
    :data:`RECORD_FIELDS` and a value that is not a number, or, with ``keyed``, a
    next-item record of integer ``key`` and ``item`` and no other name) as it is, or a
    feature dict ``{token: count}`` (river's bag-of-words, e.g. ``{"free": 1, "prize": 2}``)
    as its tokens, each repeated ``count`` times, in the dict's order. A dict of numbers
    only is a feature dict even when a token is spelled like a field (``{"text": 1, "me":
    1}`` is the message "text me"; ``{"key": 1, "item": 2}`` too, unless ``keyed``: a
    learner passes whether its task reads keys). Counts must be whole numbers >= 0;
    anything else (TF-IDF floats, strings) is refused with a message that says what to pass.
    ``max_count``: a token is repeated at most this many times (a learner passes
    ``hashing.max_tokens + 1``: it reads no more, so its first and last ``max_tokens``
    tokens and whether it is truncated stay the same, and ``{"free": 10**8}`` costs nothing).

    >>> from_features({"free": 1, "prize": 2})
    {'tokens': ['free', 'prize', 'prize']}
    >>> from_features({"text": "free prize"})
    {'text': 'free prize'}
    >>> from_features({"text": 1, "me": 1, "label": 1})
    {'tokens': ['text', 'me', 'label']}
    """
    if not isinstance(x, Mapping):
        raise RecordError(f"wrong-type: x must be a dict (a record or a feature dict), got {type(x).__name__}")
    numbers = all(_is_number(v) for v in x.values())
    if not numbers and any(name in x for name in RECORD_FIELDS):
        return dict(x)
    if keyed and numbers and "key" in x and "item" in x and set(x) <= set(RECORD_FIELDS):
        return dict(x)  # a next-item record of integer ids
    tokens: list[Any] = []
    for token, count in x.items():
        if not _is_number(count) or not math.isfinite(count) or count < 0 or count != int(count):
            raise RecordError(
                f"wrong-type: a feature dict maps tokens to counts (whole numbers >= 0), got {token!r}: {count!r}; "
                "streamlearn learns from tokens: pass {'text': '...'}, {'tokens': [...]} or {token: count}")
        tokens.extend([token] * int(count if max_count is None else min(count, max_count)))
    if not tokens:
        raise RecordError("missing-field: an empty feature dict: pass {'text': '...'}, {'tokens': [...]} "
                          "or {token: count}")
    return {"tokens": tokens}


def _is_number(value: Any) -> bool:
    """A real number, Python's or numpy's (``numbers.Real``: np.float32 too), not a bool."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


# ---------------------------------------------------------------------------- encoding

def encode(record: Mapping[str, Any] | Record, fmt: str = "msgpack") -> bytes:
    """Validate ``record`` and serialize it as a msgpack map or a JSON object (UTF-8).

    Only the record fields are written (unknown keys are dropped, as decoding ignores
    them); invalid records raise :class:`RecordError` here, at the producer, rather than
    reaching the dead-letter topic later.
    """
    if fmt not in FORMATS:
        raise RecordError(f"unknown record format {fmt!r}; choose one of {FORMATS}")
    fields = from_dict(record.to_dict() if isinstance(record, Record) else record).to_dict()
    if fmt == "json":
        return json.dumps(fields, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    return msgpack.packb(fields, use_bin_type=True)
