"""Scale-out pieces with real parts: real gloo process groups in real processes, real
learners, real LMDB. Replicas trained on different records are averaged exactly (dense
parameters and every row table), a dead peer makes the sync fail fast with a clear error,
labels seen in different orders are merged, and a stale writer cannot overwrite newer state."""
import json
import re
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from streamlearn.broker import free_port
from streamlearn.checkpoint import write
from streamlearn.config import Config, StoreConfig
from streamlearn.consumers.distributed import (
    DistSettings, StaleWorkerError, backend_for, dist_settings, fenced_commit, stored_generation)
from streamlearn.exceptions import ConfigError
from streamlearn.learner import Learner
from streamlearn.state import Checkpoint, open_store

SMALL = ("model.layers=0", "embedding.K=2000", "embedding.B=256", "embedding.d=16", "model.d_model=16",
         "model.max_labels=8", "learner.batch_size=16")

# One launch of 2 ranks per sync mode (a launch costs seconds: two interpreters import
# torch); module fixtures share it between the tests of that mode. Phase 1 syncs; phase 2:
# rank 1 vanishes and rank 0's next collective must fail fast with a clear error.
AVERAGE_SCRIPT = textwrap.dedent("""
    import json, os, sys, time
    import numpy as np, torch
    torch.set_num_threads(1)
    from streamlearn.config import Config
    from streamlearn.learner import Learner
    from streamlearn.consumers.distributed import DistributedError, Group, average_replicas, dist_settings

    out = sys.argv[1]
    settings = dist_settings(timeout_s=float(sys.argv[2]))  # from RANK / WORLD_SIZE / MASTER_* like torchrun
    lrn = Learner(Config().override(*json.loads(sys.argv[3])))
    rank = settings.rank
    first = [{"text": "goal match", "label": "sport"}, {"text": "pasta soup", "label": "food"}]
    lrn.learn_batch(lrn.prepare(first[::-1] if rank else first))  # the labels in different orders
    words = ["goal", "team", "chip", "code", "bread", "cheese", "cloud", "score"]
    mine = [{"text": f"{words[(i + 3 * rank) % 8]} w{rank}x{i % 13}", "label": "sport" if i % 2 else "food"}
            for i in range(48)]
    for at in range(0, len(mine), 16):
        lrn.learn_batch(lrn.prepare(mine[at:at + 16]))
    group = Group(settings)
    touched = lrn.take_dirty()
    lrn.mark_dirty(touched)  # read, not taken: the sync takes them
    touched = {n: ids.tolist() for n, ids in touched.items()}
    dense = {n: p.detach().cpu().numpy().copy() for n, p in lrn.model.dense_parameters().items()}
    tables = {n: t.detach().cpu().numpy().copy() for n, t in lrn.replica.tables().items()}
    np.savez(f"{out}/pre{rank}.npz", **{"d:" + n: v for n, v in dense.items()},
             **{"t:" + n: v for n, v in tables.items()})
    report = average_replicas(lrn, group)
    np.savez(f"{out}/post{rank}.npz",
             **{"d:" + n: p.detach().cpu().numpy() for n, p in lrn.model.dense_parameters().items()},
             **{"t:" + n: t.detach().cpu().numpy() for n, t in lrn.replica.tables().items()})
    dirty = {n: v.tolist() for n, v in lrn.take_dirty().items()}
    result = {"digest": lrn.replica.digest(), "labels": lrn.labels, "bytes": report.payload_bytes,
              "rows": report.rows, "touched": touched, "dirty": dirty}
    if rank == 1:
        print(json.dumps(result), flush=True)
        os._exit(0)  # gone without a word: rank 0's next sync must fail, not hang
    lrn.learn_batch(lrn.prepare(mine[:16]))
    started = time.monotonic()
    try:
        average_replicas(lrn, group)
    except DistributedError as exc:
        result.update(error=str(exc), seconds=time.monotonic() - started)
    group.close()
    print(json.dumps(result))
""")

