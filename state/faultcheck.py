"""Fault injection for the commit protocol: SIGKILL a writer at random instants and check
that the directory reopens at exactly one complete checkpoint, with that checkpoint's offsets.

A child process (``python -m streamlearn.state.faultcheck faults DIR SEED SCALE``) commits
checkpoint 1, 2, ... in a loop; checkpoint ``i`` is a pure function of ``(seed, i)``
(:func:`make_checkpoint`), so the parent can rebuild the state after any prefix of them
(:class:`Reference`). The child resumes from the step it finds, so one directory collects
several kills. After each kill the parent reopens the directory read-only, reads the step
``s`` of the manifest and compares the ENTIRE state (every row of every table, blobs, kv,
offsets, records applied, config, metrics) with the reference after checkpoint ``s``. It
also checks ``s`` against the child's log: at least the last checkpoint the child saw
committed, at most the one it had begun.

``python -m streamlearn.state.faultcheck uniform DIR`` is the writer of the snapshot test:
checkpoint ``i`` sets every row of table ``u`` to ``i``, so a reader can tell a mixed read.

Used by tests/test_state_faults.py (a handful of kills) and bench/state_faults.py (>= 50).
"""
from __future__ import annotations

import argparse
import os
import random
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..config import StoreConfig
from .exceptions import NotAStoreError
from .factory import open_store
from .schema import Checkpoint, TableSpec

TABLES = (
    TableSpec("emb.E", rows=60_000, width=32),
    TableSpec("emb.E.adagrad", rows=60_000, width=1),
    TableSpec("emb.P", rows=20_000, width=2, dtype="float64"),
)
UNIFORM = TableSpec("u", rows=4_000, width=16)
HIST_KEYS = 400


