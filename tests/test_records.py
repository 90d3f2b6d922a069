"""Record decoding and validation: a table of good and bad values, and property tests."""
import json
import math

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamlearn.exceptions import RecordError, StreamlearnError
from streamlearn import records
from streamlearn.records import Record, decode, decode_many, encode, from_dict, reason_code

MAX = 1_000_000


def mp(obj) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)


def js(obj) -> bytes:
    return json.dumps(obj).encode()


GOOD = [
    (mp({"text": "win a prize", "label": "spam"}), Record(text="win a prize", label="spam")),
    (js({"text": "win a prize", "label": "spam"}), Record(text="win a prize", label="spam")),
    (b'  \n\t{"text": "x"}  ', Record(text="x")),
    (mp({"tokens": ["a", 7, "b"], "label": 3}), Record(tokens=("a", 7, "b"), label=3)),
    (js({"tokens": [1, 2]}), Record(tokens=(1, 2))),
    (mp({"key": "u1", "item": 42, "ts": 881250949000}), Record(key="u1", item=42, ts=881250949000)),
    (js({"key": 196, "item": "m242"}), Record(key="196", item="m242")),
    (mp({"text": "x", "weight": 2}), Record(text="x", weight=2.0)),
    (mp({"text": "x", "weight": 0.25, "label": None, "extra": [1, {"a": 2}]}), Record(text="x", weight=0.25)),
    (js({"text": "café ünïcode ✓"}), Record(text="café ünïcode ✓")),
    (mp({"text": "both", "tokens": ["b"]}), Record(text="both", tokens=("b",))),
    (mp({"text": "x", "ts": 0}), Record(text="x", ts=0)),
]


@pytest.mark.parametrize("value,expected", GOOD)
def test_good_values_decode(value, expected):
    assert decode(value, MAX) == expected


