"""The CUDA paths (streamlearn/device.py, docs/gpu.md): every task learns on a GPU and
answers as the same learner does on the CPU, within bf16's rounding; a checkpoint written
from the GPU restores on the CPU and on the GPU, training resumes from it, and the
snapshot service answers from it. Skipped where torch sees no CUDA device (CI has none);
``bash bench/gpu.sh`` runs them, with the rest of the suite, on a GPU."""
import math
import random

import numpy as np
import pytest
import torch
from fastapi.testclient import TestClient

from streamlearn.checkpoint import read_full
from streamlearn.config import Config
from streamlearn.device import Device
from streamlearn.learner import Learner
from streamlearn.service import Settings, create_app
from streamlearn.snapshot import Snapshot
from streamlearn.state import open_store
from test_snapshot import QUERIES, SMALL, answers, commit, stream

pytestmark = [pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device: bash bench/gpu.sh"),
              pytest.mark.usefixtures("one_torch_thread")]

CASES = [("classify", ()), ("classify", ("model.layers=1", "learner.nb_weight=1.0", "learner.nb_cells=65536")),
         ("mlm", ()), ("mlm", ("model.layers=1", "model.output=sampled", "model.counts=kn3", "model.count_slots=1024")),
         ("next-token", ()), ("next-token", ("model.layers=2",)), ("next-item", ())]
IDS = [f"{task}{'+' if extra else ''}{i}" for i, (task, extra) in enumerate(CASES)]


def learner(task: str, extra: tuple[str, ...], device: str) -> Learner:
    return Learner(Config().override(*SMALL, f"learner.task={task}", f"learner.device={device}", *extra))


def assert_close(task: str, got: list, want: list) -> None:
    """Answers of two learners trained alike, one on a GPU (its forward passes in bf16) and
    one on the CPU: the same probabilities to 0.05, the same top scores to 5% (the
    trainings' rounding differs; ranks may swap where scores tie)."""
    assert len(got) == len(want)
    for g, w in zip(got, want):
        if task == "classify":
            assert g.keys() == w.keys()
            np.testing.assert_allclose([g[k] for k in w], [w[k] for k in w], atol=0.05)
        else:
            assert len(g.tokens) == len(w.tokens)
            np.testing.assert_allclose(g.scores, w.scores, rtol=0.05, atol=0.05)


def test_batches_are_copied_to_the_gpu_and_forward_passes_autocast_to_bf16():
    dev = Device.pick("cuda")
    frozen = np.arange(6)
    frozen.flags.writeable = False  # torch refuses read-only arrays: Device.tensor copies them
    for a in (np.arange(6), frozen):
        t = dev.tensor(a)
        assert t.device.type == "cuda" and t.tolist() == list(range(6))
    x = torch.ones(4, 4, device=dev.torch)
    with dev.autocast():
        assert (x @ x).dtype == torch.bfloat16
    assert Device.pick("auto").cuda and "CUDA on" in dev.describe()


def test_the_seeded_generator_is_the_one_the_current_device_draws_from():
    """Was: "cuda" had no index, so seeded() seeded cuda:0's generator while a process whose
    current device is another (an NCCL rank) drew its dropout from that one's, unseeded and
    put back after each step: the same masks every batch."""
    dev = Device.pick("cuda")
    assert dev.torch.index == torch.cuda.current_device()
    draws = []
    for seed in (1, 2, 1):
        with dev.seeded(seed):
            draws.append(torch.rand(8, device=dev.torch).tolist())
    assert draws[0] == draws[2] != draws[1]


@pytest.mark.parametrize("task,extra", CASES, ids=IDS)
def test_a_gpu_learner_learns_and_answers_as_the_cpu_one_does(task, extra):
    rng = random.Random(0)
    gpu, cpu = learner(task, extra, "cuda"), learner(task, extra, "cpu")
    assert all(p.device.type == "cuda" for p in gpu.model.parameters())
    for _ in range(4):
        batch = stream(task, 32, rng)
        on_gpu, on_cpu = gpu.learn_many(batch), cpu.learn_many(batch)
        assert math.isfinite(on_gpu.loss) and not on_gpu.skipped
        assert on_gpu.loss == pytest.approx(on_cpu.loss, rel=0.05)
        assert on_gpu.rows.keys() == on_cpu.rows.keys()
    assert_close(task, answers(gpu, task)[1], answers(cpu, task)[1])


@pytest.mark.parametrize("task,extra", CASES, ids=IDS)
def test_a_checkpoint_from_the_gpu_restores_on_either_device_and_serves(task, extra, tmp_path):
    rng = random.Random(1)
    gpu = learner(task, extra, "cuda")
    for _ in range(2):
        gpu.learn_many(stream(task, 32, rng))
    state = str(tmp_path / "state")
    store = open_store(state)
    commit(store, gpu, 1)
    _, want = answers(gpu, task)
    restored = read_full(store)  # the stored learner.device: cuda
    assert next(restored.model.parameters()).device.type == "cuda"
    _, again = answers(restored, task)
    assert_close(task, again, want)
    with Snapshot.open(state, device="cpu") as snap:
        assert_close(task, answers(snap, task)[1], want)
    more = stream(task, 32, rng)  # training resumes on the GPU as the writer's own learner goes on
    assert restored.learn_many(more).loss == pytest.approx(gpu.learn_many(more).loss, rel=1e-3)
    store.close()

    client = TestClient(create_app(Settings(state=state)))
    queries = [q for q in QUERIES[task] if q.get("tokens", True)]  # the service refuses an empty token list
    path, body = (("/v1/predict", {"records": queries}) if task == "classify"
                  else ("/v1/topk", {"records": queries, "k": 5}))
    reply = client.post(path, json=body)
    assert reply.status_code == 200, reply.text
    assert reply.json()["snapshot_step"] == 1