def make_checkpoint(seed: int, i: int, scale: int) -> Checkpoint:
    """Checkpoint ``i`` of a run: rows (with repeated ids), blobs set and deleted, kv keys
    set and deleted, offsets and records applied on two partitions. ``scale`` is the number
    of rows per table (about); bigger checkpoints stay longer in flight."""
    rng = np.random.default_rng([seed, i])
    rows = {}
    for spec in TABLES:
        n = int(rng.integers(scale // 2, scale + 1))
        ids = rng.integers(0, spec.rows, n)  # repeats on purpose: the last value must win
        rows[spec.name] = (ids, rng.standard_normal((n, spec.width)).astype(spec.dtype))
    blobs: dict[str, bytes | None] = {"dense": rng.bytes(int(rng.integers(1_000, 200_000)))}
    if i % 3 == 0:
        blobs["labels"] = f"labels-{i}".encode()
    blobs["tmp"] = None if i % 2 else rng.bytes(100)
    keys = rng.choice(HIST_KEYS, 60, replace=False)
    kv: dict[bytes, bytes | None] = {f"k{k}".encode(): f"{i}:{k}".encode() for k in keys[:50]}
    kv.update({f"k{k}".encode(): None for k in keys[50:]})
    return Checkpoint(
        step=i * 10,
        offsets={"t:0": i * 100 + int(rng.integers(100)), "t:1": i * 37},
        records_applied={"t:0": i * 90, "t:1": i * 30},
        rows=rows, blobs=blobs, kv={"hist": kv},
        config={"seed": seed, "scale": scale}, metrics={"checkpoint": i, "loss": 1.0 / i},
    )


@dataclass
class Reference:
    """The state after checkpoints 1..n, rebuilt independently of the store's code."""

    seed: int
    scale: int
    n: int = 0
    values: dict[str, np.ndarray] = field(default_factory=dict)
    found: dict[str, np.ndarray] = field(default_factory=dict)
    blobs: dict[str, bytes] = field(default_factory=dict)
    kv: dict[bytes, bytes] = field(default_factory=dict)
    offsets: dict[str, int] = field(default_factory=dict)
    records_applied: dict[str, int] = field(default_factory=dict)
    config: dict | None = None
    metrics: dict | None = None

    def __post_init__(self) -> None:
        for spec in TABLES:
            self.values[spec.name] = np.zeros((spec.rows, spec.width), spec.dtype)
            self.found[spec.name] = np.zeros(spec.rows, bool)

    @property
    def step(self) -> int:
        return self.n * 10

    def advance_to(self, n: int) -> None:
        if n < self.n:
            raise AssertionError(f"the store went back from checkpoint {self.n} to {n}")
        while self.n < n:
            self.n += 1
            self._apply(make_checkpoint(self.seed, self.n, self.scale))

    def _apply(self, ckpt: Checkpoint) -> None:
        for name, (ids, vals) in ckpt.rows.items():
            order = np.argsort(ids, kind="stable")  # equal ids keep their order: take the last
            last = order[np.r_[ids[order][1:] != ids[order][:-1], True]]
            self.values[name][ids[last]] = vals[last]
            self.found[name][ids[last]] = True
        for name, blob in ckpt.blobs.items():
            self.blobs.pop(name, None) if blob is None else self.blobs.__setitem__(name, blob)
        for key, value in ckpt.kv["hist"].items():
            self.kv.pop(key, None) if value is None else self.kv.__setitem__(key, value)
        self.offsets.update(ckpt.offsets)
        self.records_applied.update(ckpt.records_applied)
        self.config, self.metrics = ckpt.config, ckpt.metrics


def differences(store, ref: Reference) -> list[str]:
    """Every way the store's whole state differs from the reference (empty: identical)."""
    out = []
    with store.snapshot():
        m = store.manifest()
        expect = {"step": ref.step, "offsets": ref.offsets, "records_applied": ref.records_applied,
                  "config": ref.config, "metrics": ref.metrics, "commits": None}
        for key, want in expect.items():
            got = getattr(m, key)
            if want is not None and got != want:
                out.append(f"manifest {key}: {got!r} != {want!r}")
        for spec in TABLES:
            out += _table_differences(store, spec, ref)
        stored_blobs = store.stats()["blobs"]
        if set(stored_blobs) != set(ref.blobs):
            out.append(f"blob names {sorted(stored_blobs)} != {sorted(ref.blobs)}")
        out += [f"blob {n!r} differs" for n in ref.blobs if store.read_blob(n) != ref.blobs[n]]
        if dict(store.iter_kv("hist")) != ref.kv:
            out.append("kv namespace 'hist' differs")
    return out


def _table_differences(store, spec: TableSpec, ref: Reference) -> list[str]:
    parts = list(store.iter_rows(spec.name))
    ids = np.concatenate([p[0] for p in parts]) if parts else np.zeros(0, np.int64)
    vals = np.concatenate([p[1] for p in parts]) if parts else np.zeros((0, spec.width), spec.dtype)
    want = np.flatnonzero(ref.found[spec.name])
    order = np.argsort(ids)
    if not np.array_equal(ids[order], want):
        return [f"table {spec.name}: {len(ids)} stored rows, reference has {len(want)} (or other ids)"]
    if not np.array_equal(vals[order], ref.values[spec.name][want]):
        return [f"table {spec.name}: row values differ"]
    return []


# -- the child processes ---------------------------------------------------------------
def _faults_child(args: argparse.Namespace) -> None:
    cfg = StoreConfig(map_size_gb=args.map_mb / 1024, grow_map=True, sync=bool(args.sync))
    with open_store(args.dir, cfg) as store:
        store.declare_tables(TABLES)
        i = store.manifest().step // 10 + 1
        print("ready", i - 1, flush=True)
        while True:
            ckpt = make_checkpoint(args.seed, i, args.scale)
            print("begin", i, flush=True)
            store.commit(ckpt)
            print("end", i, flush=True)
            i += 1


def _uniform_child(args: argparse.Namespace) -> None:
    ids = np.arange(UNIFORM.rows)
    cfg = StoreConfig(map_size_gb=args.map_mb / 1024, sync=bool(args.sync))
    with open_store(args.dir, cfg) as store:
        store.declare_tables([UNIFORM])
        for i in range(1, args.commits + 1):
            values = np.full((UNIFORM.rows, UNIFORM.width), i, np.float32)
            store.commit(Checkpoint(step=i, offsets={"u:0": i}, rows={"u": (ids, values)},
                                    blobs={"step": str(i).encode()}))
            print("end", i, flush=True)
            time.sleep(args.pause_ms / 1000)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m streamlearn.state.faultcheck")
    sub = parser.add_subparsers(dest="mode", required=True)
    faults = sub.add_parser("faults")
    faults.add_argument("dir")
    faults.add_argument("seed", type=int)
    faults.add_argument("scale", type=int)
    uniform = sub.add_parser("uniform")
    uniform.add_argument("dir")
    uniform.add_argument("--commits", type=int, default=1_000_000)
    uniform.add_argument("--pause-ms", type=float, default=0.0, help="sleep between commits")
    for p in (faults, uniform):
        p.add_argument("--map-mb", type=float, default=4.0)
        p.add_argument("--sync", type=int, default=1)
    args = parser.parse_args(argv)
    (_faults_child if args.mode == "faults" else _uniform_child)(args)


# -- the parent: one kill and its check --------------------------------------------------
@dataclass
class Kill:
    directory: str
    delay: float  # seconds after the child reported ready (negative: before ready)
    step: int  # checkpoint number the reopened store reports
    last_begun: int
    last_ended: int
    in_commit: bool  # the child's last log line was "begin": killed inside Store.commit
    problems: list[str]


def child_command(directory: str | os.PathLike, seed: int, scale: int, map_mb: float, sync: bool) -> list[str]:
    return [sys.executable, "-m", "streamlearn.state.faultcheck", "faults", str(directory),
            str(seed), str(scale), "--map-mb", str(map_mb), "--sync", str(int(sync))]


def kill_once(directory: Path, ref: Reference, rng: random.Random, max_delay: float,
              map_mb: float = 4.0, sync: bool = True, early: bool | None = None) -> Kill:
    """Start a child on ``directory``, SIGKILL it after a random delay, check the reopened
    state. ``early``: kill before the child is ready (while it opens and declares); by
    default one kill in ten."""
    log_path = directory.with_suffix(".log")
    with open(log_path, "w") as log:
        proc = subprocess.Popen(child_command(directory, ref.seed, ref.scale, map_mb, sync),
                                stdout=log, stderr=subprocess.STDOUT)
    early = rng.random() < 0.1 if early is None else early
    delay = rng.uniform(0.0, 0.3) if early else rng.uniform(0.0, max_delay)
    if not early:
        _wait_ready(log_path, proc)
    time.sleep(delay)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    prior = ref.n  # the store held checkpoint `prior` when this child started
    begun, ended, last = _read_log(log_path)
    begun, ended = max(begun, prior), max(ended, prior)
    problems, step = _check(directory, ref, begun)
    if not ended <= step <= begun:
        problems.append(f"store at checkpoint {step}, but the child had committed {ended} and begun {begun}")
    return Kill(str(directory), -delay if early else delay, step, begun, ended, last == "begin", problems)


def _wait_ready(log_path: Path, proc: subprocess.Popen, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while "ready" not in log_path.read_text():
        if proc.poll() is not None:
            raise RuntimeError(f"fault child exited early:\n{log_path.read_text()}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"fault child not ready after {timeout}s")
        time.sleep(0.005)


def _read_log(log_path: Path) -> tuple[int, int, str]:
    begun = ended = 0
    last = ""
    text = log_path.read_text()
    lines = text.splitlines()
    if lines and not text.endswith("\n"):
        # SIGKILL can land inside a print: a cut last line announces an action the child
        # had not started ("begin") or had already finished ("end"); either way the
        # bounds from the complete lines still hold.
        lines.pop()
    for line in lines:
        word, _, number = line.partition(" ")
        if word in ("begin", "end", "ready") and number.isdigit():
            last = word
            value = int(number)
            begun = max(begun, value) if word == "begin" else begun
            ended = max(ended, value) if word in ("end", "ready") else ended
        else:
            raise AssertionError(f"fault child wrote {line!r}:\n{log_path.read_text()}")
    return max(begun, ended), ended, last


def _check(directory: Path, ref: Reference, begun: int) -> tuple[list[str], int]:
    try:
        store = open_store(directory, readonly=True)
    except NotAStoreError:
        if begun == 0 and ref.n == 0:
            return [], 0  # killed while creating the directory: nothing was ever committed
        raise
    with store:
        n = store.manifest().step // 10
        ref.advance_to(n)
        return differences(store, ref), n


if __name__ == "__main__":
    main()
