"""The query service under load while a trainer checkpoints into the same state directory.

    python bench/serve.py [--trainer worker|loop] [--windows 3] [--window-seconds 6]
                          [--clients 16] [--no-pin] [--worst-case-reload]

Processes (default config: classify, hash embeddings K=1e6, B=1e5, d=64, 1 layer):

- trainer (``--trainer worker``, the default): ``streamlearn worker`` consuming the bundled
  SMS Spam Collection (cycled to enough records for the run) from the embedded broker,
  checkpointing every ``--checkpoint-every`` records; its records/s come from its
  Prometheus counter and its commits from the manifest (polled every 20 ms).
  ``--trainer loop``: a Learner loop in a process of its own making the same store
  commits without Kafka (no broker needed);
- ``streamlearn serve --state DIR`` (1 worker, 1 torch thread);
- a load generator: ``--clients`` concurrent closed-loop clients (raw asyncio HTTP/1.1,
  keep-alive, so the generator costs little CPU) POSTing single-record /v1/predict.

Windows alternate load off / load on (``--windows`` of each, ``--window-seconds`` long),
so the trainer's records/s with and without the service busy come from the same run and
the same machine state; the ratio is printed. By default the trainer is pinned to CPU 0
and the server and load generator to CPU 1 (``--no-pin``: let the OS schedule all three).

Also measured: freshness (time from a commit to the first answer carrying its step),
in-process ``Snapshot.predict`` latency (reference: ``Learner.predict_proba_many`` on a
learner restored from the same state), and with ``--worst-case-reload`` the time a full
reload of every row takes once every row is stored (what the lazy design avoids).
Targets: p99 <= 20 ms, trainer drop <= 20%, freshness <= 1 s.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
from options import between, parser_for, positive_float, positive_int, run_main

P99_TARGET_MS, DROP_TARGET, FRESH_TARGET_S = 20.0, 0.20, 1.0


# ---------------------------------------------------------------------------- roles

def trainer(args: argparse.Namespace) -> None:
    """Learn batches forever; print one JSON line per batch and per commit."""
    import torch

    from streamlearn.checkpoint import write
    from streamlearn.config import Config
    from streamlearn.datasets import DatasetReader, bundled_path
    from streamlearn.learner import Learner
    from streamlearn.state import Checkpoint, open_store

    torch.set_num_threads(1)
    records = [row.record for row in DatasetReader(bundled_path())]
    learner = Learner(Config())
    store = open_store(args.state)
    since, step, i = 0, 0, 0
    while True:
        batch = [records[(i + j) % len(records)] for j in range(32)]
        i += 32
        learner.learn_many(batch)
        since += len(batch)
        print(json.dumps({"t": time.time(), "n": len(batch)}), flush=True)
        if since >= args.checkpoint_every:
            step += 1
            specs, rows, blobs, kv = write(learner)
            started = time.time()
            store.declare_tables(specs)
            store.commit(Checkpoint(step=step, rows=rows, blobs=blobs, kv=kv, config=learner.cfg.to_dict()))
            print(json.dumps({"commit": step, "t": time.time(), "seconds": time.time() - started}), flush=True)
            since = 0


def load(args: argparse.Namespace) -> None:
    """Closed-loop clients for ``--seconds``; print one JSON object of samples."""
    from streamlearn.datasets import DatasetReader, bundled_path

    texts = [row.record["text"] for row in DatasetReader(bundled_path())]
    bodies = [json.dumps({"text": t}).encode() for t in texts]
    samples: list[tuple[float, float, int, int]] = []  # (wall time at answer, latency s, status, step)
    asyncio.run(_clients(args.port, args.clients, args.seconds, bodies, samples))
    print(json.dumps(samples))


async def _clients(port: int, n: int, seconds: float, bodies: list[bytes], out: list) -> None:
    stop = time.perf_counter() + seconds
    await asyncio.gather(*(_client(port, bodies[i::n], stop, out) for i in range(n)))


async def _client(port: int, bodies: list[bytes], stop: float, out: list) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    i = 0
    while time.perf_counter() < stop:
        body = bodies[i % len(bodies)]
        i += 1
        head = (b"POST /v1/predict HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\n"
                b"Content-Length: %d\r\n\r\n" % len(body))
        started = time.perf_counter()
        writer.write(head + body)
        status, payload = await _response(reader)
        latency = time.perf_counter() - started
        step = json.loads(payload).get("snapshot_step", -1) if status == 200 else -1
        out.append((time.time(), latency, status, step))
    writer.close()


async def _response(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    status = int((await reader.readline()).split()[1])
    length = 0
    while (line := await reader.readline()) not in (b"\r\n", b""):
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    return status, await reader.readexactly(length)


# ---------------------------------------------------------------------------- orchestration

class Trainer:
    """The trainer subprocess and its batch/commit log (read by a thread)."""

    def __init__(self, state: str, checkpoint_every: int, cpu: int | None):
        cmd = [sys.executable, __file__, "--role", "trainer", "--state", state,
               "--checkpoint-every", str(checkpoint_every)]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, preexec_fn=_pin(cpu))
        self.batches: list[tuple[float, int]] = []
        self.commits: list[tuple[int, float, float]] = []
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            event = json.loads(line)
            if "commit" in event:
                self.commits.append((event["commit"], event["t"], event["seconds"]))
            else:
                self.batches.append((event["t"], event["n"]))

    def rate(self, start: float, end: float) -> float:
        """Records/s learned between wall times ``start`` and ``end``."""
        n = sum(count for t, count in list(self.batches) if start <= t < end)
        return n / (end - start)

    def cpu_seconds(self) -> float:
        """CPU time the trainer has used (user + system)."""
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()


class WorkerTrainer:
    """``streamlearn worker`` on the embedded broker, with the same reporting interface as
    :class:`Trainer`: records from the worker's ``records_total`` counter (sampled every
    0.25 s), commits from the state's manifest (polled every 20 ms)."""

    def __init__(self, state: str, checkpoint_every: int, cpu: int | None, records: int):
        from streamlearn.broker import EmbeddedBroker, create_topic, produce_rows
        from streamlearn.datasets import DatasetReader, bundled_path

        self.broker = EmbeddedBroker().start()
        if cpu is not None:
            os.sched_setaffinity(self.broker.pid, {cpu})  # the broker feeds the worker: its CPU
        create_topic(self.broker.bootstrap, "bench-serve", 1)
        rows = list(DatasetReader(bundled_path()))
        produce_rows(self.broker.bootstrap, "bench-serve", (rows[i % len(rows)] for i in range(records)),
                     timeout_s=30.0)
        self.metrics_port = free_port()
        cmd = [sys.executable, "-m", "streamlearn.cli", "worker", "--topic", "bench-serve", "--state", state,
               "--bootstrap", self.broker.bootstrap, "--checkpoint-every", str(checkpoint_every),
               "--metrics-port", str(self.metrics_port)]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, preexec_fn=_pin(cpu))
        self.state, self.samples, self.commits = state, [], []
        self._stop = threading.Event()
        threading.Thread(target=self._sample_records, daemon=True).start()
        threading.Thread(target=self._watch_commits, daemon=True).start()

    def _sample_records(self) -> None:
        while not self._stop.wait(0.25):
            count = _scrape_counter(self.metrics_port, "streamlearn_worker_records_total")
            if count is not None:
                self.samples.append((time.time(), count))

    def _watch_commits(self) -> None:
        from streamlearn.state import open_store

        while not os.path.exists(os.path.join(self.state, "data.mdb")):
            if self._stop.wait(0.05):
                return
        with open_store(self.state, readonly=True) as store:
            seen = 0
            while not self._stop.wait(0.02):
                manifest = store.manifest()
                if manifest.commits != seen:
                    seen = manifest.commits
                    self.commits.append((manifest.step, manifest.committed_at, float("nan")))

    def rate(self, start: float, end: float) -> float:
        inside = [(t, n) for t, n in list(self.samples) if start <= t <= end]
        if len(inside) < 2:
            return float("nan")
        (t0, n0), (t1, n1) = inside[0], inside[-1]
        return (n1 - n0) / (t1 - t0)

    def cpu_seconds(self) -> float:
        return Trainer.cpu_seconds(self)

    def stop(self) -> None:
        self._stop.set()
        self.proc.kill()
        self.proc.wait()
        self.broker.stop()


