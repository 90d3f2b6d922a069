"""Bad input on the real broker: garbage bytes, truncated msgpack, empty and null values, wrong
types, missing fields, non-UTF-8 text and a 10 MB message, mixed into valid records. The worker
keeps running, learns every valid record, and dead-letters every bad one with its reason and
its original bytes."""
import json
import random
import time

import msgpack
import pytest

from streamlearn.checkpoint import read_full
from streamlearn.config import Config
from streamlearn.consumers import RunOptions, Worker, read_audit
from streamlearn.records import encode
from streamlearn.state import open_store

SETTINGS = ("model.layers=0", "embedding.K=2000", "embedding.B=256", "embedding.d=16", "model.d_model=16",
            "model.max_labels=3", "learner.batch_size=16", "store.shards=2", "store.map_size_gb=0.05",
            "store.sync=false", "worker.session_timeout_ms=2000", "worker.heartbeat_interval_ms=300",
            "worker.poll_timeout_ms=100", "worker.audit=true")
LABELS = {"sport": ["goal", "match", "team"], "tech": ["chip", "code", "cloud"], "food": ["pasta", "soup", "bread"]}
TEN_MB = json.dumps({"text": "goal " * (2 * 1024 * 1024), "label": "sport"}).encode()

# (value, the reason code it must be dead-lettered with)
BAD = [
    (b"\x00\x01garbage\xff\xfe", "not-msgpack-or-json"),
    (b"plain text, not a record", "not-msgpack-or-json"),
    (encode({"text": "goal match team", "label": "sport"})[:-5], "truncated-msgpack"),
    (b"", "empty-value"),
    (None, "empty-value"),
    (b'{"text": "goal match", "label": ', "invalid-json"),
    (encode({"text": "chip code"}, "json") + b"]", "invalid-json"),
    (msgpack.packb({"text": 42, "label": "tech"}), "wrong-type"),
    (msgpack.packb({"text": "chip", "label": 1.5}), "wrong-type"),
    (json.dumps({"tokens": "chip code", "label": "tech"}).encode(), "wrong-type"),
    (msgpack.packb({"text": "soup", "label": "food", "weight": "heavy"}), "wrong-type"),
    (msgpack.packb({"label": "food"}), "missing-field"),
    (json.dumps({"text": "pasta soup"}).encode(), "missing-field"),  # no label: rejected by the learner
    (json.dumps({"text": "", "label": "food"}).encode(), "bad-value"),
    (msgpack.packb({"tokens": [], "label": "food"}), "bad-value"),
    (json.dumps({"text": "soup", "label": "food", "weight": -1}).encode(), "bad-weight"),
    (msgpack.packb({"text": "soup bread", "label": "food", "weight": 1e300}), "bad-weight"),  # inf in float32
    (msgpack.packb({"text": "goal team", "label": "sport", "weight": 1e38}), "bad-weight"),  # its square: inf
    (b'{"text": "caf\xe9 cr\xe8me", "label": "food"}', "invalid-utf8"),
    (msgpack.packb({"text": b"\xff\xfe\xfd", "label": "food"}, use_bin_type=False), "invalid-utf8"),
    (b'{"text": "bad \\ud800 surrogate", "label": "food"}', "invalid-utf8"),
    (TEN_MB, "too-large"),
    (msgpack.packb({"text": "sunny rain", "label": "weather"}), "label-capacity"),  # a 4th label
]


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def valid(n: int, rng: random.Random) -> list[bytes]:
    out = []
    for i in range(n):
        label = rng.choice(sorted(LABELS))
        record = {"text": " ".join(rng.choice(LABELS[label]) for _ in range(4)), "label": label}
        out.append(encode(record, "json" if i % 3 == 0 else "msgpack"))
    return out


def produce_raw(bootstrap: str, topic: str, values: list[bytes | None]) -> list[tuple[int, int]]:
    """Write raw values round-robin over 2 partitions; return each one's (partition, offset)."""
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=bootstrap, max_request_size=16 << 20, linger_ms=5)
    futures = [producer.send(topic, value=v, key=str(i).encode(), partition=i % 2) for i, v in enumerate(values)]
    producer.flush(30)
    placed = [(f.get(10).partition, f.get(10).offset) for f in futures]
    producer.close()
    return placed


def test_bad_records_go_to_the_dlq_with_their_reason_and_valid_ones_are_learned(
        broker, make_topic, group, tmp_path, consume, caplog):
    rng = random.Random(11)
    good = valid(300, rng)
    mixed = [(v, None) for v in good] + BAD
    rng.shuffle(mixed)
    mixed += [(v, None) for v in valid(40, rng)]  # valid records after all the bad ones
    # valid, but its event time (2^63 - 1 ms) is a broken clock: learned, not counted for the lag
    mixed.insert(150, (encode({"text": "goal match team", "label": "sport", "ts": 2**63 - 1}), None))
    topic = make_topic(2)
    placed = produce_raw(broker, topic, [v for v, _ in mixed])
    ends = {p: sum(1 for q, _ in placed if q == p) for p in (0, 1)}

    cfg = Config().override(*SETTINGS, f"worker.bootstrap={broker}", f"worker.group={group}")
    with caplog.at_level("WARNING", logger="streamlearn.consumers.fetcher"):
        summary = Worker(cfg, RunOptions(topic, str(tmp_path / "s"), until_idle_s=1.5)).run()

    # the log says why once per reason (a text without a label once more, with what to change)
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("dead-lettered")]
    codes = sorted({code for _, code in BAD})
    assert sorted(m.split(": ", 1)[1].split(":")[0] for m in said) == sorted([*codes, "missing-field"])
    assert sum("run the worker with --task next-token or --task mlm" in m for m in said) == 1

    n_bad = len(BAD)
    assert summary.saved and summary.records == len(mixed)
    assert (summary.learned, summary.dead_letters) == (len(mixed) - n_bad, n_bad)
    with open_store(tmp_path / "s", readonly=True) as store:
        m = store.manifest()
        learner = read_full(store)
        audit = list(read_audit(store))
    assert {int(k.rpartition(":")[2]): v for k, v in m.records_applied.items()} == ends
    assert {int(k.rpartition(":")[2]): v for k, v in m.offsets.items()} == ends
    assert (m.metrics["records_learned"], m.metrics["dead_letters"]) == (len(mixed) - n_bad, n_bad)
    assert sorted(learner.labels) == ["food", "sport", "tech"]  # "weather" never got in
    assert all(bool(t.isfinite().all()) for t in learner.value_tables().values())
    assert m.metrics["skipped_steps"] == 0  # the bad weights never reached a step
    assert 0 < m.metrics["newest_event_ms"] < (time.time() + 2 * 86_400) * 1000  # event-time lag stays sane
    assert sum(r[3] for _, ranges in audit for r in ranges) == len(mixed)

    letters = {}
    for letter in consume(topic + ".dlq", n_bad, timeout_s=30):
        letters[letter.key] = letter  # keys are unique per source record: dedupe at-least-once
    expected = {f"{topic}:{p}:{o}".encode(): (value, code)
                for (p, o), (value, code) in zip(placed, mixed) if code is not None}
    assert set(letters) == set(expected)
    for key, (value, code) in expected.items():
        headers = dict(letters[key].headers)
        assert headers["reason"].decode().startswith(code + ": "), (code, headers["reason"])
        assert headers["source"] == key
        assert letters[key].value == value  # the original bytes (None for a tombstone)
    big = letters[next(k for k, (_, c) in expected.items() if c == "too-large")]
    assert len(big.value) == len(TEN_MB) and big.value == TEN_MB  # the original bytes, whole