BAD = [
    (None, "empty-value"),
    (b"", "empty-value"),
    (b"garbage \x00\x01", "not-msgpack-or-json"),
    (b"\xff\xfe\xfd", "not-msgpack-or-json"),
    (b"[1, 2]", "not-msgpack-or-json"),
    (mp(["text", "x"]), "not-msgpack-or-json"),  # a msgpack array, not a map
    (b"   ", "not-msgpack-or-json"),
    (mp({"text": "hello world"})[:-3], "truncated-msgpack"),
    (b"\x81", "truncated-msgpack"),
    (b"\xde\x00\x05\xa4text", "truncated-msgpack"),
    (mp({"text": "x"}) + b"\x00", "invalid-msgpack"),
    (b"\x81\xa1a" + b"\x91" * 5000 + b"\x90", "invalid-msgpack"),
    (b"\x81\x01\xa1x", "invalid-msgpack"),  # int map key
    (b'{"text": "x"', "invalid-json"),
    (b'{"text": "x"} trailing', "invalid-json"),
    (b'{"a":' + b"[" * 100_000, "invalid-json"),
    (b'{"a":' + b"9" * 5000 + b"}", "invalid-json"),
    (b"\x81\xa4text\xa3\xff\xfe\xfd", "invalid-utf8"),  # msgpack str with non-UTF-8 bytes
    (b"\x81\xa4t\xffxt\xa1x", "invalid-utf8"),  # non-UTF-8 map key
    (b'{"text": "caf\xe9"}', "invalid-utf8"),  # latin-1 inside JSON
    (b'{"text": "\\ud800"}', "invalid-utf8"),  # lone surrogate escape
    (js({"tokens": ["ok", "\ud800"]}), "invalid-utf8"),
    (mp({"label": "spam"}), "missing-field"),
    (mp({}), "missing-field"),
    (mp({"key": "u1"}), "missing-field"),
    (mp({"item": 5}), "missing-field"),
    (mp({b"text": "bytes key"}), "missing-field"),
    (mp({"text": b"raw bytes"}), "wrong-type"),
    (mp({"text": 5}), "wrong-type"),
    (mp({"tokens": "a b"}), "wrong-type"),
    (mp({"tokens": ["a", 1.5]}), "wrong-type"),
    (js({"tokens": [True]}), "wrong-type"),
    (mp({"text": "x", "label": 1.0}), "wrong-type"),
    (mp({"text": "x", "label": ["a"]}), "wrong-type"),
    (js({"text": "x", "label": False}), "wrong-type"),
    (mp({"key": ["u"], "item": 1}), "wrong-type"),
    (mp({"key": "u", "item": {"id": 1}}), "wrong-type"),
    (mp({"text": "x", "ts": 1.7e12}), "wrong-type"),
    (mp({"text": "x", "ts": "2024-01-01"}), "wrong-type"),
    (mp({"text": "x", "weight": "2"}), "wrong-type"),
    (mp({"text": "x", "weight": True}), "wrong-type"),
    (mp({"text": ""}), "bad-value"),
    (mp({"tokens": []}), "bad-value"),
    (mp({"text": "x", "weight": 0}), "bad-weight"),
    (mp({"text": "x", "weight": -1.0}), "bad-weight"),
    (mp({"text": "x", "weight": float("nan")}), "bad-weight"),
    (b'{"text": "x", "weight": Infinity}', "bad-weight"),
    (js({"text": "x", "weight": 10**400}), "bad-weight"),
    (mp({"text": "x", "weight": 1e300}), "bad-weight"),  # finite in float64, inf in float32
    (mp({"text": "x", "weight": 1e38}), "bad-weight"),  # float32, but its square overflows an accumulator
    (mp({"text": "x", "weight": 1e6 * (1 + 1e-9)}), "bad-weight"),
    (mp({"text": "x", "ts": -1}), "bad-value"),
    (js({"text": "x", "ts": 2**63}), "bad-value"),
    (js({"text": "x", "label": 777777777777777777777777777777}), "bad-value"),  # was learned, then no checkpoint
    (js({"text": "x", "label": -(2**63) - 1}), "bad-value"),  # could be written
    (js({"key": 2**64, "item": 1}), "bad-value"),
    (js({"key": "u", "item": 2**64}), "bad-value"),
    (js({"tokens": [2**64], "label": "x"}), "bad-value"),  # was: valid, then msgpack.packb overflowed
    (js({"tokens": ["a", -(2**63) - 1]}), "bad-value"),
    (mp({"text": "x", "label": "l" * 1025}), "bad-value"),  # was: a class of 900 KB in every checkpoint
    (mp({"key": "k" * 1025, "item": 1}), "bad-value"),
    (mp({"key": "u", "item": "i" * 1025}), "bad-value"),
]


@pytest.mark.parametrize("value,code", BAD)
def test_bad_values_raise_record_error_with_reason_code(value, code):
    with pytest.raises(RecordError) as info:
        decode(value, MAX)
    reason = str(info.value)
    assert reason_code(reason) == code, reason
    assert isinstance(info.value, StreamlearnError)


def test_too_large_value_is_rejected_before_parsing():
    big = mp({"text": "a" * (10 * 1024 * 1024)})  # a valid 10 MB record
    with pytest.raises(RecordError, match=r"^too-large: 10485\d\d\d > 1000000 bytes"):
        decode(big, MAX)
    assert decode(big, len(big)).text == "a" * (10 * 1024 * 1024)


def test_decode_many_splits_records_and_errors_by_index():
    values = [mp({"text": "a"}), b"\x00junk", None, js({"tokens": [1]}), mp({"text": 3})]
    records, errors = decode_many(values, MAX)
    assert [i for i, _ in records] == [0, 3]
    assert [r for _, r in records] == [Record(text="a"), Record(tokens=(1,))]
    assert [(i, reason_code(r)) for i, r in errors] == [
        (1, "not-msgpack-or-json"), (2, "empty-value"), (4, "wrong-type"),
    ]


def test_decode_many_of_nothing():
    assert decode_many([], MAX) == ([], [])


def test_encode_validates_and_drops_unknown_fields():
    assert decode(encode({"text": "x", "source": "sms"}), MAX) == Record(text="x")
    with pytest.raises(RecordError, match="missing-field"):
        encode({"label": "spam"})
    with pytest.raises(RecordError, match="unknown record format"):
        encode({"text": "x"}, fmt="avro")