def _scrape_counter(port: int, name: str) -> float | None:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
            s.sendall(b"GET /metrics HTTP/1.1\r\nHost: bench\r\nConnection: close\r\n\r\n")
            data = b""
            while chunk := s.recv(65536):
                data += chunk
    except OSError:
        return None
    for line in data.decode().splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return None


def cpu_busy_seconds(cpu: int | None) -> float:
    """Busy time of one CPU (all CPUs when None) from /proc/stat."""
    name = "cpu" if cpu is None else f"cpu{cpu}"
    for line in Path("/proc/stat").read_text().splitlines():
        parts = line.split()
        if parts[0] == name:
            ticks = [int(x) for x in parts[1:8]]
            return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")  # minus idle, iowait
    raise SystemExit(f"no {name} line in /proc/stat")


class Window:
    """One measurement window: trainer records/s, its CPU share, and how much of the
    trainer's CPU other processes used (the machine is shared)."""

    def __init__(self, train: Trainer, cpu: int | None):
        self.train, self.cpu = train, cpu
        self.start, self.cpu0, self.busy0 = time.time(), train.cpu_seconds(), cpu_busy_seconds(cpu)

    def close(self) -> dict:
        end = time.time()
        wall = end - self.start
        used = self.train.cpu_seconds() - self.cpu0
        others = cpu_busy_seconds(self.cpu) - self.busy0 - used
        records = self.train.rate(self.start, end) * wall
        return {"rate": self.train.rate(self.start + 0.5, end),  # skips the load generator's start-up
                "share": used / wall, "per_cpu_s": records / max(used, 1e-9), "others": others / wall}


