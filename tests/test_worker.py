"""The consumer worker against the real broker: learns a topic, checkpoints rows with offsets,
resumes from its checkpoint (never from Kafka's offsets), survives a broker that is not
there yet, checkpoints on revocation and on stop, and exports its metrics."""
import logging
import math
import random
import re
import threading
import time
import urllib.request

import numpy as np
import pytest

from streamlearn.batching import Schedule
from streamlearn.broker import EmbeddedBroker, create_topic, free_port, produce_rows
from streamlearn.checkpoint import AUDIT_NS, config_diff, read_full
from streamlearn.cli import main as cli_main
from streamlearn.config import Config
from streamlearn.consumers import RunOptions, Worker, read_audit
from streamlearn.consumers.checkpoint import AuditLog, Checkpointer, open_learner
from streamlearn.consumers.dlq import Letter
from streamlearn.consumers.handoff import CheckpointRequest, Handoff
from streamlearn.exceptions import ConfigError, StreamlearnError
from streamlearn.learner import Learner
from streamlearn.state import open_store
from tests.test_learner import topic_stream as stream

SMALL = ("model.layers=0", "embedding.K=2000", "embedding.B=256", "embedding.d=16", "model.d_model=16",
         "model.max_labels=16", "learner.batch_size=16", "store.shards=2", "store.map_size_gb=0.05",
         "store.sync=false", "worker.session_timeout_ms=2000", "worker.heartbeat_interval_ms=300",
         "worker.poll_timeout_ms=100", "worker.log_seconds=0.5", "worker.audit=true", "worker.retry_max_s=1")


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def produce(bootstrap: str, topic: str, records: list[dict]) -> dict[int, int]:
    """Write ``records``; return the count per partition (= end offsets of a fresh topic)."""
    return produce_rows(bootstrap, topic, [(None, r, None) for r in records]).per_partition


def config(bootstrap: str, group: str, *overrides: str) -> Config:
    return Config().override(*SMALL, f"worker.bootstrap={bootstrap}", f"worker.group={group}", *overrides)


def run_worker(cfg: Config, topic: str, state, **options):
    return Worker(cfg, RunOptions(topic, str(state), **options)).run()


def manifest(state):
    with open_store(state, readonly=True) as store:
        return store.manifest(), list(read_audit(store))


def offsets_of(mapping: dict, topic: str) -> dict[int, int]:
    return {int(k.rpartition(":")[2]): v for k, v in mapping.items() if k.rpartition(":")[0] == topic}


def applied_once(audit: list, ends: dict[int, int]) -> bool:
    """The audit ranges of all checkpoints cover offsets 0..end-1 of each partition exactly once."""
    seen = {p: np.zeros(end, dtype=np.int64) for p, end in ends.items()}
    for _, ranges in audit:
        for partition, first, last, count in ranges:
            assert count == last - first + 1
            seen[partition][first:last + 1] += 1
    return all((hits == 1).all() for hits in seen.values())


# ---------------------------------------------------------------------------- end to end

def test_learns_a_topic_and_checkpoints_rows_with_offsets(broker, make_topic, group, tmp_path):
    topic = make_topic(2)
    ends = produce(broker, topic, stream(600))
    cfg = config(broker, group, "worker.checkpoint_every=200", "worker.eval_every=1")
    summary = run_worker(cfg, topic, tmp_path / "s", until_idle_s=1.0)
    assert (summary.records, summary.learned, summary.dead_letters, summary.saved) == (600, 600, 0, True)
    assert summary.offsets == ends
    m, audit = manifest(tmp_path / "s")
    assert offsets_of(m.offsets, topic) == ends and offsets_of(m.records_applied, topic) == ends
    assert m.commits >= 3 and m.metrics["records_learned"] == 600  # every 200 records, then at the end
    assert m.metrics["prequential_accuracy"] > 0.6  # 3 separable classes: chance is 1/3
    assert applied_once(audit, ends)
    with open_store(tmp_path / "s", readonly=True) as store:
        learner = read_full(store)
    assert sorted(learner.labels) == ["food", "sport", "tech"]
    assert learner.predict_many([{"text": "goal match team"}, {"text": "pasta soup bread"}]) == ["sport", "food"]


def test_event_time_is_the_records_ts_else_the_kafka_timestamp(broker, make_topic, group, tmp_path):
    """The worker tells how stale its data is: newest event time learned, from ``ts`` or,
    for records without one, from the Kafka timestamp the broker stamped."""
    topic = make_topic(1)
    hour_ago = int(time.time() * 1000) - 3_600_000
    produce(broker, topic, [dict(r, ts=hour_ago + i) for i, r in enumerate(stream(100))])
    cfg = config(broker, group)
    worker = Worker(cfg, RunOptions(topic, str(tmp_path / "s"), until_idle_s=1.0))
    assert worker.run().learned == 100
    assert 3_590 < worker.metrics.event_lag_s() < 3_700
    assert manifest(tmp_path / "s")[0].metrics["newest_event_ms"] == hour_ago + 99
    assert 3_590 < worker.metrics.registry.get_sample_value("streamlearn_worker_event_time_lag_seconds") < 3_700

    produce(broker, topic, stream(100, seed=1))  # no ts: the Kafka timestamp (now) stands in
    worker = Worker(cfg, RunOptions(topic, str(tmp_path / "s"), until_idle_s=1.0))
    assert worker.run().learned == 100
    assert 0 <= worker.metrics.event_lag_s() < 60


