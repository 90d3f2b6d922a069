"""The worker when the broker is not what its state expects, on real Tansu brokers: a broker
that lost its data never makes the worker skip records silently, a broker or topic that
is not there ends the start-up with an error saying what was reached, dead letters keep
source order, and a lone worker reads without waiting for a group join."""
import doctest
import logging
import os
import signal
import subprocess
import sys
import threading
import time

import msgpack
import pytest
from test_worker import SMALL, applied_once, config, manifest, offsets_of, produce, stream, wait_for

from streamlearn.broker import BrokerError, EmbeddedBroker, create_topic, free_port
from streamlearn.consumers import RunOptions, Worker, WorkerError
from streamlearn.consumers import positions
from streamlearn.consumers.positions import OffsetsLostError, TopicLog, compare
from streamlearn.records import encode

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def run(cfg, topic: str, state, **options):
    return Worker(cfg, RunOptions(topic, str(state), **options)).run()


def restarted_empty(broker: EmbeddedBroker) -> EmbeddedBroker:
    """The broker killed (a crash: memory storage loses everything) and started again
    on the same port at once."""
    os.kill(broker.pid, signal.SIGKILL)
    broker.stop()
    return EmbeddedBroker(port=broker.port).start()


# ---------------------------------------------------------------------------- lost offsets

def _trained_then_emptied(broker: EmbeddedBroker, state, group: str, partitions: int, records: int):
    """A state trained on all of topic 'events' of ``broker``, which is then restarted
    without its data: (the restarted broker, the end offsets learned, the config, the
    stored manifest)."""
    create_topic(broker.bootstrap, "events", partitions)
    before = produce(broker.bootstrap, "events", stream(records, seed=1))
    cfg = config(broker.bootstrap, group)
    assert run(cfg, "events", state, until_idle_s=1.0).offsets == before
    return restarted_empty(broker), before, cfg, manifest(state)[0]


def test_positions_doctests():
    assert doctest.testmod(positions).failed == 0


def test_a_count_that_only_grew_keeps_the_known_offsets():
    grown = TopicLog("t", begins={0: 0, 1: 0, 2: 0}, ends={0: 9, 1: 9, 2: 0})
    mismatch = compare({0: 5, 1: 9}, grown)
    assert mismatch.count_changed and mismatch.restart() == []  # partition 2 starts at 0 anyway
    recreated = TopicLog("t", begins={0: 0, 1: 0, 2: 0}, ends={0: 9, 1: 3, 2: 0})
    assert compare({0: 5, 1: 9}, recreated).restart() == [0, 1, 2]  # no stored offset names the same records
    assert compare({0: 5, 1: 9, 2: 0}, TopicLog("t", {0: 0, 1: 0, 2: 0}, {0: 9, 1: 9, 2: 0})) is None


@pytest.mark.broker  # it starts (or looks for) brokers of its own
def test_a_broker_that_lost_its_data_stops_the_worker_and_restart_from_start_reads_it_all(group, tmp_path, caplog):
    state = tmp_path / "s"
    broker = EmbeddedBroker().start()
    try:
        broker, before, cfg, stored = _trained_then_emptied(broker, state, group, partitions=3, records=300)
        create_topic(broker.bootstrap, "events", 4)  # as Tansu auto-creates it: 4 partitions
        after = produce(broker.bootstrap, "events", stream(120, seed=2))
        assert all(after[p] < before[p] for p in before)  # every stored offset is past the new end
        with pytest.raises(WorkerError, match=r"(?s)partition 0 at .* but the log ends at .*the topic has 4 "
                                              r"partitions, the state recorded 3.*--on-lost-offsets restart-from-start"):
            run(cfg, "events", state, until_idle_s=1.0)
        assert manifest(state)[0] == stored  # refused before anything was written

        with caplog.at_level(logging.ERROR, logger="streamlearn.consumers"):
            summary = run(cfg.override("worker.on_lost_offsets=restart-from-start"), "events", state, until_idle_s=1.0)
        assert any("reading partitions [0, 1, 2, 3] again from the log's start" in r.getMessage()
                   for r in caplog.records if r.levelno == logging.ERROR)
        assert summary.records == 120 and summary.offsets == after  # every new record, none skipped
        assert offsets_of(manifest(state)[0].offsets, "events") == after
        assert run(cfg, "events", state, until_idle_s=1.0).records == 0  # consistent again: no error
    finally:
        broker.stop()