def _pin(cpu: int | None):
    if cpu is None:
        return None
    return lambda: os.sched_setaffinity(0, {cpu})


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(port: int, proc: subprocess.Popen, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit("streamlearn serve exited before answering /healthz")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
                s.sendall(b"GET /healthz HTTP/1.1\r\nHost: bench\r\nConnection: close\r\n\r\n")
                if s.recv(64).startswith(b"HTTP/1.1 200"):
                    return
        except OSError:
            pass
        time.sleep(0.3)
    raise SystemExit("streamlearn serve did not answer /healthz in time")


def run_load(port: int, clients: int, seconds: float, cpu: int | None) -> list:
    cmd = [sys.executable, __file__, "--role", "load", "--port", str(port), "--clients", str(clients),
           "--seconds", str(seconds)]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, preexec_fn=_pin(cpu))
    return json.loads(out.stdout)


def percentiles(latencies_s: list[float]) -> tuple[float, float]:
    ms = np.asarray(latencies_s) * 1e3
    return float(np.percentile(ms, 50)), float(np.percentile(ms, 99))


def freshness(commits: list[tuple[int, float, float]], samples: list) -> list[float]:
    """Per commit made during one load window (and at least 1 s before its end): seconds
    until the first answer with its step or a later one."""
    answers = sorted((t, step) for t, _, status, step in samples if status == 200)
    if not answers:
        return []
    first, last = answers[0][0], answers[-1][0]
    lags = []
    for step, at, _ in commits:
        if first <= at <= last - FRESH_TARGET_S:
            later = [t for t, s in answers if s >= step and t >= at]
            lags.append(later[0] - at if later else float("inf"))
    return lags


def in_process_latency(state: str, seconds: float) -> dict:
    """Snapshot.predict (single record) while the trainer runs, and the reference:
    a learner restored from the state (no refresh, no row reads)."""
    import torch

    from streamlearn.checkpoint import read_full
    from streamlearn.datasets import DatasetReader, bundled_path
    from streamlearn.snapshot import Snapshot
    from streamlearn.state import open_store

    torch.set_num_threads(1)
    texts = [row.record["text"] for row in DatasetReader(bundled_path())]
    out = {}
    with Snapshot.open(state) as snap:
        steps: list[int] = []
        out["snapshot"] = _time_calls(lambda q: steps.append(snap.predict(q).step), texts, seconds, out)
    # The first query at a new step pays the advance (dense weights, labels) and re-reads its rows.
    times = out.pop("times")
    firsts = [t for i, t in enumerate(times) if i and steps[i] != steps[i - 1]]
    out["advance_ms"] = (float(np.median(firsts)) * 1e3, float(max(firsts)) * 1e3, len(firsts)) if firsts else None
    with open_store(state, readonly=True) as store:
        started = time.perf_counter()
        learner = read_full(store)
        out["restore_seconds"] = time.perf_counter() - started
    out["learner"] = _time_calls(lambda q: learner.predict_proba_many(q), texts, seconds)
    return out


def _time_calls(fn, texts: list[str], seconds: float, keep: dict | None = None) -> tuple[float, float, int]:
    times, i, stop = [], 0, time.perf_counter() + seconds
    while time.perf_counter() < stop:
        query = [{"text": texts[i % len(texts)]}]
        i += 1
        started = time.perf_counter()
        fn(query)
        times.append(time.perf_counter() - started)
    if keep is not None:
        keep["times"] = times
    return (*percentiles(times[10:]), len(times))