ALLREDUCE_SCRIPT = textwrap.dedent("""
    import json, os, sys, time
    import numpy as np, torch
    torch.set_num_threads(1)
    from streamlearn.config import Config
    from streamlearn.learner import Learner
    from streamlearn.consumers.allreduce import GradientExchange
    from streamlearn.consumers.distributed import DistributedError, Group, dist_settings

    out = sys.argv[1]
    settings = dist_settings(timeout_s=float(sys.argv[2]))
    lrn = Learner(Config().override(*json.loads(sys.argv[3])))
    rank = settings.rank
    group = Group(settings)
    ex = GradientExchange(lrn, group)  # while every replica is the same (as a worker's start)
    words = ["goal", "team", "chip", "code", "bread", "cheese", "cloud", "score"]
    labels = ["sport", "food", "tech"] if rank == 0 else ["tech", "food", "news"]  # different orders, ids
    n = 80 if rank == 0 else 24  # uneven: rank 1 runs dry after 2 of rank 0's 5 batches
    records = [{"text": f"{words[(i + 3 * rank) % 8]} w{rank}x{i % 13}", "label": labels[i % 3]} for i in range(n)]
    batches = [lrn.prepare(records[at:at + 16]) for at in range(0, n, 16)]  # a fetch thread running ahead
    exchange = lrn.gradient_hook
    grads = []

    def snapshot():
        dense = {k: p.grad.clone() for k, p in lrn.model.dense_parameters().items() if p.grad is not None}
        rows = {k: p.grad.to_dense().clone() for k, p in lrn.row_optim.tables.items() if p.grad is not None}
        return dense, rows

    def spy(learner):  # the local gradients, then the exchanged ones
        local = snapshot()
        exchange(learner)
        grads.append((local, snapshot()))
    lrn.gradient_hook = spy

    def round(batch, finished=False):
        ready = batch is not None and ex.ready(batch)
        ex.offer(ready, finished=finished)
        if ready:
            ex.to_group_labels(batch)
            lrn.learn_batch(batch)
            if ex.failed is not None:
                raise ex.failed
        else:
            ex.idle()
        if ex.last.new_labels:
            ex.share_labels()
        return ready

    rounds = 0
    while True:
        if round(batches[0] if batches else None, finished=not batches):
            batches.pop(0)
        rounds += 1
        if ex.last.finished == settings.world_size:
            break
    report = ex.settle()
    torch.save(grads, f"{out}/grads{rank}.pt")
    result = {"digest": lrn.replica.digest(), "labels": lrn.labels, "steps": lrn.steps, "rounds": rounds,
              "bytes": report.payload_bytes, "exchanges": report.exchanges,
              "dirty": {k: v.tolist() for k, v in lrn.take_dirty().items()},
              "nb_records": float(lrn.task.nb.flat[:lrn.task.nb.max_labels].sum())}
    if rank == 1:
        print(json.dumps(result), flush=True)
        os._exit(0)  # gone without a word: rank 0's next round must fail, not hang
    started = time.monotonic()
    try:
        round(lrn.prepare(records[:16]))
    except DistributedError as exc:
        result.update(error=str(exc), seconds=time.monotonic() - started, steps_after=lrn.steps)
    group.close()
    print(json.dumps(result))
""")


