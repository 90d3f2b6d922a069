"""`streamlearn produce` end to end: a tiny file in, the messages read back from the real broker."""
import json
import re
import socket
from collections import defaultdict

import msgpack

from streamlearn.broker import create_topic, partition_for
from streamlearn.cli import main
from streamlearn.datasets import bundled_path
from streamlearn.records import Record, decode


def produce(broker, path, topic, *extra: str) -> int:
    return main(["produce", str(path), "--topic", topic, "--bootstrap", broker, *extra])


def test_jsonl_keys_values_and_timestamps(broker, topic, consume, tmp_path, capsys):
    path = tmp_path / "events.jsonl"
    lines = [{"text": "hello", "label": "greet"}, {"key": "u9", "item": 4, "ts": 1_700_000_000_000},
             {"tokens": ["a", 2]}, {"key": "u9", "item": 5, "ts": 1_700_000_000_500}]
    path.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    assert produce(broker, path, topic, "--partitions", "3", "--format", "json") == 0
    assert f"produced 4 records to '{topic}'" in capsys.readouterr().out
    got = consume(topic, 4)
    assert len(got) == 4
    assert sorted(m.key for m in got) == [b"0", b"2", b"u9", b"u9"]  # ordinals for keyless records
    assert all(m.partition == partition_for(m.key, 3) for m in got)
    assert all(json.loads(m.value) for m in got)  # --format json writes JSON objects
    decoded = {(m.key, decode(m.value, 1000)) for m in got}
    assert decoded == {
        (b"0", Record(text="hello", label="greet")),
        (b"2", Record(tokens=("a", 2))),
        (b"u9", Record(key="u9", item=4, ts=1_700_000_000_000)),
        (b"u9", Record(key="u9", item=5, ts=1_700_000_000_500)),
    }
    u9 = [m for m in got if m.key == b"u9"]
    assert [m.timestamp for m in u9] == [1_700_000_000_000, 1_700_000_000_500]  # in partition order


def test_tsv_sms_layout_spreads_over_partitions(broker, topic, consume, tmp_path, capsys):
    path = tmp_path / "SMSSpamCollection"
    texts = [f"message number {i}" for i in range(40)]
    path.write_text("".join(f"{'spam' if i % 4 == 0 else 'ham'}\t{t}\n" for i, t in enumerate(texts)))
    assert produce(broker, path, topic, "--partitions", "4") == 0
    out = capsys.readouterr().out
    assert "produced 40 records" in out and "4 partitions" in out and "[tsv " in out and "-> msgpack]" in out
    got = consume(topic, 40)
    assert len(got) == 40 and len({m.partition for m in got}) == 4
    by_key = {m.key: msgpack.unpackb(m.value) for m in got}
    assert by_key[b"0"] == {"text": "message number 0", "label": "spam"}
    assert by_key[b"39"] == {"text": "message number 39", "label": "ham"}
    assert all(m.partition == partition_for(m.key, 4) for m in got)


def test_own_csv_with_a_header_is_read_as_the_header_says_with_a_preview(broker, topic, consume, tmp_path, capsys):
    """The file of issue 19: a header that names neither text nor label, a quoted comma."""
    path = tmp_path / "my.csv"
    path.write_text('message,category\n"free prize, call now",spam\nsee you later,ham\n')
    assert produce(broker, path, topic) == 0
    captured = capsys.readouterr()
    assert "produced 2 records" in captured.out
    assert "a header row; text: 'message'; label: 'category'" in captured.err
    assert "first record: {'text': 'free prize, call now', 'label': 'spam'}" in captured.err
    got = sorted(msgpack.unpackb(m.value)["text"] for m in consume(topic, 2))
    assert got == ["free prize, call now", "see you later"]


def test_movielens_events_keep_each_user_on_one_partition_in_time_order(broker, topic, consume, tmp_path):
    path = tmp_path / "u.data"
    path.write_text("1\t10\t5\t300\n2\t20\t4\t100\n1\t11\t3\t200\n3\t30\t1\t50\n2\t21\t2\t400\n1\t12\t4\t250\n")
    assert produce(broker, path, topic, "--partitions", "2") == 0
    got = consume(topic, 6)
    assert len(got) == 6
    per_user = defaultdict(list)
    for m in got:  # consume() orders by (partition, offset)
        rec = decode(m.value, 1000)
        assert m.key == rec.key.encode() and m.timestamp == rec.ts and m.partition == partition_for(m.key, 2)
        per_user[rec.key].append((rec.ts, rec.item))
    assert per_user == {"1": [(200_000, 11), (250_000, 12), (300_000, 10)],
                        "2": [(100_000, 20), (400_000, 21)], "3": [(50_000, 30)]}