def test_encode_formats_are_what_they_say():
    assert encode({"text": "x"}, fmt="json") == b'{"text":"x"}'
    assert msgpack.unpackb(encode({"text": "x"})) == {"text": "x"}


def test_encode_accepts_a_record():
    rec = Record(key="u", item=3, ts=5, weight=0.5)
    assert decode(encode(rec, "json"), MAX) == rec
    with pytest.raises(RecordError, match="missing-field"):
        encode(Record(label="x"))


def test_reason_code():
    assert reason_code("too-large: 5 > 3 bytes") == "too-large"
    assert reason_code("empty-value") == "empty-value"


# ---------------------------------------------------------------------------- properties

tokens_st = st.lists(st.one_of(st.text(max_size=8), st.integers(-(2**63), 2**64 - 1)), min_size=1, max_size=6)
label_st = st.one_of(st.none(), st.text(max_size=6), st.integers(-(2**63), 2**63 - 1))
ts_st = st.one_of(st.none(), st.integers(0, 2**63 - 1))
weight_st = st.one_of(st.none(), st.floats(min_value=1e-30, max_value=1e6), st.integers(1, 10**6))


@st.composite
def record_dicts(draw):
    kind = draw(st.sampled_from(["text", "tokens", "both", "next-item"]))
    out = {}
    if kind in ("text", "both"):
        out["text"] = draw(st.text(min_size=1, max_size=30))
    if kind in ("tokens", "both"):
        out["tokens"] = draw(tokens_st)
    if kind == "next-item":
        out["key"] = draw(st.one_of(st.text(max_size=6), st.integers(0, 2**40)))
        out["item"] = draw(st.one_of(st.text(max_size=6), st.integers(-(2**63), 2**63 - 1)))
    for name, strategy in (("label", label_st), ("ts", ts_st), ("weight", weight_st)):
        value = draw(strategy)
        if value is not None:
            out[name] = value
    return out


@settings(max_examples=300, deadline=None)
@given(record_dicts(), st.sampled_from(["msgpack", "json"]))
def test_encode_decode_round_trip(obj, fmt):
    rec = decode(encode(obj, fmt), MAX)
    assert rec.text == obj.get("text")
    assert rec.tokens == (tuple(obj["tokens"]) if "tokens" in obj else None)
    assert rec.label == obj.get("label")
    assert rec.key == (str(obj["key"]) if "key" in obj else None)
    assert rec.item == obj.get("item")
    assert rec.ts == obj.get("ts")
    assert math.isclose(rec.weight, float(obj.get("weight", 1.0)), rel_tol=0, abs_tol=0)
    assert from_dict(rec.to_dict()) == rec


def _decode_or_reason(value: bytes):
    try:
        return decode(value, 10_000)
    except RecordError as exc:
        error = exc
    assert reason_code(str(error)) in records.REASONS, str(error)
    return None


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=200))
def test_arbitrary_bytes_raise_only_record_error(value):
    _decode_or_reason(value)


@settings(max_examples=500, deadline=None)
@given(st.sampled_from([0x80, 0x81, 0x83, 0x8F, 0xDE, 0xDF, ord("{")]), st.binary(max_size=200))
def test_bytes_that_look_like_a_map_raise_only_record_error(first, rest):
    _decode_or_reason(bytes([first]) + rest)


@settings(max_examples=300, deadline=None)
@given(record_dicts(), st.sampled_from(["msgpack", "json"]), st.data())
def test_cut_or_corrupted_encodings_raise_only_record_error(obj, fmt, data):
    value = bytearray(encode(obj, fmt))
    cut = data.draw(st.integers(0, len(value)))
    if data.draw(st.booleans()):
        value = value[:cut]
    elif cut < len(value):
        value[cut] = data.draw(st.integers(0, 255))
    _decode_or_reason(bytes(value))


def test_every_reason_code_is_documented():
    for code in records.REASONS:
        assert f"``{code}``" in records.__doc__, code
