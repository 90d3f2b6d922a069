"""`streamlearn replay` on the real (embedded) broker: offset ranges per partition, time
ranges via offsets_for_times, a deterministic merge order, bad messages, a missing topic."""
from __future__ import annotations

import json

import pytest
from kafka import KafkaProducer

from streamlearn.broker import BrokerError, produce_rows, topic_partitions
from streamlearn.cli import main
from streamlearn.config import Config
from streamlearn.replay import KafkaRange, KafkaSource, ReplayOptions, ReplaySourceError, replay
from streamlearn.replay.sources import parse_offsets, parse_time

from test_replay import TINY, TINY_ITEMS, words_stream

T0 = 1_700_000_000_000


def fill(broker: str, topic: str, n: int) -> list[dict]:
    """n records, keys spread over the partitions, Kafka timestamps T0 + 10 ms * i."""
    records = words_stream(n)
    rows = [(f"k{i}".encode(), r, T0 + 10 * i) for i, r in enumerate(records)]
    produce_rows(broker, topic, rows)
    return records


def source_order(src: KafkaSource) -> list[tuple[int, int]]:
    """(partition, offset) of every item, in replay order."""
    return [tuple(map(int, item.origin.rsplit(":", 1)[1].split("@"))) for item in src]


def test_offset_range_per_partition_in_timestamp_order(broker, make_topic):
    topic = make_topic(2)
    fill(broker, topic, 40)
    src = KafkaSource(broker, KafkaRange(topic, start={0: 2, 1: 1}, end={0: 8, 1: 6}))
    assert src.bounds() == {0: (2, 8), 1: (1, 6)}
    order = source_order(src)
    assert len(order) == 11 and sorted(order) == [(0, o) for o in range(2, 8)] + [(1, o) for o in range(1, 6)]
    assert source_order(src) == order  # a fixed merge order, whatever the fetches returned
    report = replay(src, ReplayOptions(baselines=("river-nb",)), config=Config().override(*TINY))
    assert report["records"] == 11 and report["evaluated"] == 11
    assert report["source"]["offsets"] == {"0": [2, 8], "1": [1, 6]}
    again = replay(src, ReplayOptions(baselines=("river-nb",)), config=Config().override(*TINY))
    assert again["metrics"] == report["metrics"] and again["series"] == report["series"]


def test_a_limited_replay_reports_the_offsets_it_read_not_those_fetched_ahead(broker, make_topic):
    topic = make_topic(2)
    fill(broker, topic, 200)
    src = KafkaSource(broker, KafkaRange(topic))
    report = replay(src, ReplayOptions(limit=7), config=Config().override(*TINY))
    replayed = report["source"]["replayed"]
    assert report["records"] == 7 and sum(last - first + 1 for first, last in replayed.values()) == 7, replayed
    assert sorted(source_order(src))[:1] == [(0, 0)]  # a full pass after it reads from the start again
    assert sum(last - first + 1 for first, last in src.replayed.values()) == 200


def test_a_past_the_end_range_says_so_instead_of_replaying_nothing_silently(broker, make_topic):
    topic = make_topic(2)
    fill(broker, topic, 40)
    end = KafkaSource(broker, KafkaRange(topic)).bounds()[1][1]
    src = KafkaSource(broker, KafkaRange(topic, start={0: 3, 1: end + 50}, end={0: 8, 1: end + 60}))
    assert src.bounds() == {0: (3, 8), 1: (end, end)}
    assert any(f"partition 1: range [{end + 50}, {end + 60}) clamped" in note for note in src.notes), src.notes


def test_time_range_maps_to_offsets(broker, make_topic):
    topic = make_topic(3)
    fill(broker, topic, 60)
    rng = KafkaRange(topic, start_ms=T0 + 100, end_ms=T0 + 300)  # records 10..29
    src = KafkaSource(broker, rng)
    items = list(src)
    assert len(items) == 20 and all(item.record is not None for item in items)
    assert [item.record.text for item in items] == [r["text"] for r in words_stream(60)[10:30]]  # time order
    open_end = KafkaSource(broker, KafkaRange(topic, start_ms=T0 + 550))
    assert len(list(open_end)) == 5


