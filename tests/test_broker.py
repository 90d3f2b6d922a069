"""The embedded broker, the `streamlearn broker` command and the Kafka client helpers, on a real Tansu."""
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest
from conftest import GROUP_TIMEOUTS

from streamlearn.broker import (
    BrokerError, EmbeddedBroker, create_topic, partition_for, produce_rows, topic_partitions, wait_ready,
)
from streamlearn.records import decode


def accepts(bootstrap: str) -> bool:
    host, port = bootstrap.rsplit(":", 1)
    try:
        with socket.create_connection((host, int(port)), timeout=0.5):
            return True
    except OSError:
        return False


def gone(pid: int) -> bool:
    """True once ``pid`` has exited *and* been reaped (no zombie left in /proc)."""
    return not os.path.exists(f"/proc/{pid}")


def fake_binary(tmp_path, body: str) -> str:
    path = tmp_path / "tansu"
    path.write_text(f"#!/bin/sh\necho $$ > {tmp_path}/pid\n{body}\n")
    path.chmod(0o755)
    return str(path)


# ---------------------------------------------------------------------------- EmbeddedBroker

@pytest.mark.broker
def test_start_answers_kafka_then_stop_leaves_no_process():
    broker = EmbeddedBroker().start()
    pid, bootstrap = broker.pid, broker.bootstrap
    try:
        assert broker.running and bootstrap.startswith("127.0.0.1:")
        assert create_topic(bootstrap, "t", 2) == 2
        assert wait_ready(bootstrap, timeout_s=5) == ["t"]
    finally:
        broker.stop()
    assert not broker.running and gone(pid) and not accepts(bootstrap)
    broker.stop()  # idempotent


@pytest.mark.broker
def test_context_manager_on_a_chosen_port():
    from streamlearn.broker import free_port

    port = free_port()
    with EmbeddedBroker(port=port) as broker:
        assert broker.bootstrap == f"127.0.0.1:{port}"
        pid = broker.pid
        assert wait_ready(broker.bootstrap, 5) == []
    assert gone(pid)


@pytest.mark.broker
def test_stop_kills_a_broker_that_still_has_clients():
    # Tansu waits for connected clients on SIGTERM; stop() must still end it promptly.
    from kafka import KafkaProducer

    broker = EmbeddedBroker(stop_timeout_s=0.5).start()
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap)
    try:
        create_topic(broker.bootstrap, "t", 1)
        producer.send("t", b"x").get(5)
        pid, started = broker.pid, time.monotonic()
        broker.stop()
        assert gone(pid) and time.monotonic() - started < 3
    finally:
        producer.close(timeout=1)


def test_bootstrap_before_start_is_an_error():
    with pytest.raises(BrokerError, match="not started"):
        _ = EmbeddedBroker().bootstrap  # a property: reading it is the test


def test_port_in_use_is_a_clear_error():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        with pytest.raises(BrokerError, match=f"port {port} .* in use: pass another --port"):
            EmbeddedBroker(port=port).start()


def test_missing_binary_is_a_clear_error(monkeypatch, tmp_path):
    monkeypatch.setenv("CALF_TANSU_BIN", str(tmp_path / "no-such-tansu"))
    with pytest.raises(BrokerError, match="no Tansu broker binary: .*CALF_TANSU_BIN"):
        EmbeddedBroker().start()


def test_binary_that_exits_reports_its_output(monkeypatch, tmp_path):
    monkeypatch.setenv("CALF_TANSU_BIN", fake_binary(tmp_path, "echo 'boom: storage unavailable' >&2; exit 3"))
    with pytest.raises(BrokerError, match=r"(?s)exited with status 3.*boom: storage unavailable"):
        EmbeddedBroker().start()


def test_binary_that_never_answers_times_out_and_is_stopped(monkeypatch, tmp_path):
    monkeypatch.setenv("CALF_TANSU_BIN", fake_binary(tmp_path, "echo still starting; exec sleep 60"))
    with pytest.raises(BrokerError, match=r"(?s)did not answer Kafka requests .* within 1 s.*still starting"):
        EmbeddedBroker(start_timeout_s=1.0).start()
    assert gone(int((tmp_path / "pid").read_text()))


# ---------------------------------------------------------------------------- client helpers

def test_create_topic_keeps_an_existing_topic(broker, topic):
    assert create_topic(broker, topic, 3) == 3
    assert create_topic(broker, topic, 5) == 3
    assert topic_partitions(broker, topic) == 3