def run_ranks(tmp_path, script: str, timeout_s: float = 5.0, world: int = 2, overrides=SMALL) -> list[dict]:
    port = free_port()
    procs = []
    for rank in range(world):
        env = {"RANK": str(rank), "WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
               "OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"}
        procs.append(subprocess.Popen([sys.executable, "-c", script, str(tmp_path), str(timeout_s),
                                       json.dumps(overrides)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      env=env, text=True))
    outs = []
    for proc in procs:
        stdout, stderr = proc.communicate(timeout=90)
        assert proc.returncode == 0, stderr[-3000:]
        outs.append(json.loads(stdout.strip().splitlines()[-1]))
    return outs


def timed_ranks(tmp_path_factory, name: str, script: str, overrides=SMALL):
    """One 2-rank launch shared by a mode's tests: (directory, each rank's output, seconds)."""
    tmp = tmp_path_factory.mktemp(name)
    started = time.monotonic()
    outs = run_ranks(tmp, script, overrides=overrides)
    return tmp, outs, time.monotonic() - started


@pytest.fixture(scope="module")
def averaged(tmp_path_factory):
    return timed_ranks(tmp_path_factory, "average", AVERAGE_SCRIPT)


@pytest.fixture(scope="module")
def allreduced(tmp_path_factory):
    # With the Naive Bayes part on: its counts travel at the sync, not in the rounds.
    return timed_ranks(tmp_path_factory, "allreduce", ALLREDUCE_SCRIPT, (*SMALL, "learner.nb_weight=0.5",
                                                                         "learner.nb_cells=65536"))


LABEL_HEAD = ("d:head.weight", "d:head.bias")


def test_sync_averages_dense_and_every_row_table_exactly(averaged):
    tmp, outs, _ = averaged
    pre = [np.load(tmp / f"pre{r}.npz") for r in range(2)]
    post = [np.load(tmp / f"post{r}.npz") for r in range(2)]
    assert outs[0]["digest"] == outs[1]["digest"]
    differed = 0
    for name in pre[0].files:
        a, b = pre[0][name], pre[1][name].copy()
        if name in LABEL_HEAD:
            b[[0, 1]] = pre[1][name][[1, 0]]  # rank 1's rows in the merged label order
        differed += int(not np.array_equal(a, b))
        np.testing.assert_allclose(post[0][name], (a + b) / 2, rtol=1e-6, atol=1e-7, err_msg=name)
        np.testing.assert_array_equal(post[0][name], post[1][name], err_msg=name)
    assert differed >= 3, "the replicas did not diverge before the sync: the test proves nothing"
    # Only the union of touched rows moved, and it is what the next checkpoint writes.
    for name, ids in outs[0]["dirty"].items():
        union = set(outs[0]["touched"].get(name, [])) | set(outs[1]["touched"].get(name, []))
        assert set(ids) == union == set(outs[1]["dirty"][name]), name
        assert outs[0]["rows"][name] == len(union)
    assert outs[0]["bytes"] > 0


def test_labels_seen_in_different_orders_are_merged_before_averaging(averaged):
    tmp, outs, _ = averaged  # rank 0 saw sport, food; rank 1 food, sport
    assert outs[0]["labels"] == outs[1]["labels"] == ["sport", "food"]
    pre1 = np.load(tmp / "pre1.npz")
    for name in LABEL_HEAD:  # the swap above was needed: the rows really moved
        swapped = pre1[name].copy()
        swapped[[0, 1]] = pre1[name][[1, 0]]
        assert not np.allclose(swapped, pre1[name])


def test_dead_peer_fails_the_sync_fast_with_a_clear_error(averaged):
    _, outs, seconds = averaged
    assert "model sync failed" in outs[0]["error"] and outs[0]["seconds"] < 4
    assert seconds < 60


def test_allreduce_keeps_replicas_bit_equal_on_uneven_data(allreduced):
    """Rank 0 learns 5 batches, rank 1 only 2 (then takes part without data); they see
    labels in different orders and one label each that the other never sees."""
    import torch

    tmp, outs, _ = allreduced
    assert outs[0]["digest"] == outs[1]["digest"]
    assert outs[0]["labels"] == outs[1]["labels"] and sorted(outs[0]["labels"]) == ["food", "news", "sport", "tech"]
    assert outs[0]["steps"] == outs[1]["steps"] == 5  # the idle rank stepped with rank 0
    assert outs[0]["nb_records"] == outs[1]["nb_records"] == 80 + 24  # each rank's counts hold both ranks' records
    assert outs[0]["dirty"] == outs[1]["dirty"] and outs[0]["dirty"]  # both would store the same rows
    assert outs[0]["exchanges"] == outs[0]["rounds"] >= 5 and outs[0]["bytes"] > 0
    g0, g1 = (torch.load(tmp / f"grads{r}.pt") for r in range(2))
    assert len(g0) == 5 and len(g1) == 2
    for step in range(2):  # both brought a batch: the exchanged gradient is the mean of theirs
        (dense0, rows0), after0 = g0[step]
        (dense1, rows1), after1 = g1[step]
        for part, (a, b) in enumerate([(dense0, dense1), (rows0, rows1)]):
            assert set(a) == set(b) == set(after0[part]) == set(after1[part])
            for name in a:
                assert torch.equal(after0[part][name], after1[part][name]), name
                torch.testing.assert_close(after0[part][name], (a[name] + b[name]) / 2, rtol=1e-5, atol=1e-7)
        assert not torch.equal(dense0["head.weight"], dense1["head.weight"])
    (dense, rows), after = g0[4]  # rank 0 alone: its own gradient, not halved
    for name in dense:
        torch.testing.assert_close(after[0][name], dense[name])
    for name in rows:
        torch.testing.assert_close(after[1][name], rows[name])


def test_allreduce_dead_peer_fails_the_round_fast_and_the_batch_is_learned_alone(allreduced):
    _, outs, seconds = allreduced
    assert "gradient all-reduce failed" in outs[0]["error"] and outs[0]["seconds"] < 4
    assert outs[0]["steps_after"] == outs[0]["steps"] + 1  # the local gradient took the step
    assert seconds < 60


def test_nccl_only_where_each_rank_on_the_host_has_a_gpu_of_its_own():
    assert backend_for(2, {}, gpus=0) == "gloo"
    assert backend_for(2, {}, gpus=1) == "gloo"  # two ranks on one GPU: NCCL refuses them
    assert backend_for(2, {}, gpus=2) == "nccl"
    assert backend_for(8, {"LOCAL_WORLD_SIZE": "4"}, gpus=4) == "nccl"  # torchrun: 4 of the 8 ranks here
    assert backend_for(8, {"LOCAL_WORLD_SIZE": "4"}, gpus=2) == "gloo"
    assert dist_settings(2, 1, "tcp://h:1", environ={}, gpus=2).backend == "nccl"
    with pytest.raises(ConfigError, match="LOCAL_WORLD_SIZE must be an integer"):
        backend_for(2, {"LOCAL_WORLD_SIZE": "two"}, gpus=2)


def _two_fake_gpus(monkeypatch) -> list[int]:
    """torch.cuda reporting two GPUs (none here to run: a fake, as for what we cannot run);
    the devices set current are recorded."""
    import torch

    current: list[int] = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "set_device", current.append)
    return current