@pytest.mark.broker  # it starts (or looks for) brokers of its own
def test_a_topic_created_again_and_refilled_past_the_stored_offsets_is_refused(group, tmp_path):
    """The broker restarted without its data and the topic created again with the same
    partitions and refilled beyond every stored offset: no offset or count check can tell.
    Was: exit 0, the new log's records below the stored offsets skipped without a word;
    now the topic's id, stored with the offsets, tells."""
    state = tmp_path / "s"
    broker = EmbeddedBroker().start()
    try:
        broker, before, cfg, stored = _trained_then_emptied(broker, state, group, partitions=2, records=200)
        create_topic(broker.bootstrap, "events", 2)
        after = produce(broker.bootstrap, "events", stream(600, seed=2))
        assert all(after[p] > before[p] for p in before)  # every stored offset is within the new log
        with pytest.raises(WorkerError, match=r"topic 'events': it was deleted and created again \(its id was"):
            run(cfg, "events", state, until_idle_s=1.0)
        assert manifest(state)[0] == stored  # refused before anything was written
        summary = run(cfg.override("worker.on_lost_offsets=restart-from-start"), "events", state, until_idle_s=1.0)
        assert summary.records == 600 and summary.offsets == after  # every record of the new log
        assert run(cfg, "events", state, until_idle_s=1.0).records == 0  # the new id is stored: consistent again
    finally:
        broker.stop()


@pytest.mark.broker  # it starts (or looks for) brokers of its own
def test_a_broker_that_loses_its_data_while_the_worker_runs_stops_it(group, tmp_path):
    state = tmp_path / "s"
    broker = EmbeddedBroker().start()
    try:
        create_topic(broker.bootstrap, "events", 2)
        first = produce(broker.bootstrap, "events", stream(400, seed=3))
        worker = Worker(config(broker.bootstrap, group, "worker.log_seconds=0.2"), RunOptions("events", str(state)))
        box = {}
        thread = threading.Thread(target=lambda: box.update(result=_outcome(worker.run)))
        thread.start()
        wait_for(lambda: worker.metrics.records >= 400)
        broker = restarted_empty(broker)
        create_topic(broker.bootstrap, "events", 2)  # same count: only the offsets tell
        produce(broker.bootstrap, "events", stream(20, seed=4))
        thread.join(60)
        assert not thread.is_alive()
    finally:
        broker.stop()
    error = box["result"]
    # which check sees it first varies: the probe's ends, the partition count (Tansu may
    # create the topic again with 4 partitions on the consumer's metadata request), or a
    # record served below the position
    assert isinstance(error, WorkerError) and isinstance(error.__cause__, OffsetsLostError), error
    assert "--on-lost-offsets restart-from-start" in str(error)
    m, audit = manifest(state)
    assert offsets_of(m.offsets, "events") == first and applied_once(audit, first)  # what it learned was kept


def _outcome(call):
    try:
        return call()
    except Exception as exc:
        return exc


def test_the_worker_never_creates_the_topic_it_reads(broker, topic, group, tmp_path):
    from streamlearn.broker import wait_ready

    cfg = config(broker, group, "worker.connect_timeout_s=1.5")
    with pytest.raises(WorkerError, match=f"topic {topic!r} does not exist") as refused:
        run(cfg, topic, tmp_path / "s", until_idle_s=1.0)
    assert isinstance(refused.value.__cause__, BrokerError)
    assert str(refused.value).endswith("(the state holds no checkpoint yet)")  # a new state has none to keep
    assert topic not in wait_ready(broker) and topic + ".dlq" not in wait_ready(broker)


# ---------------------------------------------------------------------------- start-up

