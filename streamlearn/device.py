"""Where the model runs: the torch device, host-to-device copies, autocast, seeded RNG.

CUDA when available (``learner.device = "auto"``), else the CPU. On CUDA, numpy batches
are copied through pinned memory without blocking, and training's forward passes run
under bf16 autocast (answers stay float32: ``Learner._inference``); on the CPU arrays
become tensors without a copy.

>>> dev = Device.pick("cpu")
>>> dev.tensor(np.arange(3)).tolist()
[0, 1, 2]
"""
from __future__ import annotations

import contextlib
import os
from typing import Iterator

import numpy as np
import torch

from .config import Config
from .exceptions import ConfigError

__all__ = ["Device", "adopt_threads", "intra_op_threads", "pick_device", "set_threads", "torch_default_threads",
           "usable_cpus"]

_SET_COUNT: int | None = None  # the intra-op thread count streamlearn last set (adopt_threads, set_threads)
_PINNED = False  # set_threads was called: that count stays


class Device:
    """One torch device and the conventions of moving batches to it."""

    def __init__(self, device: torch.device):
        self.torch = device
        self.cuda = device.type == "cuda"

    @classmethod
    def pick(cls, name: str) -> "Device":
        return cls(pick_device(name))

    def tensor(self, a: np.ndarray) -> torch.Tensor:
        """A numpy array on this device (no copy on the CPU; pinned, non-blocking on CUDA)."""
        a = np.ascontiguousarray(a)
        t = torch.from_numpy(a if a.flags.writeable else a.copy())  # torch refuses read-only views
        if self.cuda:
            return t.pin_memory().to(self.torch, non_blocking=True)
        return t

    def tensors(self, arrays: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
        return {name: self.tensor(a) for name, a in arrays.items()}

    def autocast(self) -> contextlib.AbstractContextManager:
        """bf16 autocast on CUDA; a no-op on the CPU."""
        return torch.autocast(self.torch.type, dtype=torch.bfloat16, enabled=self.cuda)

    @contextlib.contextmanager
    def seeded(self, seed: int) -> Iterator[None]:
        """This device's default generator seeded with ``seed`` inside the block, then
        put back (so dropout draws are a function of the seed, across a restore)."""
        # Seeds only this device's generator: torch.manual_seed would also queue a seed
        # for every CUDA device, which records a stack trace on each call.
        with torch.random.fork_rng(devices=[self.torch] if self.cuda else []):
            gen = torch.cuda.default_generators[self.torch.index] if self.cuda else torch.default_generator
            gen.manual_seed(seed)
            yield

    def synchronize(self) -> None:
        """Wait for the work queued on this device (CUDA runs it asynchronously): a clock
        read after this counts that work. A no-op on the CPU."""
        if self.cuda:
            torch.cuda.synchronize(self.torch)

    def describe(self) -> str:
        """The device in words, for reports: the GPU's name, or the CPU and its core count."""
        if self.cuda:
            return f"CUDA on {torch.cuda.get_device_name(self.torch)}, bf16 autocast in training"
        return f"CPU, {usable_cpus()} cores"

    def __repr__(self) -> str:
        return f"Device({self.torch})"


def pick_device(name: str) -> torch.device:
    """"auto" -> CUDA when available, else CPU; otherwise the named device. A CUDA device
    always carries its index ("cuda" and "auto" are the current device, as torch's own
    ops take them): the seeded dropout generator (:meth:`Device.seeded`) must be the one
    the ops draw from, which for a process whose current device is not 0 (an NCCL rank)
    it was not."""
    device = check_device(name)
    if device.type != "cuda" or device.index is not None:
        return device
    return torch.device("cuda", torch.cuda.current_device())


def check_device(name: str) -> torch.device:
    """The device ``name`` names ("auto" resolved), checked against this machine without
    opening a CUDA context (:func:`pick_device` without the current device's index): a
    process that only checks, such as ``serve --workers``' supervisor, keeps its GPU memory
    free for the processes that use the device."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        device = torch.device(name)
    except RuntimeError as exc:
        raise ConfigError(f"learner.device={name!r} is not a device: use auto, cpu or cuda[:N]") from exc
    if device.type != "cuda":
        return device
    if not torch.cuda.is_available():
        raise ConfigError(f"device {name!r} asks for CUDA but none is available: use auto or cpu "
                          "(learner.device, or the command's --device)")
    count = torch.cuda.device_count()
    if device.index is not None and device.index >= count:
        raise ConfigError(f"learner.device={name!r}: this machine has {count} GPU(s), cuda:0 to cuda:{count - 1}")
    return device


def intra_op_threads(cfg: Config) -> int:
    """torch intra-op threads for a process that trains or replays a learner:
    ``worker.torch_threads`` when > 0, else one less than the CPUs this process may use. On a busy machine, oversubscribed OpenMP threads spin and can
    slow small steps down tens of times (measured here: a replay at 2 threads on a
    loaded 2-core box ran 70x slower)."""
    if cfg.worker.torch_threads > 0:
        return cfg.worker.torch_threads
    return max(1, usable_cpus() - 1)


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity mask where the OS has one)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def torch_default_threads() -> int | None:
    """The intra-op thread count torch gives a process that chose none: one per physical
    core (torch counts them with cpuinfo; here the distinct (physical id, core id) pairs
    of /proc/cpuinfo, else ``os.cpu_count()``). None when ``OMP_NUM_THREADS`` or
    ``MKL_NUM_THREADS`` is set: then the environment chose the count."""
    if os.environ.get("OMP_NUM_THREADS") or os.environ.get("MKL_NUM_THREADS"):
        return None
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            cores, physical = set(), "0"
            for line in f:
                name, _, value = line.partition(":")
                name = name.strip()
                if name == "physical id":
                    physical = value.strip()
                elif name == "core id":
                    cores.add((physical, value.strip()))
    except OSError:
        cores = set()
    return len(cores) or os.cpu_count() or 1


def adopt_threads(cfg: Config) -> bool:
    """Set torch's intra-op threads to :func:`intra_op_threads` of ``cfg`` unless someone
    chose a count: only while torch is at its default count (:func:`torch_default_threads`)
    or at the count streamlearn set before, and never after :func:`set_threads`. Returns
    whether the count is streamlearn's now. The :class:`~streamlearn.learner.Learner`
    calls it when built (so do ``replay()`` and ``Snapshot``, which build one): torch's
    default, a thread per core, runs a depth-0 step or a ``learn_one`` call 10-30x slower
    on a busy machine (OpenMP workers spin against the process's other threads), and a
    program that never set a count gets the fast one. A program that called
    ``torch.set_num_threads`` keeps its count (a count equal to torch's default reads as
    the default: pin it with ``worker.torch_threads``, or with :func:`set_threads`)."""
    global _SET_COUNT
    now = torch.get_num_threads()
    if _PINNED or (now != _SET_COUNT and now != torch_default_threads()):
        return False
    want = intra_op_threads(cfg)
    if want != now:
        torch.set_num_threads(want)
    _SET_COUNT = want
    return True


def set_threads(count: int) -> None:
    """Set torch's intra-op threads to ``count`` and keep it: learners built later leave
    it (the service's ``--threads``; a program's explicit choice)."""
    global _SET_COUNT, _PINNED
    torch.set_num_threads(count)
    _SET_COUNT, _PINNED = count, True