def worst_case_reload(tmp: str) -> dict:
    """Every row of the default model stored (a full checkpoint): a full reload of the
    model tables vs what the snapshot reads when it advances (lazy)."""
    import torch

    from streamlearn.checkpoint import write
    from streamlearn.config import Config
    from streamlearn.learner import Learner
    from streamlearn.snapshot import Snapshot
    from streamlearn.state import Checkpoint, open_store

    torch.set_num_threads(1)
    state = os.path.join(tmp, "full")
    learner = Learner(Config())
    learner.learn_many([{"text": "free prize now", "label": "spam"}, {"text": "see you", "label": "ham"}])
    with open_store(state) as store:
        specs, rows, blobs, kv = write(learner, full=True)
        store.declare_tables(specs)
        store.commit(Checkpoint(step=1, rows=rows, blobs=blobs, kv=kv, config=learner.cfg.to_dict()))
        snap = Snapshot(store)
        learner.learn_many([{"text": "call now", "label": "spam"}])
        specs, rows, blobs, kv = write(learner)
        store.commit(Checkpoint(step=2, rows=rows, blobs=blobs, kv=kv, config=learner.cfg.to_dict()))
        started = time.perf_counter()
        snap.predict([{"text": "free call"}])  # advance + lazy rows + forward
        advance = time.perf_counter() - started
        out = {}
        for name in ("E", "P"):
            table = learner.model.row_tables()[name].detach().numpy().copy()
            started = time.perf_counter()
            store.load_table(name, table)
            out[name] = time.perf_counter() - started
    return {"advance_and_first_query_s": advance, "full_reload_s": out}


def orchestrate(args: argparse.Namespace) -> None:
    pin = not args.no_pin
    cpu_train, cpu_serve = (0, 1) if pin else (None, None)
    tmp = tempfile.mkdtemp(prefix="bench-serve-")
    state, port = os.path.join(tmp, "state"), free_port()
    if args.trainer == "worker":
        records = int(12_000 * (2 * args.windows * args.window_seconds + 40))  # more than it can learn (depth 0: ~8,000 rec/s)
        train = WorkerTrainer(state, args.checkpoint_every, cpu_train, records)
    else:
        train = Trainer(state, args.checkpoint_every, cpu_train)
    server = None
    try:
        while not train.commits:
            if train.proc.poll() is not None:
                raise SystemExit("the trainer exited before its first checkpoint")
            time.sleep(0.2)
        server = subprocess.Popen([sys.executable, "-m", "streamlearn.cli", "serve", "--state", state,
                                   "--port", str(port), "--threads", "1"],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, preexec_fn=_pin(cpu_serve))
        wait_healthy(port, server)
        run_load(port, args.clients, 2.0, cpu_serve)  # warm-up, discarded
        off_windows, on_windows, samples, lags = [], [], [], []
        for _ in range(args.windows):
            window = Window(train, cpu_train)
            time.sleep(args.window_seconds)
            off_windows.append(window.close())
            window = Window(train, cpu_train)
            answers = run_load(port, args.clients, args.window_seconds, cpu_serve)
            on_windows.append(window.close())
            samples.extend(answers)
            lags.extend(freshness(list(train.commits), answers))
        server.send_signal(signal.SIGINT)
        server.wait(timeout=30)
        server = None
        if pin:
            os.sched_setaffinity(0, {cpu_serve})
        inproc = in_process_latency(state, args.window_seconds)
        commit_s = [s for _, _, s in train.commits]
    finally:
        if server is not None:
            server.kill()
            server.wait()
        train.stop()
    report(args, samples, off_windows, on_windows, lags, inproc, commit_s, pin)
    if args.worst_case_reload:
        print("worst case (every row stored):", json.dumps(worst_case_reload(tmp), indent=None))
    shutil.rmtree(tmp, ignore_errors=True)