def test_create_topic_rejects_zero_partitions(broker, topic):
    with pytest.raises(BrokerError, match="--partitions must be >= 1"):
        create_topic(broker, topic, 0)


def test_missing_topic_is_reported_not_auto_created(broker, topic):
    with pytest.raises(BrokerError, match="does not exist"):
        topic_partitions(broker, topic)
    with pytest.raises(BrokerError, match="does not exist"):
        produce_rows(broker, topic, [(None, {"text": "x"}, None)])
    assert topic not in wait_ready(broker)


def test_unreachable_broker_names_bootstrap():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        dead = f"127.0.0.1:{sock.getsockname()[1]}"  # bound, not listening: refused
        started = time.monotonic()
        with pytest.raises(BrokerError, match=f"cannot reach a Kafka broker at {dead} within 1 s.*--bootstrap"):
            create_topic(dead, "t", 1, timeout_s=1.0)
        assert time.monotonic() - started < 5


def test_tls_against_a_plaintext_listener_fails_within_the_timeout_saying_so(broker, make_topic):
    """kafka-python waits for a TLS handshake without a time limit, and a plaintext
    listener never answers one: every client we build is checked first, so the command
    fails after its timeout, naming the setting, instead of hanging."""
    from streamlearn.config import load_config
    from streamlearn.replay import KafkaRange, KafkaSource, ReplaySourceError

    topic = make_topic(1)
    tls = load_config(overrides=["kafka.security_protocol=SSL"], use_env=False).kafka
    said = r"within 1 s: no TLS handshake answered \(kafka.security_protocol='SSL'\).*PLAINTEXT"
    calls = {"admin": lambda: create_topic(broker, topic, 1, timeout_s=1.0, security=tls),
             "producer": lambda: produce_rows(broker, topic, [(None, {"text": "a"}, None)], timeout_s=1.0,
                                              security=tls),
             "replay": lambda: KafkaSource(broker, KafkaRange(topic), timeout_s=1.0, security=tls)}
    for name, call in calls.items():
        started = time.monotonic()
        with pytest.raises((BrokerError, ReplaySourceError), match=said):
            call()
        assert time.monotonic() - started < 5, name
    assert topic_partitions(broker, topic) == 1  # the plaintext broker itself is fine


def test_partition_for_is_stable_across_processes_and_spreads_keys():
    keys = [str(i).encode() for i in range(2000)]
    here = [partition_for(k, 4) for k in keys]
    code = "from streamlearn.broker import partition_for; print([partition_for(str(i).encode(), 4) for i in range(2000)])"
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                           env={**os.environ, "PYTHONHASHSEED": "12345"}).stdout
    assert eval(other) == here
    counts = [here.count(p) for p in range(4)]
    assert min(counts) > 400, counts  # 500 expected per partition


def test_produce_rows_places_keys_and_timestamps(broker, make_topic, consume):
    topic = make_topic(3)
    rows = [(b"u1", {"key": "u1", "item": 1, "ts": 5_000}, 5_000),
            (None, {"text": "hello"}, None),
            (b"u1", {"key": "u1", "item": 2, "ts": 6_000}, 6_000)]
    summary = produce_rows(broker, topic, rows)
    assert summary.records == 3 and sum(summary.per_partition.values()) == 3
    got = consume(topic, 3)
    assert len(got) == 3
    by_key = {m.key: m for m in got}
    assert by_key[b"1"].partition == partition_for(b"1", 3)  # the keyless row's ordinal is 1
    u1 = [m for m in got if m.key == b"u1"]
    assert [m.timestamp for m in u1] == [5_000, 6_000] and {m.partition for m in u1} == {partition_for(b"u1", 3)}
    assert [decode(m.value, 1000).item for m in u1] == [1, 2]


def test_produce_rows_never_drops_an_unsendable_record(broker, make_topic):
    topic = make_topic(1)
    rows = [(None, {"text": "ok"}, None), (None, {"text": "x" * 2_000_000}, None)]  # > max_request_size
    with pytest.raises(BrokerError, match="writing to .* failed"):
        produce_rows(broker, topic, rows)