def test_a_cpu_learner_on_a_gpu_machine_groups_by_gloo(monkeypatch, tmp_path):
    """Was: NCCL for two CPU ranks on a 2-GPU machine, whose buffers then went through CUDA."""
    from streamlearn.cli import build_parser
    from streamlearn.cli.worker import group_settings

    _two_fake_gpus(monkeypatch)
    args = build_parser().parse_args(["worker", "--topic", "t", "--state", str(tmp_path / "s"),
                                      "--world-size", "2", "--rank", "1", "--dist-url", "tcp://h:1"])
    assert group_settings(args, Config().override("learner.device=cpu")).backend == "gloo"
    assert group_settings(args, Config().override("learner.device=auto")).backend == "nccl"


def test_a_cpu_rank_sets_no_current_gpu(monkeypatch):
    """Was: every rank on a GPU machine called torch.cuda.set_device, which opens a CUDA
    context (hundreds of MB of GPU memory) in a rank that trains on the CPU."""
    from streamlearn.consumers.distributed import Group

    current = _two_fake_gpus(monkeypatch)
    for cuda, expected in [(False, []), (True, [0])]:
        group = Group(DistSettings(0, 1, f"tcp://127.0.0.1:{free_port()}", "gloo", 10.0), cuda=cuda)
        group.close()
        assert current == expected
        current.clear()


def test_settings_from_options_or_torchrun_env():
    assert dist_settings(environ={}) is None
    env = {"RANK": "1", "WORLD_SIZE": "3", "MASTER_ADDR": "10.0.0.5", "MASTER_PORT": "29500"}
    assert dist_settings(environ=env, gpus=0) == DistSettings(1, 3, "tcp://10.0.0.5:29500", "gloo", 15.0)
    assert dist_settings(2, 0, "tcp://h:1", 5.0, environ=env, gpus=0) == DistSettings(0, 2, "tcp://h:1", "gloo", 5.0)
    under_torchrun = dist_settings(environ={**env, "RANK": "0", "TORCHELASTIC_USE_AGENT_STORE": "True"})
    assert under_torchrun.rank == 0 and not under_torchrun.host_store  # the agent hosts the store
    for bad, message in [(dict(world_size=2, environ={}), "--rank"),
                         (dict(world_size=2, rank=2, url="tcp://h:1", environ={}), "0 <= rank"),
                         (dict(world_size=2, rank=0, environ={}), "--dist-url"),
                         (dict(world_size=2, rank=0, url="h:1", environ={}), "tcp://"),
                         (dict(environ={**env, "RANK": "x"}), "RANK must be an integer")]:
        with pytest.raises(ConfigError, match=message):
            dist_settings(**bad)


def test_group_worker_rejects_settings_before_it_joins_a_group_or_opens_the_state(tmp_path):
    """Rank 0 of 2 with nobody else coming: a check that ran after joining would time out
    (DistributedError) instead of naming the setting."""
    from streamlearn.consumers.scaleout import GroupWorker
    from streamlearn.consumers.worker import RunOptions

    settings = DistSettings(0, 2, f"tcp://127.0.0.1:{free_port()}", timeout_s=1.0)
    options = RunOptions("topic", str(tmp_path / "state"))
    for overrides, message in [(("worker.queue_batches=0",), "worker.queue_batches"),  # the worker's rules
                               (("learner.task=next-item",), "supports learner.task=classify, mlm, next-token"),
                               (("worker.sync=ring",), "worker.sync must be one of")]:
        with pytest.raises(ConfigError, match=message):
            GroupWorker(Config().override(*SMALL, *overrides), options, settings)
    assert not (tmp_path / "state").exists()


def test_a_group_given_no_task_refuses_the_task_a_next_item_topic_says(broker, make_topic, tmp_path):
    """Was: the task check ran on classify (no task given), the topic's records then made
    the model next-item, and the ranks crashed (AttributeError: keep_log) or asked for a
    size. The refusal is the one --task next-item gets."""
    from streamlearn.broker import produce_rows
    from streamlearn.consumers.scaleout import GroupWorker
    from streamlearn.consumers.worker import RunOptions

    topic = make_topic(1)
    produce_rows(broker, topic, [(None, {"key": f"u{i % 3}", "item": f"i{i % 7}"}, None) for i in range(20)])
    settings = DistSettings(0, 1, f"tcp://127.0.0.1:{free_port()}", timeout_s=10.0)
    options = RunOptions(topic, str(tmp_path / "state"), given=frozenset())
    with pytest.raises(ConfigError, match="supports learner.task=classify, mlm, next-token, got 'next-item'"):
        GroupWorker(Config().override(*SMALL, f"worker.bootstrap={broker}", "worker.connect_timeout_s=10"), options,
                    settings)