def test_limit_takes_the_first_records(broker, topic, consume, tmp_path, capsys):
    path = tmp_path / "a.jsonl"
    path.write_text("".join(json.dumps({"text": f"t{i}"}) + "\n" for i in range(10)))
    assert produce(broker, path, topic, "--limit", "3") == 0
    assert "produced 3 records" in capsys.readouterr().out
    assert sorted(decode(m.value, 100).text for m in consume(topic, 3, timeout_s=3)) == ["t0", "t1", "t2"]


def test_existing_topic_keeps_its_partitions(broker, topic, consume, tmp_path, capsys):
    create_topic(broker, topic, 2)
    path = tmp_path / "a.jsonl"
    path.write_text('{"text": "x"}\n{"text": "y"}\n{"text": "z"}\n')
    assert produce(broker, path, topic, "--partitions", "5") == 0
    captured = capsys.readouterr()
    assert "already exists with 2 partitions" in captured.err and "2 partitions" in captured.out
    assert {m.partition for m in consume(topic, 3)} <= {0, 1}


def test_bad_line_stops_with_line_number_and_says_what_was_written_before_it(broker, topic, consume, tmp_path,
                                                                             capsys):
    path = tmp_path / "SMSSpamCollection"
    path.write_text("ham\tfine thanks see you\nham\tsee you at noon\nspam\nham\tnever sent\n")
    assert produce(broker, path, topic) == 2
    err = capsys.readouterr().err
    assert "SMSSpamCollection:3: missing-field: 1 field(s)" in err
    assert f"2 record(s) were written to {topic!r} before it; running again writes them again" in err
    written = consume(topic, 3, timeout_s=3.0)  # a third would be a record of the bad line or after it
    assert sorted(msgpack.unpackb(m.value)["text"] for m in written) == ["fine thanks see you", "see you at noon"]


def test_skip_bad_lines_reports_them(broker, topic, consume, tmp_path, capsys):
    path = tmp_path / "a.jsonl"
    path.write_text('{"text": "ok"}\n{"label": "no text"}\n{"text": "also ok"}\n')
    assert produce(broker, path, topic, "--skip-bad-lines") == 0
    captured = capsys.readouterr()
    assert "produced 2 records" in captured.out
    assert "skipped 1 bad line(s)" in captured.err and "line 2: missing-field" in captured.err
    assert len(consume(topic, 2)) == 2
    many = tmp_path / "b.jsonl"  # more than the five shown: the rest are counted and named, not dropped from the list
    many.write_text("".join('{"label": "no text"}\n' if i % 2 else '{"text": "ok"}\n' for i in range(16)))
    assert produce(broker, many, topic + "-many", "--skip-bad-lines") == 0
    err = capsys.readouterr().err
    assert "skipped 8 bad line(s)" in err and err.count(": missing-field") == 5
    assert "and 3 more lines: 12, 14, 16" in err


def test_unreachable_bootstrap_is_named(tmp_path, capsys):
    path = tmp_path / "a.jsonl"
    path.write_text('{"text": "x"}\n')
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        dead = f"127.0.0.1:{sock.getsockname()[1]}"
        assert produce(dead, path, "t", "--timeout", "1") == 2
    err = capsys.readouterr().err
    assert f"cannot reach a Kafka broker at {dead}" in err and "check --bootstrap" in err


def test_bad_options_are_user_errors(broker, topic, tmp_path, capsys):
    path = tmp_path / "a.tsv"
    path.write_text("1\t2\t3\t4\n")
    assert produce(broker, path, topic) == 2
    assert "--text-column" in capsys.readouterr().err
    assert produce(broker, path, topic, "--limit", "-1") == 2
    assert produce(broker, tmp_path / "missing.tsv", topic) == 2
    assert "no such file" in capsys.readouterr().err


def test_bundled_sms_sample_loads_completely(broker, topic, consume, capsys):
    assert produce(broker, bundled_path(), topic, "--partitions", "3") == 0
    assert "produced 5574 records" in capsys.readouterr().out
    got = consume(topic, 5574, timeout_s=20)
    labels = [decode(m.value, 100_000).label for m in got]
    assert len(got) == 5574 and labels.count("spam") == 747