def test_consumer_group_commits_and_resumes(broker, make_topic, group):
    from kafka import KafkaConsumer

    topic = make_topic(2)
    produce_rows(broker, topic, [(None, {"text": f"m{i}"}, None) for i in range(6)])

    def member():
        return KafkaConsumer(topic, bootstrap_servers=broker, group_id=group, enable_auto_commit=False,
                             auto_offset_reset="earliest", **GROUP_TIMEOUTS)

    first = member()
    seen = []
    deadline = time.monotonic() + 15
    while len(seen) < 6 and time.monotonic() < deadline:
        seen += [m for batch in first.poll(timeout_ms=300).values() for m in batch]
    first.commit()
    first.close()
    assert len(seen) == 6
    produce_rows(broker, topic, [(None, {"text": "late"}, None)])
    second = member()
    later = []
    deadline = time.monotonic() + 15
    while not later and time.monotonic() < deadline:
        later += [m for batch in second.poll(timeout_ms=300).values() for m in batch]
    second.close()
    assert [decode(m.value, 100).text for m in later] == ["late"]


# ---------------------------------------------------------------------------- `streamlearn broker`

def _start_cli(*args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "streamlearn.cli", "broker", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _first_line(proc: subprocess.Popen, timeout_s: float = 30.0) -> str:
    box: list[str] = []
    reader = threading.Thread(target=lambda: box.append(proc.stdout.readline()), daemon=True)
    reader.start()
    reader.join(timeout_s)
    assert box, "streamlearn broker printed nothing"
    return box[0].strip()


@pytest.mark.broker
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_broker_command_prints_bootstrap_and_exits_0_on_signal(sig):
    proc = _start_cli()
    try:
        bootstrap = _first_line(proc)
        assert bootstrap.startswith("127.0.0.1:")
        assert wait_ready(bootstrap, 5) == []
        proc.send_signal(sig)
        assert proc.wait(timeout=15) == 0
        assert not accepts(bootstrap)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()
        proc.stderr.close()


def test_broker_command_port_in_use_exits_2():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        done = subprocess.run([sys.executable, "-m", "streamlearn.cli", "broker", "--port", str(port)],
                              capture_output=True, text=True, timeout=30)
    assert done.returncode == 2
    assert f"port {port}" in done.stderr and "in use" in done.stderr and done.stdout == ""


@pytest.mark.parametrize("port", ["-1", "70000", "http"])
def test_broker_command_refuses_a_port_out_of_range_in_one_line(port, capsys):
    """Was: an OverflowError traceback from bind, exit 1."""
    from streamlearn.cli import main

    with pytest.raises(SystemExit) as usage:
        main(["broker", "--port", port])
    assert usage.value.code == 2 and "must be a port number in [0, 65535]" in capsys.readouterr().err


def test_a_produce_summary_of_many_partitions_stays_one_short_line():
    """Was: every partition's count, 200 KB for a topic of 100,000 partitions."""
    from streamlearn.broker import ProduceSummary

    line = str(ProduceSummary("t", {p: 1 for p in range(100_000)}, 1.0))
    assert line.endswith("100000 partitions: " + "/".join(["1"] * 32) + "/... (99,968 more)")


@pytest.mark.broker  # it starts brokers of its own
def test_a_crashed_broker_restarts_on_its_port_at_once():
    """Killed with clients connected, the broker leaves its port's connections in
    TIME_WAIT / FIN_WAIT; the free-port check must not take them for a listener."""
    from kafka import KafkaProducer

    first = EmbeddedBroker().start()
    port = first.port
    producer = KafkaProducer(bootstrap_servers=first.bootstrap, reconnect_backoff_max_ms=200)
    try:
        create_topic(first.bootstrap, "t", 1)
        producer.send("t", b"x").get(5)
        os.kill(first.pid, signal.SIGKILL)
        first.stop()
        time.sleep(0.2)  # the client sees the connection close: the port's sockets are in TIME_WAIT
        producer.close(timeout=1)  # else it reconnects to the new broker and its metadata request creates "t"
        started = time.monotonic()
        with EmbeddedBroker(port=port) as second:
            assert second.bootstrap == f"127.0.0.1:{port}" and wait_ready(second.bootstrap, 5) == []
        assert time.monotonic() - started < 15
    finally:
        producer.close(timeout=1)
        first.stop()


def test_a_produce_summary_of_one_record_on_one_partition_reads_in_the_singular():
    """Was: "produced 1 records ...; 1 partitions: 1"."""
    from streamlearn.broker import ProduceSummary

    assert str(ProduceSummary("t", {0: 1}, 1.0)).startswith("produced 1 record to 't'")
    assert str(ProduceSummary("t", {0: 1}, 1.0)).endswith("; 1 partition: 1")
    assert "produced 2 records" in str(ProduceSummary("t", {0: 1, 1: 1}, 1.0))