def test_stale_writer_is_fenced_and_the_state_is_unchanged(tmp_path):
    lrn = Learner(Config().override(*SMALL))
    lrn.learn_batch(lrn.prepare([{"text": "goal match", "label": "sport"}]))
    with open_store(tmp_path / "state", StoreConfig(shards=2, map_size_gb=0.05)) as store:
        specs, rows, blobs, kv = write(lrn, full=True)
        store.declare_tables(specs)
        ckpt = Checkpoint(step=lrn.steps, offsets={"t:0": 10}, rows=rows, blobs=blobs, kv=kv)
        assert stored_generation(store) == 0
        fenced_commit(store, ckpt, generation=2, rank=0, world_size=2)
        assert stored_generation(store) == 2
        newer = Checkpoint(step=lrn.steps, offsets={"t:0": 20})
        fenced_commit(store, newer, generation=3, rank=1, world_size=1)
        with pytest.raises(StaleWorkerError, match="generation 2 .* generation 3"):
            fenced_commit(store, Checkpoint(step=lrn.steps, offsets={"t:0": 15}), generation=2, rank=0, world_size=2)
        manifest = store.manifest()
        assert manifest.offsets == {"t:0": 20} and manifest.commits == 2 and stored_generation(store) == 3


# ---------------------------------------------------------------------------- two workers, real broker

GROUP_SETTINGS = ("model.layers=0", "embedding.K=2000", "embedding.B=256", "embedding.d=16", "model.d_model=16",
                  "model.max_labels=8", "learner.batch_size=32", "store.shards=2", "store.map_size_gb=0.1",
                  "worker.session_timeout_ms=1500", "worker.heartbeat_interval_ms=300",
                  "worker.max_poll_interval_ms=3000", "worker.poll_timeout_ms=100", "worker.audit=true",
                  "worker.log_seconds=1", "worker.retry_max_s=1", "worker.torch_threads=1", "worker.eval_every=0")
RECORDS = 12_000


def stream(n: int, seed: int):
    import random
    rng = random.Random(seed)
    words = {"a": ["goal", "match", "team"], "b": ["chip", "code", "cloud"], "c": ["pasta", "bread", "soup"]}
    for i in range(n):
        label = rng.choice("abc")
        yield None, {"text": " ".join(rng.choice(words[label]) for _ in range(4)) + f" n{i % 89}", "label": label}, None


class Rank:
    def __init__(self, tmp_path, rank: int, args: list[str]):
        self.log_path = tmp_path / f"rank{rank}.log"
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen([sys.executable, "-m", "streamlearn.cli", "worker", *args, "--rank", str(rank)],
                                     stdout=self.log, stderr=subprocess.STDOUT,
                                     env={**__import__("os").environ, "OMP_NUM_THREADS": "1"})

    def output(self) -> str:
        return self.log_path.read_text()

    def digests(self) -> dict[int, str]:
        """Per sync number: the replica digest and the step count after the sync."""
        out = {}
        for line in self.output().splitlines():
            if " sync " in line and "digest " in line:
                step = int(line.split(", step ")[1].split(",")[0])
                out[int(line.split(" sync ")[1].split()[0])] = (line.rsplit("digest ", 1)[1].strip(), step)
        return out


@pytest.mark.parametrize("victim, sync", [(0, "average"), (1, "allreduce")],
                         ids=["writer-killed-average", "reader-killed-allreduce"])