def test_a_line_the_worker_would_refuse_as_too_large_is_a_bad_line(broker, topic, consume, tmp_path, capsys):
    path = tmp_path / "a.jsonl"
    path.write_text('{"text": "ok"}\n' + json.dumps({"text": "word " * 300}) + '\n{"text": "also ok"}\n')
    assert produce(broker, path, topic, "--set", "worker.max_record_bytes=1000") == 2
    err = capsys.readouterr().err
    assert re.search(r"a.jsonl:2: too-large: 15\d\d > 1000 bytes \(worker.max_record_bytes\)", err), err
    assert produce(broker, path, topic + "-skip", "--set", "worker.max_record_bytes=1000", "--skip-bad-lines") == 0
    assert "line 2: too-large" in capsys.readouterr().err


def test_a_text_record_the_worker_would_refuse_is_a_bad_line_and_the_preview_is_capped(broker, topic, consume,
                                                                                       tmp_path, capsys):
    """Was: plain-text records had no size limit (produce failed at Kafka's
    MessageSizeTooLargeError), and the preview printed a huge first record in full."""
    path = tmp_path / "book.txt"
    path.write_text("x" * 3000 + "\n" + "the cat sat on the mat " * 8 + "\n")
    args = ("--set", "worker.max_record_bytes=1000", "--skip-bad-lines")
    assert produce(broker, path, topic, *args) == 0
    err = capsys.readouterr().err
    assert re.search(r"line 2: too-large: a record of 32 words is 3\d\d\d > 1000 bytes", err), err
    assert [decode(m.value, 1000).text.split()[:3] for m in consume(topic, 1)] == [["cat", "sat", "on"]]
    assert produce(broker, path, topic + "-b", "--skip-bad-lines") == 0  # no limit but the broker's
    preview = capsys.readouterr().err.splitlines()[1]
    assert preview.startswith("first record: {'text': 'xxx") and len(preview) < 300 and preview.endswith("...")


def test_produce_and_replay_take_the_bootstrap_of_the_config_and_environment(broker, topic, tmp_path, monkeypatch,
                                                                            capsys):
    """Was: both used 127.0.0.1:9092 unless --bootstrap was given; only the worker read
    worker.bootstrap, so one operator config did not serve every command."""
    path = tmp_path / "events.jsonl"
    path.write_text(json.dumps({"text": "hello there", "label": "greet"}) + "\n")
    conf = tmp_path / "c.toml"
    conf.write_text(f'[worker]\nbootstrap = "{broker}"\n')
    assert main(["produce", str(path), "--topic", topic, "--config", str(conf), "--timeout", "5"]) == 0
    monkeypatch.setenv("STREAMLEARN__WORKER__BOOTSTRAP", broker)
    assert main(["produce", str(path), "--topic", topic, "--timeout", "5"]) == 0
    assert main(["replay", "--topic", topic, "--no-progress"]) == 0
    assert "2 records" in capsys.readouterr().out


def test_a_topic_name_kafka_refuses_is_said_before_any_client_is_built(tmp_path, capsys):
    """Was: the embedded broker took 'bad topic!' from produce, and a worker given no task
    or replay --topic then ended in kafka-python's ValueError traceback."""
    import pytest

    path = tmp_path / "a.jsonl"
    path.write_text('{"text": "ok"}\n')
    commands = {"produce": ["produce", str(path)], "worker": ["worker", "--state", str(tmp_path / "s")],
                "replay": ["replay"]}
    for name, args in commands.items():
        with pytest.raises(SystemExit) as exit_:
            main([*args, "--topic", "bad topic!", "--bootstrap", "127.0.0.1:1"])
        assert exit_.value.code == 2, name
        last = capsys.readouterr().err.strip().splitlines()[-1]
        assert last == (f"streamlearn {name}: error: argument --topic: topic name 'bad topic!' is not legal in "
                        "Kafka: use 1 to 249 of a-z A-Z 0-9 . _ - (not ' ', '!')"), name
    assert not (tmp_path / "s").exists()


def test_a_bootstrap_that_is_not_host_port_is_said_at_once_by_every_command(tmp_path, capsys):
    """Was: produce and replay waited 10 s on 'nohostport', then said they could not reach it."""
    import time

    import pytest

    path = tmp_path / "a.jsonl"
    path.write_text('{"text": "ok"}\n')
    commands = {"produce": ["produce", str(path)], "worker": ["worker", "--state", str(tmp_path / "s")],
                "replay": ["replay"]}
    for name, args in commands.items():
        started = time.monotonic()
        with pytest.raises(SystemExit) as exit_:
            main([*args, "--topic", "t", "--bootstrap", "nohostport"])
        assert exit_.value.code == 2 and time.monotonic() - started < 5, name
        assert capsys.readouterr().err.strip().splitlines()[-1] == (
            f"streamlearn {name}: error: argument --bootstrap: worker.bootstrap must be host:port[,host:port...] "
            "with ports in [1, 65535], got 'nohostport'"), name