def test_bad_messages_are_counted_with_their_offsets(broker, make_topic):
    topic = make_topic(1)
    fill(broker, topic, 10)
    producer = KafkaProducer(bootstrap_servers=broker)
    for value in (b"\x01garbage", b'{"text": "no label"}', b"{broken json"):
        producer.send(topic, value=value, partition=0)
    producer.flush()
    producer.close()
    report = replay(KafkaSource(broker, KafkaRange(topic)), ReplayOptions(), config=Config().override(*TINY))
    bad = report["bad_records"]
    assert report["records"] == 13 and report["evaluated"] == 10
    assert bad["reasons"] == {"invalid-json": 1, "missing-field": 1, "not-msgpack-or-json": 1}
    assert {e["where"] for e in bad["examples"]} == {f"{topic}:0@10", f"{topic}:0@11", f"{topic}:0@12"}


def test_missing_topic_is_an_error_and_is_not_created(broker, topic):
    with pytest.raises(ReplaySourceError, match="does not exist"):
        KafkaSource(broker, KafkaRange(topic))
    with pytest.raises(BrokerError):
        topic_partitions(broker, topic)


def test_cli_kafka_range_with_report(broker, make_topic, tmp_path, capsys):
    topic = make_topic(2)
    fill(broker, topic, 30)
    out = tmp_path / "r.json"
    sets = [a for s in TINY for a in ("--set", s)]
    code = main(["replay", "--no-progress", "--topic", topic, "--bootstrap", broker, "--start-offset", "0:1",
                 "--end-offset", "1:4", *sets, "--report", str(out)])
    assert code == 0
    report = json.loads(out.read_text())
    ends = {p: e for p, (_, e) in report["source"]["offsets"].items()}
    assert report["source"]["offsets"]["0"][0] == 1 and ends["1"] == 4
    assert report["records"] == (ends["0"] - 1) + 4
    assert main(["replay", "--no-progress", "--topic", topic, "--bootstrap", broker, "--partitions", "7"]) == 2
    assert "no partition 7" in capsys.readouterr().err
    # an offset for a partition the replay does not read (was: ignored, the whole topic replayed)
    for extra in (["--start-offset", "3:0", "--end-offset", "3:10"], ["--partitions", "0", "--end-offset", "1:4"]):
        assert main(["replay", "--no-progress", "--topic", topic, "--bootstrap", broker, *extra]) == 2
        assert "which this replay does not read" in capsys.readouterr().err


# ---------------------------------------------------------------------------- range options (QA walk of --topic)


@pytest.mark.parametrize("text, ms", [
    ("2004-03-15T07:55:47.472Z", 1_079_337_347_472),  # was 1079337347471: through a float
    ("2024-05-01T12:00:00.001Z", 1_714_564_800_001),
    ("2038-01-19T03:14:07.999+00:00", 2_147_483_647_999),
    ("1970-01-01T00:00:00.001", 1),
    ("2004-03-15T08:55:47.472+01:00", 1_079_337_347_472),
    ("9223372036854775807", 2**63 - 1),
])
def test_iso_times_with_ms_are_read_exactly(text, ms):
    assert parse_time(text) == ms


def test_an_offset_list_naming_a_partition_twice_is_refused():
    with pytest.raises(ReplaySourceError, match="names partition 0 twice"):
        parse_offsets("0:1,0:2")  # was: {0: 2}, silently


@pytest.mark.parametrize("start, end, where", [
    (3, 1, "--start-offset 3 is after --end-offset 1"),
    ({0: 3}, {0: 1}, "for partition 0: --start-offset 0:3 is after --end-offset 0:1"),
    (5, {1: 2}, "for partition 1: --start-offset 5 is after --end-offset 1:2"),
])
def test_an_inverted_offset_range_is_refused(start, end, where):
    with pytest.raises(ReplaySourceError, match=where):
        KafkaRange("t", start=start, end=end)
    KafkaRange("t", start={0: 3}, end={1: 1})  # different partitions: no pair to compare


def replay_cli(broker: str, topic: str, *extra: str) -> int:
    sets = [a for s in TINY for a in ("--set", s)]
    return main(["replay", "--no-progress", "--topic", topic, "--bootstrap", broker, *sets, *extra])