def test_event_time_and_the_gauges_come_from_learned_records_and_survive_a_restart(broker, make_topic, group,
                                                                                  tmp_path):
    """Was: a dead-lettered record without ts (here a missing label) set the newest event
    time to its Kafka timestamp, so an hour-old model read as seconds old; and a worker
    restarted on an idle topic exported event_time_lag_seconds 0 and loss 0 (fresh and
    perfect), then wrote nulls over the stored loss and event time at its checkpoint."""
    topic = make_topic(1)
    hour_ago = int(time.time() * 1000) - 3_600_000
    produce(broker, topic, [dict(r, ts=hour_ago + i) for i, r in enumerate(stream(100))])
    cfg = config(broker, group)
    run_worker(cfg, topic, tmp_path / "s", until_idle_s=1.0)
    stored = manifest(tmp_path / "s")[0].metrics
    assert stored["newest_event_ms"] == hour_ago + 99 and stored["loss"] > 0

    produce(broker, topic, [{"text": "no label here"}])
    worker = Worker(cfg, RunOptions(topic, str(tmp_path / "s"), until_idle_s=1.0))
    sample = worker.metrics.registry.get_sample_value
    assert 3_590 < sample("streamlearn_worker_event_time_lag_seconds") < 3_700  # carried from the state
    assert sample("streamlearn_worker_loss") == pytest.approx(stored["loss"])
    summary = worker.run()
    assert (summary.learned, summary.dead_letters) == (0, 1)
    assert 3_590 < sample("streamlearn_worker_event_time_lag_seconds") < 3_700
    after = manifest(tmp_path / "s")[0].metrics
    assert after["newest_event_ms"] == hour_ago + 99 and after["loss"] == pytest.approx(stored["loss"])


def test_a_new_worker_reads_no_figure_as_nan_not_zero(tmp_path):
    from streamlearn.consumers.metrics import WorkerMetrics

    sample = WorkerMetrics(1.0).registry.get_sample_value
    assert math.isnan(sample("streamlearn_worker_loss"))
    assert math.isnan(sample("streamlearn_worker_event_time_lag_seconds"))


def test_records_of_skipped_steps_are_not_counted_as_learned(broker, make_topic, group, tmp_path):
    """Was: learning rates that blow the model up skipped most steps ("nothing was
    updated"), yet records_learned, the summary and the manifest counted every accepted
    record as learned, and the loss gauge kept the last good step's value."""
    topic = make_topic(1)
    produce(broker, topic, stream(160))
    cfg = config(broker, group, "optim.dense_lr=1e30", "optim.sparse_lr=1e30")
    worker = Worker(cfg, RunOptions(topic, str(tmp_path / "s"), until_idle_s=1.0))
    summary = worker.run()
    assert worker.metrics.skipped_steps > 0 and summary.skipped > 0
    assert summary.learned + summary.skipped == 160 and f"{summary.skipped} in SKIPPED STEPS" in str(summary)
    sample = worker.metrics.registry.get_sample_value
    assert sample("streamlearn_worker_records_learned_total") == summary.learned
    assert manifest(tmp_path / "s")[0].metrics["records_learned"] == summary.learned
    assert math.isnan(sample("streamlearn_worker_loss"))  # the last step was skipped: no loss to show


def test_the_lag_of_a_partition_taken_away_is_no_longer_exported():
    """Was: after a rebalance the worker kept exporting the lag it last saw for partitions
    another worker now holds (5,133 records of lag that was not there, in a sum)."""
    from streamlearn.consumers.metrics import WorkerMetrics

    metrics = WorkerMetrics(0.0)
    sample = metrics.registry.get_sample_value
    metrics.status({0: 5, 1: 5, 2: 5, 3: 5}, {0: 10, 1: 10, 2: 2604, 3: 2539})
    assert sample("streamlearn_worker_lag_records", {"partition": "2"}) == 2599
    metrics.status({0: 10, 1: 10}, {0: 10, 1: 10})
    assert sample("streamlearn_worker_lag_records", {"partition": "2"}) is None
    assert sample("streamlearn_worker_lag_records", {"partition": "3"}) is None
    assert sample("streamlearn_worker_lag_records", {"partition": "0"}) == 0


def logged_run(broker: str, topic: str, group: str, tmp_path, caplog, records: list[dict],
               *overrides: str) -> tuple[Worker, list[str]]:
    """A worker that evaluates every batch and logs its status line every 50 ms, run on
    ``topic`` holding ``records`` until it is idle: the worker and its status lines."""
    produce(broker, topic, records)
    cfg = config(broker, group, "worker.eval_every=1", "worker.log_seconds=0.05", *overrides)
    worker = Worker(cfg, RunOptions(topic, str(tmp_path / "s"), until_idle_s=1.0))
    with caplog.at_level(logging.INFO, logger="streamlearn.consumers"):
        assert worker.run().learned == len(records)
    return worker, [r.getMessage() for r in caplog.records if "records/s, lag" in r.getMessage()]