@pytest.mark.broker  # it starts (or looks for) brokers of its own
def test_an_unreachable_broker_ends_the_start_up_with_a_clear_error(tmp_path, group):
    cfg = config(f"127.0.0.1:{free_port()}", group, "worker.connect_timeout_s=2")
    started = time.monotonic()
    with pytest.raises(WorkerError, match=r"cannot reach a Kafka broker within 2 s: no server of 127\.0\.0\.1:\d+ "
                                          r"accepts connections.*--connect-timeout"):
        run(cfg, "t", tmp_path / "s", until_idle_s=10)
    assert time.monotonic() - started < 8


@pytest.mark.broker  # it looks for a broker that is not there
def test_a_new_worker_given_no_task_waits_for_an_unreachable_broker_once(tmp_path, group):
    """A new state given no task reads the topic's first records to tell its task; against
    a broker that cannot be reached that read is the start-up's, with its error and its one
    time limit. Was: the read waited --connect-timeout, then the fetch thread waited again."""
    cfg = config(f"127.0.0.1:{free_port()}", group, "worker.connect_timeout_s=3")
    started = time.monotonic()
    with pytest.raises(BrokerError, match=r"cannot reach a Kafka broker within 3 s: no server of 127\.0\.0\.1:\d+ "
                                          r"accepts connections.*--connect-timeout"):
        run(cfg, "t", tmp_path / "s", until_idle_s=10, given=frozenset())
    assert time.monotonic() - started < 5.5  # once: two waits take more than 6 s


def test_tls_against_a_plaintext_broker_ends_the_start_up_within_its_timeout(broker, topic, group, tmp_path):
    """A worker told to speak TLS to a plaintext listener used to hang in kafka-python's
    handshake, deaf to --connect-timeout and to a first SIGTERM; it gives up in time and
    says which setting to change."""
    create_topic(broker, topic, 1)
    cfg = config(broker, group, "worker.connect_timeout_s=2", "kafka.security_protocol=SSL")
    started = time.monotonic()
    with pytest.raises(WorkerError, match=r"gave up after 2 s: .*no TLS handshake answered "
                                          r"\(kafka.security_protocol='SSL'\).*PLAINTEXT"):
        run(cfg, topic, tmp_path / "s", until_idle_s=10)
    assert time.monotonic() - started < 8


