"""Sizes derived from the stream (streamlearn.sizing): the distinct-count sketch, the rule,
and replay and the worker sizing a new next-item model from its warm-up window, storing
how, reusing the stored size on a restart and refusing a different one."""
import json
import subprocess
import sys

import pytest

from streamlearn.broker import produce_rows
from streamlearn.checkpoint import read_full, stored_config, stored_sizing
from streamlearn.cli import main
from streamlearn.config import Config
from streamlearn.consumers import RunOptions, Worker
from streamlearn.exceptions import CheckpointMismatchError
from streamlearn.learner import Learner
from streamlearn.replay import FileSource, ReplayOptions, replay
from streamlearn.sizing import OUT_B_MIN, DistinctSketch, Sizing, out_B_for, sized_config
from streamlearn.state import open_store

pytestmark = pytest.mark.usefixtures("one_torch_thread")

TINY = ("embedding.K=2000", "embedding.B=256", "embedding.d=16", "model.d_model=16", "learner.history=4",
        "model.count_slots=1024")
ITEMS = ("learner.task=next-item", *TINY)
WORKER = ("store.shards=2", "store.map_size_gb=0.05", "store.sync=false", "worker.poll_timeout_ms=100",
          "worker.log_seconds=0.5", "worker.session_timeout_ms=2000", "worker.heartbeat_interval_ms=300",
          "worker.checkpoint_every=500")


def events(n: int, items: int, seed: int = 0) -> list[dict]:
    """``n`` next-item events of 40 users over ``items`` items, every item shown early:
    the first ``items`` events name each item once."""
    import random

    rng = random.Random(seed)
    return [{"key": f"u{rng.randrange(40)}", "item": f"i{i if i < items else rng.randrange(items)}"}
            for i in range(n)]


# ---------------------------------------------------------------------------- the sketch