def test_a_token_task_logs_its_loss_before_learning_against_popularity(broker, make_topic, group, tmp_path, caplog,
                                                                       capsys):
    """A token task's prequential check is a loss, not an accuracy: the status line and the
    gauges give the model's nats per answer before learning beside the popularity
    baseline's, never an accuracy that would read n/a for the whole run."""
    worker, lines = logged_run(broker, make_topic(1), group, tmp_path, caplog,
                               [{"text": r["text"]} for r in stream(300)], "learner.task=next-token")
    assert lines and not any("accuracy" in line for line in lines), lines
    model, base = re.search(r"recent loss before learning (\d+\.\d+) nats, popularity (\d+\.\d+)",
                            lines[-1]).groups()
    sample = worker.metrics.registry.get_sample_value
    assert float(model) == pytest.approx(sample("streamlearn_worker_prequential_loss"), abs=1e-4)
    assert float(base) == pytest.approx(sample("streamlearn_worker_prequential_baseline_loss"), abs=1e-4)
    assert 0 < float(model) < float(base)  # the words of a topic come back: the model beats popularity
    assert math.isnan(sample("streamlearn_worker_prequential_accuracy"))  # no accuracy to report: NaN, not 0
    stored = manifest(tmp_path / "s")[0].metrics  # and the shutdown checkpoint keeps them, as inspect shows
    assert stored["prequential_baseline"] == "popularity" and stored["prequential_accuracy"] is None
    assert stored["prequential_loss"] == pytest.approx(float(model), abs=1e-4)
    assert cli_main(["inspect", "--state", str(tmp_path / "s")]) == 0
    assert f"check    prequential loss before learning, recent (moving average of the last ~20 evaluated " \
           f"batches) {model} nats per answer; popularity {base}" in capsys.readouterr().out


def test_a_classifier_logs_its_prequential_accuracy(broker, make_topic, group, tmp_path, caplog):
    worker, lines = logged_run(broker, make_topic(1), group, tmp_path, caplog, stream(300))
    accuracy = float(re.search(r"recent accuracy (\d\.\d+) \(prequential", lines[-1]).group(1))
    assert accuracy == pytest.approx(worker.metrics.registry.get_sample_value(
        "streamlearn_worker_prequential_accuracy"), abs=1e-4)
    for name in ("prequential_loss", "prequential_baseline_loss"):  # not a figure of this task: NaN, not 0
        assert math.isnan(worker.metrics.registry.get_sample_value(f"streamlearn_worker_{name}")), name


def batch_sizes_of_run(cfg: Config, topic: str, state) -> list[int]:
    """The records of each mini-batch a worker learns in one run until the topic is idle
    (the empty batch that carries the start positions left out)."""
    worker = Worker(cfg, RunOptions(topic, str(state), until_idle_s=1.0))
    sizes, learn, scored = [], worker.learner.learn_batch, worker.learner.learn_batch_scored
    worker.learner.learn_batch = lambda batch: (sizes.append(batch.records), learn(batch))[1]
    worker.learner.learn_batch_scored = lambda batch, check: (sizes.append(batch.records),
                                                             scored(batch, check))[1]  # evaluated batches
    worker.run()
    return [n for n in sizes if n]


def test_a_new_model_learns_its_first_records_one_then_two_then_four(broker, make_topic, group, tmp_path):
    """A new model's first mini-batches take 1, 2, 4, ... records up to learner.batch_size
    (Schedule), so it answers from its first record on; a model restored from its
    checkpoint is past that and learns whole batches from its first step."""
    topic = make_topic(1)
    produce(broker, topic, stream(100, seed=5))
    cfg = config(broker, group)

    first = batch_sizes_of_run(cfg, topic, tmp_path / "s")
    assert first[:5] == [1, 2, 4, 8, 16] and sum(first) == 100
    produce(broker, topic, stream(64, seed=6))
    second = batch_sizes_of_run(cfg, topic, tmp_path / "s")
    assert second[0] == 16 and sum(second) == 64


def test_the_batch_doubles_from_learner_double_batch_after_on_across_a_restart(broker, make_topic, group,
                                                                               tmp_path):
    """From step ``learner.double_batch_after`` on a step takes twice learner.batch_size
    records (next-token's default: a warm model learns more records a second at no cost);
    a model restored past that step learns doubled batches from its first step."""
    topic = make_topic(1)
    produce(broker, topic, stream(100, seed=5))
    cfg = config(broker, group, "learner.double_batch_after=5")

    # steps 0-4: the ramp to 16, then 32
    assert batch_sizes_of_run(cfg, topic, tmp_path / "s") == [1, 2, 4, 8, 16, 32, 32, 5]
    produce(broker, topic, stream(64, seed=6))
    assert batch_sizes_of_run(cfg, topic, tmp_path / "s") == [32, 32]