def report(args, samples, off_windows, on_windows, lags, inproc, commit_s, pin) -> None:
    ok = [s for s in samples if s[2] == 200]
    errors = len(samples) - len(ok)
    seconds = args.windows * args.window_seconds
    p50, p99 = percentiles([s[1] for s in ok])
    off_rates, on_rates = [w["rate"] for w in off_windows], [w["rate"] for w in on_windows]
    off, on = float(np.mean(off_rates)), float(np.mean(on_rates))
    drop = 1 - on / off
    mean = lambda ws, key: float(np.mean([w[key] for w in ws]))  # noqa: E731
    trainer = "streamlearn worker (embedded broker)" if args.trainer == "worker" else "a Learner loop"
    print(f"bench/serve.py: trainer {trainer}, {args.clients} closed-loop clients, {args.windows} x "
          f"{args.window_seconds} s load windows, checkpoint every {args.checkpoint_every} records, "
          f"{'trainer on CPU 0, server + load on CPU 1' if pin else 'unpinned'}")
    print(f"  POST /v1/predict (1 record): p50 {p50:.2f} ms  p99 {p99:.2f} ms  "
          f"{len(ok) / seconds:.0f} req/s  errors {errors}   target p99 <= {P99_TARGET_MS:.0f} ms: "
          f"{'OK' if p99 <= P99_TARGET_MS else 'MISSED'}")
    print(f"  trainer records/s: no load {off:.0f} (windows {', '.join(f'{r:.0f}' for r in off_rates)}), "
          f"under load {on:.0f} (windows {', '.join(f'{r:.0f}' for r in on_rates)})")
    print(f"  trainer throughput ratio loaded/unloaded {on / off:.3f} (drop {drop:.1%}; target <= "
          f"{DROP_TARGET:.0%}: {'OK' if drop <= DROP_TARGET else 'MISSED'})")
    print(f"  trainer CPU share {mean(off_windows, 'share'):.0%} -> {mean(on_windows, 'share'):.0%}; records per "
          f"trainer CPU-second {mean(off_windows, 'per_cpu_s'):.0f} -> {mean(on_windows, 'per_cpu_s'):.0f} "
          f"(ratio {mean(on_windows, 'per_cpu_s') / mean(off_windows, 'per_cpu_s'):.3f}); other processes on "
          f"{'CPU 0' if pin else 'the machine'}: {mean(off_windows, 'others'):.0%} -> {mean(on_windows, 'others'):.0%} "
          "of a CPU")
    if lags:
        print(f"  freshness over {len(lags)} commits (from each commit's manifest time): median {np.median(lags) * 1e3:.1f} ms, max "
              f"{max(lags) * 1e3:.1f} ms (target <= {FRESH_TARGET_S:.0f} s: "
              f"{'OK' if max(lags) <= FRESH_TARGET_S else 'MISSED'})"
              + (f"; trainer commit median {np.median(commit_s) * 1e3:.1f} ms" if args.trainer == "loop" else ""))
    s50, s99, n = inproc["snapshot"]
    l50, l99, _ = inproc["learner"]
    print(f"  in-process Snapshot.predict (1 record, trainer running): p50 {s50:.3f} ms p99 {s99:.3f} ms "
          f"({n} calls); reference restored Learner.predict_proba_many p50 {l50:.3f} ms p99 {l99:.3f} ms; "
          f"ratio p50 {s50 / l50:.2f}")
    if inproc["advance_ms"]:
        med, worst, n = inproc["advance_ms"]
        print(f"  first Snapshot.predict after a new checkpoint (advance + row reads + query): median {med:.2f} ms, "
              f"max {worst:.2f} ms over {n} checkpoints")
    print(f"  checkpoint.read_full of this state (full reload, for comparison): {inproc['restore_seconds']:.2f} s")


def main() -> None:
    parser = parser_for(__doc__)
    parser.add_argument("--role", choices=("orchestrate", "trainer", "load"), default="orchestrate",
                        help="orchestrate: the benchmark; trainer and load: the processes it starts "
                        "(default %(default)s)")
    parser.add_argument("--trainer", choices=("worker", "loop"), default="worker",
                        help="worker: `streamlearn worker` from the embedded broker; loop: a Learner loop "
                        "without Kafka (default %(default)s)")
    parser.add_argument("--state", help="--role trainer: the state directory it commits into")
    parser.add_argument("--port", type=between(1, 65535), help="--role load: the service's port")
    parser.add_argument("--seconds", type=positive_float, default=5.0,
                        help="--role load: seconds of load (default %(default)s)")
    parser.add_argument("--clients", type=positive_int, default=16,
                        help="concurrent closed-loop clients, one request in flight each (default %(default)s)")
    parser.add_argument("--windows", type=positive_int, default=3,
                        help="windows of each kind, load off and load on, alternating (default %(default)s)")
    parser.add_argument("--window-seconds", type=positive_float, default=6.0,
                        help="seconds per window (default %(default)s)")
    parser.add_argument("--checkpoint-every", type=positive_int, default=2000,
                        help="the trainer's records per checkpoint (default %(default)s)")
    parser.add_argument("--no-pin", action="store_true", help="let the OS place the processes (default: the "
                        "trainer on CPU 0, the server and the load generator on CPU 1)")
    parser.add_argument("--worst-case-reload", action="store_true",
                        help="also time a full reload of every row, once every row is stored")
    args = parser.parse_args()
    needs = {"trainer": ("state", "--state"), "load": ("port", "--port")}.get(args.role)
    if needs and getattr(args, needs[0]) is None:
        parser.error(f"--role {args.role} needs {needs[1]}")
    {"orchestrate": orchestrate, "trainer": trainer, "load": load}[args.role](args)


if __name__ == "__main__":
    sys.exit(run_main(main))