def test_two_workers_one_killed_every_offset_applied_once(victim, sync, broker, make_topic, group, tmp_path):
    """2 workers on 4 partitions; one SIGKILLed mid-stream (the writer, which also hosts the
    group's store, or the other); the survivor finishes the stream alone. Each sync mode
    meets one of the two victims (both of both would double the file's run time). Kafka
    moves the dead worker's partitions only after the session timeout and a rebalance, here
    together longer than --until-idle: the survivor, idle by then, must wait for them rather
    than stop (before it did not: a CI run lost two partitions' records that way)."""
    from streamlearn.consumers import read_audit

    topic = make_topic(4)
    ends = produce_rows_(broker, topic)
    state = tmp_path / "state"
    args = ["--topic", topic, "--state", str(state), "--bootstrap", broker, "--group", group,
            "--world-size", "2", "--dist-url", f"tcp://127.0.0.1:{free_port()}", "--dist-timeout", "5",
            "--checkpoint-every", "400", "--until-idle", "4", "--sync", sync, *(f"--set={s}" for s in GROUP_SETTINGS),
            "--set=worker.session_timeout_ms=5000"]
    ranks = [Rank(tmp_path, r, args) for r in range(2)]
    try:
        deadline = time.monotonic() + 90
        while not all(len(r.digests()) >= 2 for r in ranks):
            assert time.monotonic() < deadline and all(r.proc.poll() is None for r in ranks), \
                "\n".join(r.output()[-3000:] for r in ranks)
            time.sleep(0.05)
        dead, survivor = ranks[victim], ranks[1 - victim]
        dead.proc.kill()
        dead.proc.wait(10)
        assert survivor.proc.wait(120) == 0, survivor.output()[-4000:]
    finally:
        for r in ranks:
            if r.proc.poll() is None:
                r.proc.kill()
            r.log.close()
    out = survivor.output()
    assert "now works alone as the writer" in out, out[-3000:]
    both = set(ranks[0].digests()) & set(ranks[1].digests())
    # Equal replicas and equal step counts (a survivor's commit is never behind the stored step).
    assert len(both) >= 2 and all(ranks[0].digests()[n] == ranks[1].digests()[n] for n in both)
    with open_store(state, readonly=True) as store:
        m = store.manifest()
        audit = list(read_audit(store))
    key = lambda p: f"{topic}:{p}"  # noqa: E731
    assert {p: m.offsets[key(p)] for p in ends} == ends
    assert {p: m.records_applied[key(p)] for p in ends} == ends
    seen = {p: np.zeros(n, dtype=np.int64) for p, n in ends.items()}
    for _, spans in audit:
        for partition, first, last, count in spans:
            assert count == last - first + 1
            seen[partition][first:last + 1] += 1
    for partition, hits in seen.items():
        assert not (hits != 1).any(), (partition, np.flatnonzero(hits > 1)[:10], np.flatnonzero(hits == 0)[:10])
    assert m.metrics["records_learned"] == RECORDS
    assert stored_generation_(state) >= 2


def test_an_idle_group_ends_together_while_one_rank_reads_longer(broker, make_topic, group, tmp_path):
    """--until-idle in a group: records keep coming to one partition only, so the other rank
    is idle first. It used to stop at once, and the reading rank then found it gone at its
    next collective ("leaving the group and going on alone") and waited for a rebalance;
    now the idle rank goes on with the group until a sync finds every rank idle."""
    import threading

    from streamlearn.broker import partition_for, produce_rows

    topic = make_topic(2)
    key = next(k for k in (str(i).encode() for i in range(100)) if partition_for(k, 2) == 0)
    rows = [(key, record, ts) for _, record, ts in stream(60, seed=6)]

    def slowly():  # 60 records to partition 0 over about 6 s
        for at in range(0, len(rows), 5):
            time.sleep(0.5)
            yield from rows[at:at + 5]

    args = ["--topic", topic, "--state", str(tmp_path / "state"), "--bootstrap", broker, "--group", group,
            "--world-size", "2", "--dist-url", f"tcp://127.0.0.1:{free_port()}", "--dist-timeout", "10",
            "--until-idle", "2", *(f"--set={s}" for s in GROUP_SETTINGS)]
    ranks = [Rank(tmp_path, r, args) for r in range(2)]
    deadline = time.monotonic() + 60  # records only once both read: one of them must read longer
    while not all("assigned partitions" in r.output() for r in ranks):
        assert time.monotonic() < deadline and all(r.proc.poll() is None for r in ranks), \
            "\n".join(r.output()[-3000:] for r in ranks)
        time.sleep(0.1)
    writer = threading.Thread(target=lambda: produce_rows(broker, topic, slowly()))
    writer.start()
    codes = exit_codes(ranks)
    writer.join(30)
    outs = [r.output() for r in ranks]
    assert codes == [0, 0], "\n".join(o[-3000:] for o in outs)
    assert not any("going on alone" in o for o in outs), "\n".join(o[-3000:] for o in outs)
    assert any("on any worker of the group (--until-idle)" in o for o in outs)
    with open_store(tmp_path / "state", readonly=True) as store:
        assert store.manifest().records_applied == {f"{topic}:0": 60, f"{topic}:1": 0}
    # Each rank's checkpoint time is the whole sync: the rank that does not write read 0.000 s.
    for out in outs:
        times = re.findall(r"last checkpoint (\d+\.\d+) s", out)
        assert times and all(float(t) > 0 for t in times), out[-3000:]


def exit_codes(ranks: list[Rank], timeout_s: float = 120) -> list[int]:
    """Each rank's exit status; any rank still running after ``timeout_s`` is killed."""
    try:
        return [r.proc.wait(timeout_s) for r in ranks]
    finally:
        for r in ranks:
            if r.proc.poll() is None:
                r.proc.kill()
            r.log.close()