def test_restart_seeks_to_the_checkpoint_not_to_kafka_offsets(broker, make_topic, group, tmp_path):
    from kafka import KafkaConsumer, TopicPartition
    from kafka.structs import OffsetAndMetadata

    topic = make_topic(3)
    ends = produce(broker, topic, stream(500, seed=1))
    cfg = config(broker, group, "worker.checkpoint_every=1000000")
    first = run_worker(cfg, topic, tmp_path / "s", max_records=170)
    assert first.records == 170 and first.saved
    # Kafka's committed offsets say "all consumed"; the worker must ignore them.
    admin = KafkaConsumer(bootstrap_servers=broker, group_id=group, enable_auto_commit=False)
    tps = [TopicPartition(topic, p) for p in ends]
    admin.assign(tps)
    admin.commit({tp: OffsetAndMetadata(ends[tp.partition], "", -1) for tp in tps})
    admin.close()
    second = run_worker(cfg, topic, tmp_path / "s", until_idle_s=1.0)
    assert second.records == 330 and second.offsets == ends
    m, audit = manifest(tmp_path / "s")
    assert m.commits == 2 and offsets_of(m.records_applied, topic) == ends
    assert applied_once(audit, ends)


def test_next_item_histories_follow_the_stream_across_a_restart(broker, make_topic, group, tmp_path):
    # A key's history is the same whatever the batching, so any record applied twice or
    # skipped across the restart would show in it.
    rng = random.Random(8)
    events = [(f"u{rng.randrange(12)}", f"item{rng.randrange(40)}") for _ in range(600)]
    topic = make_topic(3)
    produce_rows(broker, topic, [(user.encode(), {"key": user, "item": item}, None) for user, item in events])
    cfg = config(broker, group, "learner.task=next-item", "learner.history=5", "model.out_B=256",
                 "worker.checkpoint_every=100")
    assert run_worker(cfg, topic, tmp_path / "s", max_records=250).records == 250
    assert run_worker(cfg, topic, tmp_path / "s", until_idle_s=1.0).records == 350
    with open_store(tmp_path / "s", readonly=True) as store:
        learner = read_full(store)
    expected: dict[str, list[str]] = {}
    for user, item in events:
        expected.setdefault(user, []).append(item)
    assert {u: list(learner.histories.get(u)) for u in expected} == {u: items[-5:] for u, items in expected.items()}
    assert learner.topk_many([{"key": "u1"}], k=3)[0].tokens  # it answers from the restored state


@pytest.mark.broker
def test_waits_for_a_broker_that_is_not_there_yet(tmp_path, group, caplog):
    port = free_port()
    cfg = config(f"127.0.0.1:{port}", group, "worker.connect_timeout_s=60")  # start-up gives up after it
    worker = Worker(cfg, RunOptions("late", str(tmp_path / "s"), until_idle_s=1.5))
    result = {}
    thread = threading.Thread(target=lambda: result.update(summary=worker.run()))
    with caplog.at_level(logging.WARNING, logger="streamlearn.consumers"):
        thread.start()
        # It logs its attempts while the broker is away: two of them, then the broker comes.
        wait_for(lambda: len(retries(caplog)) >= 2, timeout_s=60)
        assert thread.is_alive()
        with EmbeddedBroker(port=port) as late:
            create_topic(late.bootstrap, "late", 2)
            ends = produce(late.bootstrap, "late", stream(120, seed=2))
            thread.join(60)
    assert not thread.is_alive()
    assert result["summary"].records == 120 and result["summary"].offsets == ends
    assert offsets_of(manifest(tmp_path / "s")[0].offsets, "late") == ends


def retries(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if "retrying in" in r.getMessage()]


@pytest.mark.broker
def test_a_broker_outage_mid_run_loses_nothing(tmp_path, group, caplog):
    import os
    import signal

    with EmbeddedBroker() as own:  # its own broker: this test freezes it
        create_topic(own.bootstrap, "outage", 2)
        first = produce(own.bootstrap, "outage", stream(200, seed=6))
        worker = Worker(config(own.bootstrap, group, "worker.log_seconds=0.3"), RunOptions("outage", str(tmp_path / "s")))
        result = {}
        thread = threading.Thread(target=lambda: result.update(summary=worker.run()))
        with caplog.at_level(logging.INFO, logger="streamlearn.consumers"):
            thread.start()
            wait_for(lambda: worker.metrics.records >= 200)
            os.kill(own.pid, signal.SIGSTOP)  # connections stay open, nothing answers
            try:
                wait_for(lambda: worker.fetcher.broker_errors >= 2, timeout_s=30)
                assert thread.is_alive()
            finally:
                os.kill(own.pid, signal.SIGCONT)
            second = produce(own.bootstrap, "outage", stream(200, seed=7))
            wait_for(lambda: worker.metrics.records >= 400, timeout_s=60)
            worker.stop()
            thread.join(20)
    ends = {p: first.get(p, 0) + second.get(p, 0) for p in (0, 1)}
    assert result["summary"].records == 400 and result["summary"].offsets == ends
    assert any("unreachable" in r.getMessage() for r in caplog.records)
    m, audit = manifest(tmp_path / "s")
    assert offsets_of(m.offsets, "outage") == ends and applied_once(audit, ends)


