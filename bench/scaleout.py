"""Scale-out: records/s of 1 and of 2 `streamlearn worker` processes training one model
from the same topic on the real (embedded) broker, in the same run; bytes per sync.

    python bench/scaleout.py [--records 40000] [--partitions 4] [--checkpoint-every 2000] [--set KEY=VALUE ...]

Each worker runs with one torch thread (``worker.torch_threads=1``, OMP_NUM_THREADS=1) so
two workers plus their fetch threads do not oversubscribe the cores. The rate is measured
from the state, as any user would see it: from the first committed checkpoint to the
checkpoint holding every record (group joins and the idle tail are start-up costs). With
2 workers, every checkpoint is a group sync, so the rate includes averaging.

Printed: records/s for 1 and 2 workers and their ratio (1 worker is the reference), the
CPUs this process may use, syncs and the bytes each rank handed to collectives per sync
(from the workers' logs), and sync seconds.
"""
from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from streamlearn.broker import EmbeddedBroker, create_topic, free_port, produce_rows
from streamlearn.state import NotAStoreError, open_store

MODEL = ("model.layers=1", "model.d_model=64", "model.heads=4", "model.ffn=128", "embedding.K=50000",
         "embedding.B=4096", "embedding.d=64", "model.max_labels=16", "learner.batch_size=64",
         "store.map_size_gb=1", "worker.torch_threads=1", "worker.poll_timeout_ms=100",
         "worker.session_timeout_ms=3000", "worker.heartbeat_interval_ms=500", "worker.max_poll_interval_ms=3000")
WORDS = [f"w{i}" for i in range(5000)]


def rows(n: int):
    import random
    rng = random.Random(11)
    for i in range(n):
        label = f"c{rng.randrange(8)}"
        text = " ".join(rng.choice(WORDS[:600] if label < "c4" else WORDS[400:]) for _ in range(rng.randint(8, 24)))
        yield None, {"text": text, "label": label}, None


def applied(state: Path) -> int:
    try:
        with open_store(str(state), readonly=True) as store:
            return sum(store.manifest().records_applied.values())
    except (NotAStoreError, FileNotFoundError, OSError):
        return 0
    except Exception:  # a store being created this instant
        return 0


def run(world: int, bootstrap: str, topic: str, args, workdir: Path) -> dict:
    state = workdir / f"state-{world}"
    group = f"bench-{world}-{time.time_ns()}"
    common = ["--topic", topic, "--state", str(state), "--bootstrap", bootstrap, "--group", group,
              "--checkpoint-every", str(args.checkpoint_every), "--until-idle", "3",
              *(f"--set={s}" for s in (*MODEL, *args.set))]
    if world > 1:
        common += ["--world-size", str(world), "--dist-url", f"tcp://127.0.0.1:{free_port()}"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    logs = [open(workdir / f"w{world}-r{r}.log", "w") for r in range(world)]
    procs = [subprocess.Popen([sys.executable, "-m", "streamlearn.cli", "worker", *common,
                               *(["--rank", str(r)] if world > 1 else [])],
                              stdout=logs[r], stderr=subprocess.STDOUT, env=env) for r in range(world)]
    first_at = first_n = None
    done_at = None
    try:
        while done_at is None:
            n = applied(state)
            now = time.monotonic()
            if n and first_at is None:
                first_at, first_n = now, n
            if n >= args.records:
                done_at = now
            if any(p.poll() not in (None, 0) for p in procs):
                raise SystemExit(f"a worker failed; see {workdir}")
            time.sleep(0.02)
        for p in procs:
            p.wait(60)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        for f in logs:
            f.close()
    syncs = [(int(b), float(s)) for r in range(world)
             for b, s in re.findall(r"sync \d+ \(\w+\): (\d+) bytes sent, ([\d.]+) s",
                                    (workdir / f"w{world}-r{r}.log").read_text())]
    rate = (args.records - first_n) / max(done_at - first_at, 1e-9)
    return {"rate": rate, "syncs": syncs, "measured": args.records - first_n}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=40_000)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--checkpoint-every", type=int, default=2000)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    args = parser.parse_args()
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    with EmbeddedBroker() as broker, tempfile.TemporaryDirectory() as tmp:
        results = {}
        for world in (1, 2):
            topic = f"scaleout-{world}-{time.time_ns()}"
            create_topic(broker.bootstrap, topic, args.partitions)
            produce_rows(broker.bootstrap, topic, rows(args.records))
            results[world] = run(world, broker.bootstrap, topic, args, Path(tmp))
            print(f"{world} worker(s): {results[world]['rate']:,.0f} records/s "
                  f"(over {results[world]['measured']:,} records)", flush=True)
    one, two = results[1]["rate"], results[2]["rate"]
    print(f"\nCPUs available: {cpus}; torch threads per worker: 1; records {args.records:,}, "
          f"{args.partitions} partitions, checkpoint/sync every {args.checkpoint_every} records per worker")
    print(f"records/s   1 worker {one:,.0f}   2 workers {two:,.0f}   ratio 2/1 = {two / one:.2f}")
    syncs = results[2]["syncs"]
    if syncs:
        sent = [b for b, _ in syncs]
        print(f"syncs: {len(syncs) // 2} per rank; bytes handed to collectives per rank per sync: median "
              f"{statistics.median(sent):,.0f}, max {max(sent):,}; sync seconds median "
              f"{statistics.median(s for _, s in syncs):.3f}")


if __name__ == "__main__":
    main()