def test_ranks_with_other_model_configs_are_refused_in_one_line_each(broker, make_topic, group, tmp_path):
    """Was: on a new state nothing compared the ranks' configs: one hashing with
    hashing.ngrams=1 blended two models silently (equal digests, exit 0), and another
    embedding.d aborted gloo ('Received data size doesn't match', rc 134)."""
    topic = make_topic(2)
    produce_rows_(broker, topic, list(stream(200, seed=4)))
    args = ["--topic", topic, "--state", str(tmp_path / "state"), "--bootstrap", broker, "--group", group,
            "--world-size", "2", "--dist-url", f"tcp://127.0.0.1:{free_port()}", "--dist-timeout", "10",
            "--until-idle", "3", *(f"--set={s}" for s in GROUP_SETTINGS)]
    ranks = [Rank(tmp_path, 0, args), Rank(tmp_path, 1, [*args, "--set=hashing.ngrams=1"])]
    codes = exit_codes(ranks)
    for r, code in zip(ranks, codes):
        out = r.output()
        assert code == 2 and "Traceback" not in out, out[-3000:]
        assert ("streamlearn worker: error: the ranks of the group run other model configs (rank 1: "
                "hashing.ngrams: rank 0 2, here 1)") in out, out[-3000:]


def test_a_peer_refused_at_start_leaves_the_other_rank_one_line_not_a_traceback(broker, make_topic, group, tmp_path):
    """Was: rank 1, refused by the stored model's config, exited 2 as it should, and rank 0
    died in broadcast_object_list with a RuntimeError traceback (exit 1)."""
    from streamlearn.cli import main

    topic = make_topic(2)
    produce_rows_(broker, topic, list(stream(200, seed=4)))
    base = ["--topic", topic, "--state", str(tmp_path / "state"), "--bootstrap", broker, "--group", group,
            "--until-idle", "2", *(f"--set={s}" for s in GROUP_SETTINGS)]
    assert main(["worker", *base, "--max-records", "50"]) == 0  # a stored model
    args = [*base, "--world-size", "2", "--dist-url", f"tcp://127.0.0.1:{free_port()}", "--dist-timeout", "10"]
    ranks = [Rank(tmp_path, 0, args), Rank(tmp_path, 1, [*args, "--set=embedding.d=32"])]
    codes = exit_codes(ranks)
    assert codes == [2, 2], [r.output()[-2000:] for r in ranks]
    assert "embedding.d 16 -> 32" in ranks[1].output(), ranks[1].output()[-2000:]
    out = ranks[0].output()
    assert "Traceback" not in out and "streamlearn worker: error: a peer left while the group formed" in out, out[-3000:]


def produce_rows_(broker: str, topic: str, rows=None) -> dict[int, int]:
    from streamlearn.broker import produce_rows
    return produce_rows(broker, topic, stream(RECORDS, seed=3) if rows is None else rows).per_partition


# Small count tables that never halve on this stream: then the merged counts are exact.
TOKEN_SETTINGS = (*(s for s in GROUP_SETTINGS if not s.startswith("model.max_labels")), "model.count_slots=65536",
                  "learner.batch_size=16")
TOKEN_RECORDS = 1_200


def text_stream(n: int, seed: int):
    """Sentences from a small grammar: enough repeated trigrams that N1+ continuation
    counts are often above 1 (a sum of two ranks' counts would get them wrong)."""
    import random
    rng = random.Random(seed)
    subjects, verbs, objects = ["the old prince", "natasha", "pierre", "the count", "andrew"], \
        ["saw", "left", "loved", "wrote to", "went to"], ["moscow", "the army", "his wife", "the ball", "her"]
    for i in range(n):
        words = f"{rng.choice(subjects)} {rng.choice(verbs)} {rng.choice(objects)} at w{i % 97} and {rng.choice(verbs)}"
        yield None, {"text": words}, None


def _entries(table) -> tuple[np.ndarray, np.ndarray]:
    keys, vals = table.entries()
    order = np.argsort(keys)
    return keys[order], vals[order]