def test_stop_writes_a_final_checkpoint_of_everything_learned(broker, make_topic, group, tmp_path):
    topic = make_topic(1)
    produce(broker, topic, stream(3000, seed=3))
    port = free_port()
    cfg = config(broker, group, "worker.checkpoint_every=1000000", "worker.checkpoint_seconds=1000")
    worker = Worker(cfg, RunOptions(topic, str(tmp_path / "s"), metrics_port=port))
    # The training loop holds in its 14th step until the stop is asked, so the stop lands
    # mid-stream with prepared batches queued behind it, however fast the machine.
    release = threading.Event()

    def hold(learner) -> None:
        if learner.steps == 13:
            release.wait(60)
    worker.learner.gradient_hook = hold
    result = {}
    thread = threading.Thread(target=lambda: result.update(summary=worker.run()))
    thread.start()
    held = sum(Schedule(16).size(s) for s in range(13))  # 1 + 2 + 4 + 8, then 16 per step
    text = scrape_until(port, lambda t: metric(t, "streamlearn_worker_records_total") >= held)
    assert metric(text, "streamlearn_worker_records_total") == held  # held at step 14
    for name in ("streamlearn_worker_records_per_second", "streamlearn_worker_loss",
                 "streamlearn_worker_prequential_accuracy", "streamlearn_worker_checkpoint_seconds_count",
                 "streamlearn_worker_steps_total", "streamlearn_worker_broker_errors_total"):
        assert name in text, name
    worker.stop()
    release.set()
    thread.join(10)
    assert not thread.is_alive()
    summary = result["summary"]
    # Learned: the 14 steps, the batches queued when the stop came; never the whole topic
    # (the queue holds worker.queue_batches=16 batches of 16).
    assert summary.saved and 14 * 16 <= summary.records < 3000
    m, audit = manifest(tmp_path / "s")
    assert m.commits == 1  # only the final checkpoint, and it holds everything consumed
    assert offsets_of(m.offsets, topic) == {0: summary.records} == offsets_of(m.records_applied, topic)
    assert applied_once(audit, {0: summary.records})


def metric(text: str, name: str) -> float:
    values = [float(line.split()[-1]) for line in text.splitlines() if line.startswith(name + " ")]
    return values[0] if values else 0.0


def scrape_until(port: int, ready, timeout_s: float = 30.0) -> str:
    deadline, text = time.monotonic() + timeout_s, ""
    while time.monotonic() < deadline:
        try:
            text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).read().decode()
            if ready(text):
                return text
        except OSError:
            pass
        time.sleep(0.1)
    raise AssertionError(f"metrics never got ready:\n{text[-2000:]}")


def test_revocation_checkpoints_before_the_partitions_move(broker, make_topic, group, tmp_path, caplog):
    topic = make_topic(2)
    producing = threading.Event()
    producer = threading.Thread(target=trickle, args=(broker, topic, producing))
    # two lone workers in one group, each with its own state: they share the partitions
    cfg = config(broker, group, "worker.checkpoint_every=1000000", "worker.checkpoint_seconds=1000",
                 "worker.assignment=group")
    a = Worker(cfg, RunOptions(topic, str(tmp_path / "a")))
    b = Worker(cfg, RunOptions(topic, str(tmp_path / "b")))
    runs = {}
    threads = [threading.Thread(target=lambda w=w, n=n: runs.update({n: w.run()})) for n, w in (("a", a), ("b", b))]
    with caplog.at_level(logging.INFO, logger="streamlearn.consumers"):
        producing.set()
        producer.start()
        threads[0].start()
        wait_for(lambda: a.fetcher.consumed >= 100, timeout_s=60)
        threads[1].start()  # joining makes the group take a partition from a
        wait_for(lambda: b.fetcher.consumed >= 100, timeout_s=60)
        producing.clear()
        for worker, thread in ((b, threads[1]), (a, threads[0])):
            worker.stop()
            thread.join(20)
    producer.join(10)
    revokes = [r.getMessage() for r in caplog.records if r.getMessage().startswith("revoke checkpoint")]
    assert revokes, "a did not checkpoint when its partitions were revoked"
    for name in ("a", "b"):
        m, audit = manifest(tmp_path / name)
        offsets = offsets_of(m.offsets, topic)
        assert applied_once(audit, offsets)  # each state: every offset once, across reassignments
        assert sum(offsets_of(m.records_applied, topic).values()) == runs[name].records  # nothing lost


def trickle(bootstrap: str, topic: str, running: threading.Event) -> None:
    seed = 100
    while running.is_set():
        produce(bootstrap, topic, stream(40, seed=seed))
        seed += 1
        time.sleep(0.05)