@pytest.mark.parametrize("extra, says", [
    (["--start-time="], "--start-time is empty"),  # was: the whole topic replayed, exit 0
    (["--end-time="], "--end-time is empty"),
    (["--start-offset="], "--start-offset is empty"),
    (["--end-offset", " "], "--end-offset is empty"),
    (["--start-time", "1900-01-01"], "out of range"),  # was: ValueError from kafka-python, a traceback
    (["--start-time", "1969-12-31T23:59:59Z"], "out of range"),
    (["--start-time", "10000000000000000000"], "out of range"),  # was: struct.error
    (["--end-time", "-1"], "out of range"),
    (["--start-time", "2024-05-02", "--end-time", "2024-05-01"], "the time range is inverted"),  # was: 0 records
    (["--start-offset", "3", "--end-offset", "1"], "the offset range is inverted"),  # was: a note, exit 0
    (["--start-offset", "0:1,0:2"], "names partition 0 twice"),
])
def test_bad_range_options_are_one_line_usage_errors(broker, make_topic, capsys, extra, says):
    topic = make_topic(1)
    fill(broker, topic, 5)
    assert replay_cli(broker, topic, *extra) == 2
    err = capsys.readouterr().err
    assert says in err and "Traceback" not in err and len(err.strip().splitlines()) == 1, err


def test_a_start_past_the_log_end_names_the_log_end_not_an_end_offset(broker, make_topic):
    topic = make_topic(1)
    fill(broker, topic, 10)
    end = KafkaSource(broker, KafkaRange(topic)).bounds()[0][1]
    src = KafkaSource(broker, KafkaRange(topic, start=end + 50))
    assert src.bounds() == {0: (end, end)}
    assert src.notes == [f"partition 0: start offset {end + 50} is after the log's end ({end}): nothing to replay there"]


def test_a_time_range_reports_the_offsets_it_selected_and_says_when_it_selects_nothing(broker, make_topic):
    topic = make_topic(2)
    fill(broker, topic, 60)
    src = KafkaSource(broker, KafkaRange(topic, start_ms=T0 + 100, end_ms=T0 + 300))  # records 10..29
    assert src.estimate() is None  # was: the whole partitions, the progress bar's total
    report = replay(src, ReplayOptions(), config=Config().override(*TINY))
    assert report["records"] == 20
    offsets, replayed = report["source"]["offsets"], report["source"]["replayed"]
    # was: whole partitions, e.g. {"0": [0, 30]}: each partition's [first in range, first at or after the end)
    assert {p: [first, last + 1] for p, (first, last) in replayed.items()} == offsets, (offsets, replayed)
    assert sum(e - s for s, e in offsets.values()) == 20 and not report["source"]["notes"]
    empty = KafkaSource(broker, KafkaRange(topic, start_ms=T0 + 10_000))
    assert list(empty) == [] and len(empty.notes) == 1 and "holds no record at or after" in empty.notes[0]
    gap = KafkaSource(broker, KafkaRange(topic, start_ms=T0 + 101, end_ms=T0 + 105))
    assert list(gap) == [] and "holds no record in the time range [2023-11-14T22:13:20.101Z, " in gap.notes[0]


def test_a_new_model_on_a_topic_takes_the_task_its_records_say(broker, make_topic, tmp_path, capsys):
    """Was: a next-item or token topic replayed with no --task was scored as classify:
    "60 records, 0 scored, 60 bad (missing-field: 60)", exit 0."""
    items = make_topic(2)
    rows = [(f"u{i % 6}".encode(), {"key": f"u{i % 6}", "item": f"i{(i * 7) % 13}"}, T0 + i) for i in range(60)]
    produce_rows(broker, items, rows)
    out = tmp_path / "r.json"
    sets = [a for s in TINY_ITEMS if not s.startswith("learner.task") for a in ("--set", s)]
    assert main(["replay", "--no-progress", "--topic", items, "--bootstrap", broker, *sets, "--report", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["task"] == "next-item" and report["records"] == 60 and report["bad_records"]["total"] == 0
    assert report["evaluated"] > 0 and "note: task next-item" in capsys.readouterr().err  # all 60 read, none lost to the peek
    text = make_topic(1)
    produce_rows(broker, text, [(None, {"text": f"the cat sat on mat {i}"}, T0 + i) for i in range(30)])
    assert replay_cli(broker, text) == 2
    err = capsys.readouterr().err
    assert "pass --task next-token or --task mlm" in err and len(err.strip().splitlines()) == 1, err
    mixed = make_topic(1)
    produce_rows(broker, mixed, [(None, {"text": "a b c"}, T0), (None, {"key": "u", "item": "i"}, T0 + 1)])
    assert replay_cli(broker, mixed) == 2 and "cannot tell the task; pass --task" in capsys.readouterr().err
    # a task given keeps the old behaviour: each record is a bad classify record
    assert replay_cli(broker, items, "--task", "classify", "--report", str(out)) == 0
    assert json.loads(out.read_text())["bad_records"]["reasons"] == {"missing-field": 60}
    assert replay_cli(broker, text, "--limit", "0") == 0  # nothing read: nothing to tell, classify as before