@pytest.mark.parametrize("task, sync", [("next-token", "average"), ("mlm", "allreduce")])
def test_two_workers_learn_one_token_model_with_the_counts_of_one(task, sync, broker, make_topic, group, tmp_path):
    """2 workers on 2 partitions train one next-token / mlm model: every sync leaves the
    replicas equal (digests), and the stored model's count part and candidates are those
    of one learner that counted every record (Kneser-Ney statistics replayed, not summed)."""
    from streamlearn.checkpoint import read_full
    from streamlearn.config import load_config

    topic = make_topic(2)
    ends = produce_rows_(broker, topic, list(text_stream(TOKEN_RECORDS, seed=5)))
    state = tmp_path / "state"
    sets = (f"learner.task={task}", *TOKEN_SETTINGS)
    args = ["--topic", topic, "--state", str(state), "--bootstrap", broker, "--group", group,
            "--world-size", "2", "--dist-url", f"tcp://127.0.0.1:{free_port()}", "--dist-timeout", "10",
            "--checkpoint-every", "200", "--until-idle", "4", "--sync", sync, *(f"--set={s}" for s in sets)]
    ranks = [Rank(tmp_path, r, args) for r in range(2)]
    try:
        for r in ranks:
            assert r.proc.wait(120) == 0, r.output()[-4000:]
    finally:
        for r in ranks:
            if r.proc.poll() is None:
                r.proc.kill()
            r.log.close()
    both = set(ranks[0].digests()) & set(ranks[1].digests())
    assert len(both) >= 2 and all(ranks[0].digests()[n] == ranks[1].digests()[n] for n in both)
    one = Learner(load_config(None, sets, use_env=False))
    records = [value for _, value, _ in text_stream(TOKEN_RECORDS, seed=5)]
    for at in range(0, len(records), 16):
        one.learn_batch(one.prepare(records[at:at + 16]))
    with open_store(state, readonly=True) as store:
        m = store.manifest()
        stored = read_full(store)
    assert sum(m.records_applied.values()) == sum(ends.values()) == TOKEN_RECORDS
    mine, theirs = stored.task.counter.kn, one.task.counter.kn
    assert mine.halvings == theirs.halvings == 0  # else the counts are approximate, not comparable
    for a, b in [(mine.big, theirs.big), (mine.small, theirs.small)]:
        (ka, va), (kb, vb) = _entries(a), _entries(b)
        np.testing.assert_array_equal(ka, kb)
        np.testing.assert_array_equal(va, vb)
    np.testing.assert_array_equal(mine.stats.numpy(), theirs.stats.numpy())
    assert (theirs.stats.numpy()[0, 3:6] > 0).all()  # twice-seen types in every order: N1+ sums would differ
    assert sorted(stored.index.tokens) == sorted(one.index.tokens)


def stored_generation_(state) -> int:
    with open_store(state, readonly=True) as store:
        return stored_generation(store)


def test_a_rank_that_finds_no_group_says_how_long_it_waited_and_what_to_restart(caplog):
    """The case a helper met: a crashed rank restarted beside a survivor that went on alone
    (it hosts no store for the new member) waited in silence, then named a wrong timeout."""
    import logging

    from streamlearn.broker import free_port
    from streamlearn.consumers.distributed import DistributedError, DistSettings, Group

    settings = DistSettings(rank=1, world_size=2, url=f"tcp://127.0.0.1:{free_port()}", timeout_s=1.0)
    with caplog.at_level(logging.INFO, logger="streamlearn.consumers"), pytest.raises(DistributedError) as err:
        Group(settings)
    assert any("joining the process group" in r.getMessage() for r in caplog.records)
    message = str(err.value)
    assert "as rank 1 of 2 (gave up after" in message and "stop it and start all ranks" in message, message


def test_a_hung_store_host_is_given_up_after_the_dist_timeout(tmp_path):
    """Was: rank 0 stopped (SIGSTOP, a long pause) kept its store's connections open, and
    TCPStore.add waited past its own timeout for good: every other rank's fetch thread hung
    there, never synced, never went on alone, and ignored a first SIGTERM."""
    import signal
    from datetime import timedelta

    import torch.distributed as tdist

    from streamlearn.consumers.scaleout import SyncClock

    port = free_port()
    host = subprocess.Popen([sys.executable, "-c", (
        "import sys, time, datetime, torch.distributed as d\n"
        f"s = d.TCPStore('127.0.0.1', {port}, 2, True, datetime.timedelta(seconds=30), wait_for_workers=False)\n"
        "print('up', flush=True)\n"
        "time.sleep(120)\n")], stdout=subprocess.PIPE, text=True)
    try:
        assert host.stdout.readline().strip() == "up"
        store = tdist.TCPStore("127.0.0.1", port, 2, False, timedelta(seconds=2))
        clock = SyncClock(store, timeout_s=1.0)
        assert clock.wanted() == 0
        clock.request()
        assert clock.wanted() == 1
        host.send_signal(signal.SIGSTOP)
        started = time.monotonic()
        with pytest.raises(RuntimeError, match=r"did not answer in 1 s \(--dist-timeout\)"):
            clock.wanted()
        assert time.monotonic() - started < 5
        started = time.monotonic()
        with pytest.raises(RuntimeError, match="stopped answering"):  # not another wait behind the hung call
            clock.request()
        assert time.monotonic() - started < 0.5
        clock.end()
    finally:
        host.send_signal(signal.SIGCONT)
        host.kill()
        host.wait()
    # the hung call fails once the host is gone (torch logs it with a C++ stack trace):
    # within the test, whose output is captured, not on the terminal of a later one
    clock.thread.join(10)
    assert not clock.thread.is_alive()