def wait_for(condition, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition never held"
        time.sleep(0.05)


def test_the_command_consumes_and_exits_0(broker, make_topic, group, tmp_path, consume):
    from streamlearn.cli import main

    topic = make_topic(1)
    produce(broker, topic, stream(100, seed=5) + [{"text": "x", "label": "a"}])
    code = main(["worker", "--topic", topic, "--state", str(tmp_path / "s"), "--bootstrap", broker,
                 "--group", group, "--until-idle", "1", *(f"--set={o}" for o in SMALL),
                 "--set", "model.max_labels=3", "--checkpoint-every", "50"])
    assert code == 0
    m, audit = manifest(tmp_path / "s")
    assert offsets_of(m.offsets, topic) == {0: 101} and m.commits >= 2
    assert m.metrics["dead_letters"] == 1  # the 4th label does not fit model.max_labels=3
    (letter,) = consume(topic + ".dlq", 1)
    assert dict(letter.headers)["reason"].startswith(b"label-capacity")


def test_a_new_worker_given_no_task_takes_the_task_its_topic_says(broker, make_topic, group, tmp_path, caplog):
    """Was: classify, and every record of a next-item topic went to the dead-letter topic
    ("missing-field"), its offsets committed past them. The settings given still hold; a
    text topic without labels stops at start-up asking which token task; a stored model
    keeps its own task, whatever the topic holds."""
    sets = [f"--set={o}" for o in ("embedding.K=1000", "embedding.B=100", "model.layers=0", "model.d_model=16",
                                    "embedding.d=16", "store.shards=2", "store.map_size_gb=0.05")]

    def worker(topic: str, state: str, *more: str) -> int:
        return cli_main(["worker", "--topic", topic, "--state", str(tmp_path / state), "--bootstrap", broker,
                         "--group", f"{group}-{state}", "--until-idle", "1", *sets, *more])

    items = make_topic(1)
    produce(broker, items, [{"key": f"u{i % 5}", "item": f"i{(i * 3) % 11}"} for i in range(60)])
    with caplog.at_level(logging.INFO, logger="streamlearn.consumers"):
        assert worker(items, "ni") == 0
    assert any("so this new model is next-item" in r.getMessage() for r in caplog.records)
    m, _ = manifest(tmp_path / "ni")
    assert m.config["learner"]["task"] == "next-item" and m.config["embedding"]["B"] == 100
    assert m.metrics["dead_letters"] == 0 and m.metrics["records_learned"] == 60

    text = make_topic(1)
    produce(broker, text, [{"text": "the cat sat on the mat"}] * 5)
    assert worker(text, "tx") == 2  # asked, at start-up, before a record is consumed
    assert worker(text, "tx", "--task", "next-token") == 0  # the empty state it left is a new model still
    assert manifest(tmp_path / "tx")[0].metrics["records_learned"] == 5
    assert worker(text, "tx", "--reset") == 2  # asked before the reset: the model stays where it was
    assert manifest(tmp_path / "tx")[0].metrics["records_learned"] == 5
    assert not [p.name for p in (tmp_path / "tx").iterdir() if p.name.startswith("discarded")]

    labelled = make_topic(1)
    produce(broker, labelled, [{"text": "free prize", "label": "spam"}, {"text": "hi mum", "label": "ham"}])
    assert worker(labelled, "cl") == 0
    assert manifest(tmp_path / "cl")[0].config["learner"]["task"] == "classify"
    produce(broker, labelled, [{"key": "u1", "item": "i1"}])  # a stored model's task is not the topic's to change
    assert worker(labelled, "cl") == 0
    m, _ = manifest(tmp_path / "cl")
    assert m.config["learner"]["task"] == "classify" and m.metrics["dead_letters"] == 1


# ---------------------------------------------------------------------------- settings and state

def small_state(path, *overrides: str) -> None:
    cfg = Config().override(*SMALL, *overrides)
    with open_store(path, cfg.store) as store:
        learner = open_learner(store, cfg)
        learner.learn_many(stream(16))
        Checkpointer(store, learner, "t").commit({}, cfg)


def test_a_restarted_worker_keeps_the_stored_model_keys_it_is_not_given(broker, make_topic, group, tmp_path, caplog,
                                                                          capsys):
    """A worker restarted without its first run's --task and --set (or after an upgrade
    moved a default) resumes the stored model: every model key it is not given keeps its
    stored value, logged; one given with another value is refused, naming it."""
    from streamlearn.cli import main

    rng = random.Random(3)
    topic = make_topic(1)
    produce_rows(broker, topic, [(None, {"key": f"u{rng.randrange(8)}", "item": f"i{rng.randrange(30)}"}, None)
                                 for _ in range(300)])
    args = ["worker", "--topic", topic, "--state", str(tmp_path / "s"), "--bootstrap", broker, "--group", group,
            "--until-idle", "1", *(f"--set={o}" for o in SMALL), "--set=model.out_B=256"]
    assert main([*args, "--task", "next-item", "--set=learner.recency=1", "--max-records", "150"]) == 0
    with caplog.at_level(logging.INFO, logger="streamlearn"):
        assert main(args) == 0  # no --task, recency at today's default
    assert "learner.recency=1 (the default now: 3)" in caplog.text  # the value used, then the default
    assert f"no task given: {tmp_path / 's'} holds a next-item model" in caplog.text
    m, _ = manifest(tmp_path / "s")
    assert offsets_of(m.offsets, topic) == {0: 300}  # it resumed at record 150 and learned the rest
    assert m.config["learner"]["task"] == "next-item" and m.config["learner"]["recency"] == 1
    capsys.readouterr()
    assert main([*args, "--set=learner.recency=2"]) == 2  # given, and not the stored value: refused
    assert "learner.recency 1 -> 2" in capsys.readouterr().err


def test_a_state_trained_with_another_model_config_is_refused_clearly(tmp_path):
    small_state(tmp_path / "s", "model.layers=0")
    cfg = Config().override(*SMALL, "model.layers=1", "model.heads=2", "model.ffn=32")
    with open_store(tmp_path / "s", cfg.store) as store:
        with pytest.raises(StreamlearnError, match=r"model.layers 0 -> 1.*same --config/--set"):
            open_learner(store, cfg)
    same = Config().override(*SMALL, "optim.sparse_lr=0.01")  # a learning rate may change
    with open_store(tmp_path / "s", same.store) as store:
        assert open_learner(store, same).steps == 1


@pytest.mark.parametrize("overrides, options, message", [
    (["worker.checkpoint_every=0"], {}, "worker.checkpoint_every must be >= 1"),
    (["worker.dlq_suffix="], {}, "worker.dlq_suffix must be 1\\+ of A-Z"),
    (["worker.queue_batches=0"], {}, "worker.queue_batches"),
    ([], {"max_records": 0}, "--max-records must be >= 1"),
    ([], {"until_idle_s": -1.0}, "--until-idle must be > 0"),
])
def test_bad_settings_say_what_to_change(tmp_path, overrides, options, message):
    with pytest.raises(ConfigError, match=message):
        Worker(Config().override(*SMALL, *overrides), RunOptions("t", str(tmp_path / "s"), **options))
    assert not (tmp_path / "s").exists()  # refused before the state directory is created


def test_the_command_reports_bad_settings_with_exit_2(tmp_path, capsys):
    from streamlearn.cli import main

    code = main(["worker", "--topic", "t", "--state", str(tmp_path / "s"), "--set", "model.layerz=1"])
    assert code == 2 and "unknown key model.layerz" in capsys.readouterr().err


# ---------------------------------------------------------------------------- pieces

def test_audit_merges_contiguous_spans_and_keeps_gaps():
    log = AuditLog()
    log.add({0: (0, 9, 10), 1: (0, 4, 5)})
    log.add({0: (10, 19, 10)})
    log.add({0: (25, 27, 3)})  # a gap (e.g. compaction): a new range
    log.add({1: (5, 9, 4)})  # offsets missing inside: not merged
    assert log.ranges == [[0, 0, 19, 20], [1, 0, 4, 5], [0, 25, 27, 3], [1, 5, 9, 4]]


def test_audit_ranges_are_committed_with_the_checkpoint(tmp_path):
    cfg = Config().override(*SMALL)
    with open_store(tmp_path / "s", cfg.store) as store:
        learner = Learner(cfg)
        ckpt = Checkpointer(store, learner, "t", audit=True)
        from streamlearn.consumers.handoff import Prepared

        item = Prepared(learner.prepare(stream(4)), {0: (0, 3, 4)})
        learner.learn_batch(item.batch)
        ckpt.note(item, learned=4)
        ckpt.commit({}, cfg)
        assert list(read_audit(store)) == [(1, [(0, 0, 3, 4)])]
        assert dict(store.iter_kv(AUDIT_NS)) and store.manifest().offsets == {"t:0": 4}


def test_handoff_never_blocks_after_close():
    handoff = Handoff(1)
    assert handoff.put("a")
    request = CheckpointRequest("interval")
    threading.Timer(0.2, handoff.close).start()
    assert handoff.put(request) is False  # full queue, then closed: gives up
    assert handoff.wait(request, timeout_s=5) is False


def test_letters_cut_to_size_keep_their_origin():
    letter = Letter(b"t:0:5", b"x" * 100, (("reason", b"too-large: ..."), ("source", b"t:0:5"),
                                           ("key", b"k" * 50)), 0)
    cut = letter.cut(10)
    assert cut.value == b"x" * 10 and dict(cut.headers)["truncated-from"] == b"100"
    assert cut.cut(5).headers.count(("truncated-from", b"100")) == 1  # the original size stays
    assert {k for k, _ in letter.minimal().headers} == {"reason", "source"}
    assert letter.cut(1000) is letter


def test_config_diff_names_model_keys_not_connection_settings():
    new = Config().override("model.layers=2", "kafka.client_id=edge-7", "worker.group=other", "optim.sparse_lr=0.05",
                            "learner.batch_size=2")  # the run keys may change: not named either
    assert config_diff(Config(), new) == "model.layers 0 -> 2"


def test_a_worker_restarted_at_the_end_of_its_partitions_reports_no_negative_lag(broker, make_topic, group, tmp_path,
                                                                                 caplog):
    """Was: "NEGATIVE lag ... the broker lost records" and a negative gauge on every restart
    at the end of a log written in several batches: the broker's ListOffsets gives the last
    batch's base offset + 1 until a fetch brings the exact high watermark."""
    topic = make_topic(2)
    for seed in range(3):  # three produce calls: several batches per partition
        produce(broker, topic, stream(60, seed=seed))
    cfg = config(broker, group, "worker.log_seconds=0.05")
    assert run_worker(cfg, topic, tmp_path / "s", until_idle_s=1.0).learned == 180
    with caplog.at_level(logging.INFO, logger="streamlearn.consumers"):
        worker = Worker(cfg, RunOptions(topic, str(tmp_path / "s"), until_idle_s=1.5))
        assert worker.run().learned == 0
    assert not [r.getMessage() for r in caplog.records if "NEGATIVE" in r.getMessage()]
    lines = [r.getMessage() for r in caplog.records if "records/s, lag" in r.getMessage()]
    known = [line for line in lines if "records/s, lag ?" not in line]  # '?': a line before the log's ends are read
    assert known and all(re.search(r"records/s, lag 0\b", line) for line in known), lines
    for p in range(2):
        assert worker.metrics.registry.get_sample_value("streamlearn_worker_lag_records", {"partition": str(p)}) == 0


def test_the_last_checkpoint_time_is_the_states_from_the_start(broker, make_topic, group, tmp_path):
    """Was 0 until the restarted worker wrote its own first checkpoint, so the alert of
    operations.md (time() - last checkpoint) fired after every restart."""
    topic = make_topic(1)
    produce(broker, topic, stream(100, seed=3))
    cfg = config(broker, group)
    run_worker(cfg, topic, tmp_path / "s", until_idle_s=1.0)
    committed_at = manifest(tmp_path / "s")[0].committed_at
    worker = Worker(cfg, RunOptions(topic, str(tmp_path / "s"), until_idle_s=1.0))
    try:
        got = worker.metrics.registry.get_sample_value("streamlearn_worker_last_checkpoint_timestamp_seconds")
        assert got == pytest.approx(committed_at)
    finally:
        worker.store.close()


def test_a_model_trained_on_another_topic_is_named_in_a_warning(broker, make_topic, group, tmp_path, caplog):
    """Was: a --topic naming another real topic trained the stored model on that stream
    without a word."""
    first, second = make_topic(1), make_topic(1)
    produce(broker, first, stream(50, seed=3))
    produce(broker, second, stream(50, seed=4))
    cfg = config(broker, group)
    run_worker(cfg, first, tmp_path / "s", until_idle_s=1.0)
    with caplog.at_level(logging.WARNING, logger="streamlearn.consumers"):
        run_worker(cfg, second, tmp_path / "s", until_idle_s=1.0)
        run_worker(cfg, second, tmp_path / "s", until_idle_s=1.0)  # it has offsets of this topic now: no warning
    warned = [r.getMessage() for r in caplog.records if "never on" in r.getMessage()]
    assert len(warned) == 1 and f"trained on topic(s) {first!r}, never on {second!r}" in warned[0]


def test_postponed_checkpoints_are_counted(broker, make_topic, group, tmp_path):
    """Was: a checkpoint put off (dead letters the broker had not confirmed) was only a log
    line; no metric showed a worker that had not checkpointed for minutes."""
    topic = make_topic(1)
    produce(broker, topic, stream(20, seed=3))
    worker = Worker(config(broker, group), RunOptions(topic, str(tmp_path / "s"), until_idle_s=1.0))
    worker.fetcher.postponed = 2  # two checkpoints the fetch thread put off, as it counts them
    worker.run()
    assert worker.metrics.registry.get_sample_value("streamlearn_worker_checkpoints_postponed_total") == 2


def test_records_cut_to_max_tokens_are_logged_once_and_counted(broker, make_topic, group, tmp_path, caplog):
    """Was: a text past hashing.max_tokens lost its tail without a word anywhere (the
    learner counted it and nothing read the count)."""
    topic = make_topic(1)
    long_text = " ".join(f"w{i}" for i in range(40))  # 40 words and 39 bigrams: 79 tokens
    produce(broker, topic, [dict(r, text=long_text) if i % 10 == 0 else r for i, r in enumerate(stream(100))])
    cfg = config(broker, group, "hashing.max_tokens=64")
    worker = Worker(cfg, RunOptions(topic, str(tmp_path / "s"), until_idle_s=1.0))
    with caplog.at_level(logging.WARNING, logger="streamlearn.consumers"):
        assert worker.run().learned == 100
    cuts = [r.getMessage() for r in caplog.records if "hashing.max_tokens=64" in r.getMessage()]
    assert len(cuts) == 1, cuts
    assert worker.metrics.registry.get_sample_value("streamlearn_worker_records_truncated_total") == 10
    # restarted with today's default (4,096) the state keeps its 64, and the warning says so
    # (was: "hashing.max_tokens=4096", the run's value, while the model cut at 64)
    produce(broker, topic, [{"text": long_text, "label": "a"}] * 5)
    caplog.clear()
    again = Worker(config(broker, group), RunOptions(topic, str(tmp_path / "s"), until_idle_s=1.0,
                                                     given=frozenset({"worker.bootstrap", "worker.group"})))
    with caplog.at_level(logging.WARNING, logger="streamlearn.consumers"):
        assert again.run().learned == 5
    cuts = [r.getMessage() for r in caplog.records if "cut to their first" in r.getMessage()]
    assert len(cuts) == 1 and "hashing.max_tokens=64" in cuts[0], cuts