@pytest.mark.parametrize("n", [1, 10, 300, 3_000, 20_000, 100_000])
def test_the_sketch_counts_distinct_ids_within_three_standard_errors(n):
    sketch = DistinctSketch()
    ids = [f"item-{i}" for i in range(n)]
    sketch.add(ids)
    sketch.add(ids[: n // 2])  # repeats count once
    assert abs(sketch.estimate() - n) <= max(1.0, 3 * sketch.error * n)


def test_the_sketch_is_exact_enough_below_its_linear_counting_range():
    sketch = DistinctSketch()
    sketch.add([str(i) for i in range(1000)])
    assert abs(sketch.estimate() - 1000) < 20  # linear counting, not HLL's 1.6% x 3


def test_the_sketch_is_the_same_in_another_process():
    code = ("from streamlearn.sizing import DistinctSketch; s = DistinctSketch(); "
            "s.add([f'item-{i}' for i in range(5000)]); print(s.registers.tobytes().hex())")
    here = DistinctSketch()
    here.add([f"item-{i}" for i in range(5000)])
    for seed in ("0", "1"):  # PYTHONHASHSEED would change hash(): the sketch must not use it
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                             env={"PYTHONHASHSEED": seed, "PATH": ""})
        assert out.stdout.strip() == here.registers.tobytes().hex()


def test_the_rule_is_a_power_of_two_with_headroom_in_range():
    # the next power of two >= half the estimate, at least 2048
    assert [out_B_for(e) for e in (0, 1, 1123, 4096, 4097, 4181, 6594, 8192, 8193)] == [
        2048, 2048, 2048, 2048, 4096, 4096, 4096, 4096, 8192]
    assert out_B_for(10**9) == 1 << 20
    with pytest.raises(ValueError, match="p must be in"):
        DistinctSketch(p=3)


def test_sized_config_reads_only_its_window_and_an_explicit_size_reads_nothing():
    cfg = Config().override(*ITEMS, "learner.sizing_window=4500")
    read = []

    def records():
        for e in events(10_000, 5000):
            read.append(e)
            yield e
    sized, sizing = sized_config(cfg, records())
    assert sizing == Sizing("model.out_B", 4096, sizing.estimate, 4500, 4500)
    assert abs(sizing.estimate - 4500) < 3 * 0.0163 * 4500 and sized.model.out_B == 4096
    assert len(read) == 4500  # the window and not one more

    def untouchable():
        raise AssertionError("an explicit size must not read the stream")
        yield
    explicit = Config().override(*ITEMS, "model.out_B=512")
    assert sized_config(explicit, untouchable()) == (explicit, None)


def test_a_learner_without_a_stream_gets_the_documented_size():
    learner = Learner(Config().override(*ITEMS))
    assert learner.cfg.model.out_B == OUT_B_MIN and learner.sizing is None


# ---------------------------------------------------------------------------- replay

def write_jsonl(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_replay_derives_the_size_records_it_and_a_reopen_reuses_it(tmp_path, capsys):
    data = write_jsonl(tmp_path / "events.jsonl", events(5500, 5000))
    cfg = Config().override(*ITEMS, "learner.sizing_window=5100")
    report = replay(FileSource(data), ReplayOptions(), config=cfg, save=tmp_path / "saved")
    sizing = report["config"]["sizing"]
    assert sizing["key"] == "model.out_B" and sizing["records"] == 5100 and abs(sizing["estimate"] - 5000) < 250
    assert sizing["value"] == report["config"]["model"]["model"]["out_B"] == 4096
    assert report["records"] == 5500  # the window's records were learned too, once each
    with open_store(tmp_path / "saved", readonly=True) as store:
        assert stored_config(store).model.out_B == 4096
        with store.snapshot():
            assert stored_sizing(store) == Sizing.from_dict(sizing)
        assert store.manifest().config["model"]["out_B"] == 4096
    assert main(["inspect", "--state", str(tmp_path / "saved"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["sizing"] == sizing
    assert main(["inspect", "--state", str(tmp_path / "saved")]) == 0
    assert "sizing   model.out_B=4096 derived from ~" in capsys.readouterr().out

    # Reopened (replay --state) with the defaults: the stored size, never sized again
    again = replay(FileSource(data), ReplayOptions(mode="frozen", limit=300), state=tmp_path / "saved")
    assert again["config"]["model"]["model"]["out_B"] == 4096 and again["config"]["sizing"] == sizing
    with pytest.raises(CheckpointMismatchError, match="--set model.out_B=4096"):
        replay(FileSource(data), ReplayOptions(mode="frozen", limit=300), state=tmp_path / "saved",
               overrides=["model.out_B=8192"])


def test_replay_with_an_explicit_size_reads_no_window(tmp_path):
    data = write_jsonl(tmp_path / "events.jsonl", events(600, 500))
    report = replay(FileSource(data), ReplayOptions(), config=Config().override(*ITEMS, "model.out_B=1000"))
    assert report["config"]["sizing"] is None and report["config"]["model"]["model"]["out_B"] == 1000


# ---------------------------------------------------------------------------- the worker

def worker_config(broker: str, group: str, *overrides: str) -> Config:
    return Config().override(*ITEMS, *WORKER, f"worker.bootstrap={broker}", f"worker.group={group}", *overrides)


def stored(state):
    with open_store(state, readonly=True) as store:
        with store.snapshot():
            sizing = stored_sizing(store)
        return stored_config(store), sizing, store.manifest()


def test_the_worker_sizes_a_new_model_from_its_window_and_a_restart_reuses_it(broker, make_topic, group, tmp_path):
    first = events(5500, 5000)
    topic = make_topic(2)
    ends = produce_rows(broker, topic, [(e["key"].encode(), e, None) for e in first]).per_partition
    state = tmp_path / "s"
    cfg = worker_config(broker, group, "learner.sizing_window=5100")
    summary = Worker(cfg, RunOptions(topic, str(state), until_idle_s=1.5)).run()
    # every record learned once: the window was read, not consumed
    assert summary.saved and summary.learned == 5500 and summary.offsets == ends
    cfg_stored, sizing, m = stored(state)
    assert cfg_stored.model.out_B == m.config["model"]["out_B"] == sizing.value == 4096
    assert sizing.records == 5100 and abs(sizing.estimate - 5000) < 250
    assert sum(m.records_applied.values()) == 5500

    # A restart whose window would now size it otherwise (100 records: 2048) reuses 4096.
    more = events(500, 5000, seed=1)
    produce_rows(broker, topic, [(e["key"].encode(), e, None) for e in more])
    restarted = worker_config(broker, group, "learner.sizing_window=100")
    assert Worker(restarted, RunOptions(topic, str(state), until_idle_s=1.5)).run().learned == 500
    cfg_stored, again, m = stored(state)
    assert cfg_stored.model.out_B == 4096 and again == sizing and sum(m.records_applied.values()) == 6000
    with open_store(state, readonly=True) as store:
        learner = read_full(store)
    assert learner.cfg.model.out_B == 4096 and learner.sizing == sizing

    # A different explicit size is refused, naming the stored one; the state is untouched.
    with pytest.raises(CheckpointMismatchError, match="model.out_B 4096 -> 16384"):
        Worker(worker_config(broker, group, "model.out_B=16384"), RunOptions(topic, str(state), until_idle_s=1.5))
    assert stored(state)[2].commits == m.commits


def test_an_explicit_size_on_a_fresh_worker_skips_the_window(broker, make_topic, group, tmp_path, monkeypatch):
    import streamlearn.consumers.worker as worker_module

    def no_window(*args):
        raise AssertionError("an explicit model.out_B must not read a warm-up window")
    monkeypatch.setattr(worker_module, "read_window", no_window)
    topic = make_topic(1)
    produce_rows(broker, topic, [(None, e, None) for e in events(300, 100)])
    cfg = worker_config(broker, group, "model.out_B=2048")
    assert Worker(cfg, RunOptions(topic, str(tmp_path / "s"), until_idle_s=1.5)).run().learned == 300
    cfg_stored, sizing, _ = stored(tmp_path / "s")
    assert cfg_stored.model.out_B == 2048 and sizing is None


def test_a_worker_that_stops_when_idle_does_not_wait_forever_on_an_empty_topic(broker, make_topic, group, tmp_path):
    topic = make_topic(1)
    summary = Worker(worker_config(broker, group), RunOptions(topic, str(tmp_path / "s"), until_idle_s=1.0)).run()
    assert summary.records == 0 and summary.saved
    with open_store(tmp_path / "s", readonly=True) as store:
        assert store.manifest().commits == 0  # nothing learned, nothing stored: a later start sizes from records