def _worker_process(tmp_path, *args: str) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.Popen([sys.executable, "-m", "streamlearn.cli", "worker", "--state", str(tmp_path / "s"),
                             *(f"--set={o}" for o in SMALL), *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def test_the_command_exits_2_naming_the_missing_topic(broker, topic, group, tmp_path):
    proc = _worker_process(tmp_path, "--topic", topic, "--bootstrap", broker, "--group", group,
                           "--until-idle", "10", "--connect-timeout", "2")
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 2, err
    last = err.strip().splitlines()[-1]
    assert last.startswith("streamlearn worker: error: gave up after 2 s: the broker at ")
    assert f"accepts connections, but looking up topic {topic!r} failed: topic {topic!r} does not exist" in last


def _terminated_once_logged(proc: subprocess.Popen, line_part: str) -> tuple[str, str]:
    """SIGTERM to ``proc`` once its stderr logged a line holding ``line_part``: (its stdout,
    its whole stderr)."""
    err = []
    try:
        for line in proc.stderr:
            err.append(line)
            if line_part in line:
                break
        proc.send_signal(signal.SIGTERM)
        out, rest = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    return out, "".join(err) + rest


@pytest.mark.parametrize("task", [(), ("--task", "classify")], ids=["no-task", "task"])
def test_sigterm_during_start_up_says_what_was_reached(broker, topic, group, tmp_path, task):
    """Given a task, the fetch thread's start-up is stopped; given none, a new state's look-up
    of the topic for its task (consumers.warmup.topic_task): both say what they reached."""
    proc = _worker_process(tmp_path, "--topic", topic, "--bootstrap", broker, "--group", group,
                           "--connect-timeout", "60", *task)
    out, err = _terminated_once_logged(proc, "retrying in")  # start-up retries: the topic is missing
    assert proc.returncode == 0, err
    assert "during start-up" in out and f"the broker at {broker} accepts connections" in out
    assert f"topic {topic!r} does not exist" in out and "before the broker was reachable" not in out


def test_a_lone_worker_reads_without_a_group_join(broker, make_topic, group, tmp_path, caplog):
    """manual assignment: the first record is learned well before a group join could
    even complete (the join waits worker.max_poll_interval_ms for members on Tansu)."""
    topic = make_topic(3)
    ends = produce(broker, topic, stream(200, seed=5))
    cfg = config(broker, group, "worker.max_poll_interval_ms=20000")
    with caplog.at_level(logging.INFO, logger="streamlearn.consumers"):
        worker = Worker(cfg, RunOptions(topic, str(tmp_path / "s"), max_records=200))
        summary = worker.run()
    assert summary.offsets == ends and summary.saved
    messages = [r.getMessage() for r in caplog.records]
    assert any("reading all 3 partitions" in m for m in messages)
    assert not any("joining group" in m for m in messages)


# ---------------------------------------------------------------------------- dead letters

def test_dead_letters_of_a_partition_are_in_source_order(broker, make_topic, group, tmp_path, consume):
    """Records the decoder rejects and records the learner rejects (no label), interleaved
    in one batch: their letters come out in source order."""
    from kafka import KafkaProducer

    topic = make_topic(1)
    values = []
    for i in range(120):
        kind = i % 4
        values.append(b"\xc1 garbage" if kind == 1 else
                      encode({"text": "goal team"}) if kind == 2 else  # no label: rejected by the learner
                      encode({"text": "goal match", "label": "sport"}))
    producer = KafkaProducer(bootstrap_servers=broker, linger_ms=20)
    for value in values:
        producer.send(topic, value, partition=0)
    producer.flush(30)
    producer.close()
    summary = run(config(broker, group), topic, tmp_path / "s", max_records=len(values))
    assert summary.dead_letters == 60
    letters = consume(topic + ".dlq", 60)
    sources = [int(m.key.decode().rpartition(":")[2]) for m in letters]
    assert sources == sorted(i for i in range(120) if i % 4 in (1, 2))
    reasons = [dict(m.headers)["reason"].split(b":")[0] for m in letters]
    assert reasons[0] != b"missing-field" and reasons[1] == b"missing-field"
    assert msgpack.unpackb(letters[1].value) == {"text": "goal team"}


class _Future:
    def __init__(self, error=None):
        self.is_done, self.exception = True, error

    def succeeded(self):
        return self.exception is None


class _FlakyProducer:
    """kafka-python's producer as DeadLetters sees it: ``send`` fails while ``down``,
    and every letter it accepted is recorded in the order it would be written."""

    def __init__(self):
        self.down, self.written = True, []

    def send(self, topic, value, key, headers, partition):
        from kafka.errors import KafkaTimeoutError

        if self.down:
            raise KafkaTimeoutError("no metadata")
        self.written.append(key)
        return _Future()

    def flush(self, timeout):
        pass


def test_a_letter_sent_again_is_never_overtaken_by_a_later_one():
    from types import SimpleNamespace

    from streamlearn.consumers.dlq import DeadLetters

    producer = _FlakyProducer()
    letters = DeadLetters(producer, "t.dlq", partitions=1, max_bytes=1024)
    message = lambda offset: SimpleNamespace(topic="t", partition=0, offset=offset, timestamp=0, key=None,  # noqa: E731
                                             value=b"x")
    letters.send(message(1), "bad-value: x")  # the broker is down: kept
    producer.down = False
    letters.send(message(2), "bad-value: x")  # queued behind the first, not sent ahead of it
    assert producer.written == [] and letters.pending == 2
    assert letters.flush(1.0) and producer.written == [b"t:0:1", b"t:0:2"]


CLOSE_WITH_THE_BROKER_GONE = """
from types import SimpleNamespace
from streamlearn.broker import EmbeddedBroker, create_topic
from streamlearn.config import Config
from streamlearn.consumers.connect import new_producer
from streamlearn.consumers.dlq import DeadLetters

broker = EmbeddedBroker().start()
create_topic(broker.bootstrap, "t.dlq", 1)
cfg = Config().override(f"worker.bootstrap={broker.bootstrap}").worker
letters = DeadLetters(new_producer(cfg), "t.dlq", partitions=1, max_bytes=1024)
message = lambda offset: SimpleNamespace(topic="t", partition=0, offset=offset, timestamp=0, key=None, value=b"x")
letters.send(message(0), "bad-value: x")
assert letters.flush(10.0)
broker.stop()
for offset in range(1, 4):
    letters.send(message(offset), "bad-value: x")
assert letters.pending == 3
letters.close()
print("closed")
"""


@pytest.mark.broker  # it starts a broker of its own, and stops it
def test_closing_with_unconfirmed_letters_and_the_broker_gone_prints_no_traceback():
    """Was: kafka-python's close raised at its flush and left the producer open; its
    __del__ then printed 'Exception ignored ... KafkaTimeoutError' after the worker's
    summary, on every such stop."""
    run = subprocess.run([sys.executable, "-c", CLOSE_WITH_THE_BROKER_GONE], capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0 and run.stdout.strip() == "closed", run.stderr
    assert "Traceback" not in run.stderr and "Exception ignored" not in run.stderr, run.stderr


def test_a_metrics_port_in_use_is_one_line_and_exit_2(broker, make_topic, group, tmp_path):
    """Was: a traceback ending in 'OSError: [Errno 98] Address already in use', exit 1."""
    import socket

    topic = make_topic(1)
    with socket.create_server(("0.0.0.0", 0)) as taken:
        proc = _worker_process(tmp_path, "--topic", topic, "--bootstrap", broker, "--group", group,
                               "--until-idle", "2", "--metrics-port", str(taken.getsockname()[1]))
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 2, err
    assert err.strip().splitlines()[-1].startswith("streamlearn worker: error: --metrics-port ")
    assert "Traceback" not in err


@pytest.mark.broker  # it starts a broker of its own, and pauses it
def test_until_idle_does_not_end_the_run_while_the_broker_is_unreachable(group, tmp_path):
    """The broker paused (SIGSTOP: it stops answering, as a hung broker or a network
    partition does) for longer than --until-idle, and records written once it is back.
    Was: the worker stopped during the outage with exit 0, 'no new record for 3 s'."""
    broker = EmbeddedBroker().start()
    try:
        create_topic(broker.bootstrap, "events", 1)
        first = produce(broker.bootstrap, "events", stream(300, seed=5))
        worker = Worker(config(broker.bootstrap, group, "worker.log_seconds=0.2", "worker.retry_max_s=0.5"),
                        RunOptions("events", str(tmp_path / "s"), until_idle_s=3.0))
        box = {}
        thread = threading.Thread(target=lambda: box.update(result=_outcome(worker.run)))
        thread.start()
        wait_for(lambda: worker.metrics.records == first[0])
        os.kill(broker.pid, signal.SIGSTOP)
        time.sleep(7)
        os.kill(broker.pid, signal.SIGCONT)
        assert thread.is_alive(), box  # an outage is not the stream's end
        produce(broker.bootstrap, "events", stream(200, seed=6))
        thread.join(60)
        assert not thread.is_alive()
    finally:
        os.kill(broker.pid, signal.SIGCONT)
        broker.stop()
    summary = box["result"]
    assert not isinstance(summary, Exception), summary
    assert summary.offsets == {0: first[0] + 200} and worker.fetcher.broker_errors > 0


def test_sigterm_while_a_next_item_worker_waits_for_its_first_records_stops_it_saying_so(
        broker, make_topic, group, tmp_path):
    """Was: exit 143 and not a word (the handlers were installed after the worker was
    built, and a new next-item model's warm-up waits in its construction)."""
    topic = make_topic(2)
    proc = _worker_process(tmp_path, "--topic", topic, "--bootstrap", broker, "--group", group,
                           "--task", "next-item")
    out, err = _terminated_once_logged(proc, "is empty: waiting for its first records")
    assert proc.returncode == 0, err
    assert "stopped by SIGTERM during start-up" in out and "Traceback" not in err
