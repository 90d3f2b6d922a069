"""Torch's intra-op threads: a Learner sets them when the program chose none, and never
when it did (streamlearn.device.adopt_threads). Each case runs in a fresh interpreter:
the thread count is process-wide. And what a CPU device says of itself in benchmark
tables (the CUDA side: tests/test_cuda.py)."""
import json
import os
import subprocess
import sys

import pytest

from streamlearn.device import Device, usable_cpus

PROBE = """
import json, sys, torch
from streamlearn.config import Config
from streamlearn.device import intra_op_threads, set_threads, torch_default_threads
from streamlearn.learner import Learner
cfg = Config().override("embedding.K=1000", "embedding.B=100", "learner.nb_cells=4096", "model.max_labels=8")
before = {"count": torch.get_num_threads(), "torch_default": torch_default_threads(), "want": intra_op_threads(cfg)}
exec(sys.argv[1])  # what the program does before it builds a learner
before["chosen"] = torch.get_num_threads()
Learner(cfg)
after = torch.get_num_threads()
Learner(cfg)  # a second learner changes nothing more
print(json.dumps({**before, "after": after, "again": torch.get_num_threads()}))
"""


def probe(setup: str = "", **env: str) -> dict:
    environ = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    out = subprocess.run([sys.executable, "-c", PROBE, setup], capture_output=True, text=True,
                         env={**environ, **env})
    # the child's own words when it fails (a CI run once saw it abort, SIGABRT, saying nothing else)
    assert out.returncode == 0, f"the probe exited with {out.returncode}:\n{out.stderr[-4000:]}\n{out.stdout[-2000:]}"
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_torchs_default_is_recognised_and_replaced_by_the_learners_count():
    """A program that never chose a count gets intra_op_threads (CPUs - 1, at least 1)."""
    got = probe()
    assert got["torch_default"] == got["count"]  # the formula reads torch's own default
    assert got["after"] == got["again"] == got["want"]


def test_a_count_the_program_set_is_kept():
    got = probe("torch.set_num_threads(torch.get_num_threads() + 1)")
    assert got["after"] == got["again"] == got["count"] + 1


@pytest.mark.parametrize("var", ["OMP_NUM_THREADS", "MKL_NUM_THREADS"])
def test_a_count_the_environment_set_is_kept(var):
    got = probe(**{var: "3"})
    assert got["torch_default"] is None
    assert got["after"] == got["again"] == got["chosen"]


def test_set_threads_pins_a_count_even_equal_to_torchs_default():
    """The service's --threads: kept, whatever its value."""
    got = probe("set_threads(torch.get_num_threads())")
    assert got["after"] == got["again"] == got["count"]


def test_a_cpu_device_names_itself_and_its_cores_for_the_benchmarks_tables():
    dev = Device.pick("cpu")
    assert usable_cpus() == len(os.sched_getaffinity(0)) >= 1
    assert dev.describe() == f"CPU, {usable_cpus()} cores" and not dev.cuda
    dev.synchronize()  # what every timed benchmark region ends with: nothing queued on a CPU


def test_a_cuda_device_carries_the_index_its_ops_and_generator_use(monkeypatch):
    """Without a GPU here, torch.cuda is stood in for: a process whose current device is 1
    (an NCCL rank) seeded cuda:0's generator while dropout drew from cuda:1's, so every
    batch had the same masks; cuda:5 on a 2-GPU machine failed later as 'invalid device
    ordinal', read back as tables too large for memory."""
    import torch

    from streamlearn.device import pick_device
    from streamlearn.exceptions import ConfigError

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    assert pick_device("auto") == pick_device("cuda") == torch.device("cuda", 1)
    assert pick_device("cuda:0") == torch.device("cuda", 0) and pick_device("cpu") == torch.device("cpu")
    with pytest.raises(ConfigError, match=r"learner.device='cuda:5': this machine has 2 GPU\(s\), cuda:0 to cuda:1"):
        pick_device("cuda:5")


def test_checking_a_device_opens_no_cuda_context(monkeypatch):
    """Was: `serve --workers N --device cuda` checked the device in its supervisor with
    pick_device, whose torch.cuda.current_device() opens a CUDA context (hundreds of MB of
    GPU memory) in a process that never runs a model."""
    import torch

    from streamlearn.device import check_device
    from streamlearn.exceptions import ConfigError

    def opens_a_context():
        raise AssertionError("a CUDA context was opened")

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "current_device", opens_a_context)
    assert check_device("auto") == check_device("cuda") == torch.device("cuda")
    assert check_device("cuda:1") == torch.device("cuda", 1) and check_device("cpu") == torch.device("cpu")
    with pytest.raises(ConfigError, match=r"this machine has 2 GPU\(s\)"):
        check_device("cuda:2")


def test_asking_for_cuda_without_one_names_the_device_and_both_places_to_change_it(monkeypatch):
    """Was: 'learner.device asks for CUDA ... set learner.device=auto or cpu' also for
    `inspect --device cuda` and `serve --device cuda`, where the value came from the flag."""
    import torch

    from streamlearn.device import check_device
    from streamlearn.exceptions import ConfigError

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ConfigError, match=r"device 'cuda:1' asks for CUDA but none is available: use auto or cpu "
                                          r"\(learner.device, or the command's --device\)"):
        check_device("cuda:1")
    assert check_device("auto") == torch.device("cpu")
