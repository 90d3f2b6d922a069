"""End-to-end worker throughput from the real (embedded) broker, against the Learner's
in-memory ``learn_many`` on the same records with the same config, in the same run.

    python bench/worker.py [--records 15000] [--partitions 3] [--rounds 3] [--data DIR] [--set KEY=VALUE ...]

Records: the SMS Spam Collection (from the datasets folder, ``--data``, default
../shared/data; else the copy bundled with streamlearn, the same file), repeated up to
--records. Each round measures, on the same
records and config:

1. reference: ``learn_many`` over the records in batches of ``learner.batch_size``
   (prepare + one optimizer step per batch, serially, in memory), with the torch thread
   count the worker's training loop uses;
2. worker: a :class:`~streamlearn.consumers.Worker` consuming the topic into a fresh LMDB
   state at the default checkpoint interval, with prequential evaluation (its default
   share of batches) and the dead-letter producer connected. Its rate runs from the first
   learned batch to the last record learned (the group join before it is a start-up cost);
3. the same worker without periodic checkpoints (only the final one).

Printed per round and as medians over rounds:

- wall-clock records/s of 1-3 and the ratio worker / learn_many (target >= 0.8);
- CPU seconds per 1,000 records, per thread (from the threads' CPU clocks, which other
  processes on a shared machine disturb far less than wall time): the reference, the
  worker's training loop, its fetch thread, and kafka-python's IO threads. reference CPU /
  training-loop CPU is the ratio the worker reaches when the fetch thread has a core of
  its own;
- the share of the worker's wall time spent in checkpoint commits (target <= 5%); since
  the training loop learns the queued batches before a commit (useful work) and the fetch
  thread then refills the queue, commits + all waiting for a batch bound the cost from
  above. The slowdown of 2 against 3 is printed too, but separate runs differ by more than
  5% whenever other processes compete for the CPUs;
- the evidence that ingest overlaps training: the share of wall time the training loop
  waited for a batch (near 0: never starved) next to the fetch thread's CPU.
"""
from __future__ import annotations

import itertools
import statistics
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import torch

from streamlearn.broker import EmbeddedBroker, create_topic, produce_rows
from streamlearn.config import Config
from streamlearn.consumers import RunOptions, Worker
from streamlearn.consumers import worker as worker_module
from streamlearn.device import intra_op_threads
from streamlearn.datasets import DatasetReader, bundled_path
from streamlearn.learner import Learner

from data import add_data_option, data_dir, path
from options import add_set_option, parser_for, positive_int, run_main


def load_records(n: int, data: Path) -> tuple[list[dict], Path]:
    file = path("sms", data) or bundled_path()
    base = [row.record for row in DatasetReader(file)]
    return list(itertools.islice(itertools.cycle(base), n)), file


def thread_cpu(thread: threading.Thread) -> float:
    """CPU seconds a running thread has used so far."""
    return time.clock_gettime(time.pthread_getcpuclockid(thread.ident))


def reference(cfg: Config, records: list[dict]) -> dict:
    """In-memory learn_many in batches of learner.batch_size: records/s and CPU seconds."""
    torch.set_num_threads(intra_op_threads(cfg))
    learner, size = Learner(cfg), cfg.learner.batch_size
    cpu, started = time.thread_time(), time.perf_counter()
    for i in range(0, len(records), size):
        learner.learn_many(records[i:i + size])
    wall = time.perf_counter() - started
    return {"rate": len(records) / wall, "cpu": time.thread_time() - cpu}


class Timed:
    """Wraps a callable and sums the wall seconds spent in it (one caller thread)."""

    def __init__(self, fn):
        self.fn, self.seconds = fn, 0.0

    def __call__(self, *args, **kwargs):
        t = time.perf_counter()
        try:
            return self.fn(*args, **kwargs)
        finally:
            self.seconds += time.perf_counter() - t


def wait_records(worker: Worker, n: int) -> None:
    while worker.metrics.records < n:
        time.sleep(0.001)


def run_worker(cfg: Config, bootstrap: str, topic: str, n: int, state: str) -> dict:
    cfg = cfg.override(f"worker.bootstrap={bootstrap}", f"worker.group=bench-{uuid.uuid4().hex[:8]}")
    worker = Worker(cfg, RunOptions(topic, state))
    wait, evaluate = Timed(worker.handoff.get), Timed(worker_module.prequential_step)
    worker.handoff.get, worker_module.prequential_step = wait, evaluate
    loop = threading.Thread(target=worker.run)
    loop.start()
    wait_records(worker, 1)
    first, started = worker.metrics.records, time.perf_counter()
    cpu = (thread_cpu(loop), thread_cpu(worker.fetcher), time.process_time(), time.thread_time())
    waited, evaluated = wait.seconds, evaluate.seconds
    wait_records(worker, n)
    wall = time.perf_counter() - started
    used = [now - then for now, then in zip(
        (thread_cpu(loop), thread_cpu(worker.fetcher), time.process_time(), time.thread_time()), cpu)]
    commit_s = next(s.value for s in worker.metrics.m_ckpt.collect()[0].samples if s.name.endswith("_sum"))
    worker.stop()
    loop.join(60)
    worker_module.prequential_step = evaluate.fn
    scale = n / (n - first)  # CPU and seconds over the measured records, scaled to all n
    return {"rate": (n - first) / wall, "wall": wall, "commit_s": commit_s,
            "loop_cpu": used[0] * scale, "fetch_cpu": used[1] * scale,
            "io_cpu": max(0.0, used[2] - used[0] - used[1] - used[3]) * scale,
            "starved": (wait.seconds - waited) / wall, "eval": (evaluate.seconds - evaluated) / wall}


def round_row(ref: dict, default: dict, bare: dict, n: int) -> dict:
    k = 1000 / n
    return {"ref": ref["rate"], "worker": default["rate"], "no_ckpt": bare["rate"],
            "ratio": default["rate"] / ref["rate"], "cpu_ratio": ref["cpu"] / default["loop_cpu"],
            "ref_cpu": ref["cpu"] * k, "loop_cpu": default["loop_cpu"] * k, "fetch_cpu": default["fetch_cpu"] * k,
            "io_cpu": default["io_cpu"] * k, "ckpt_share": default["commit_s"] / default["wall"],
            "ckpt_slowdown": 1 - default["rate"] / bare["rate"], "starved": default["starved"],
            "eval": default["eval"]}


def describe(row: dict) -> str:
    return (f"learn_many {row['ref']:,.0f} rec/s | worker {row['worker']:,.0f} rec/s, ratio {row['ratio']:.2f} "
            f"| CPU s per 1k records: learn_many {row['ref_cpu']:.2f}, worker training loop {row['loop_cpu']:.2f} "
            f"(cpu ratio {row['cpu_ratio']:.2f}), fetch thread {row['fetch_cpu']:.2f}, kafka IO {row['io_cpu']:.2f} "
            f"| checkpoint commits {row['ckpt_share']:.1%} of wall; w/o periodic checkpoints "
            f"{row['no_ckpt']:,.0f} rec/s (slowdown {row['ckpt_slowdown']:+.1%}) | training loop starved "
            f"{row['starved']:.1%}, evaluated steps (their step and scores) {row['eval']:.1%} of wall")


def main() -> None:
    parser = parser_for(__doc__)
    parser.add_argument("--records", type=positive_int, default=15_000,
                        help="SMS records, the file repeated up to N, learned in every run (default %(default)s)")
    parser.add_argument("--partitions", type=positive_int, default=3, help="partitions of the topic (default %(default)s)")
    parser.add_argument("--rounds", type=positive_int, default=3,
                        help="rounds of the three runs, the medians kept (default %(default)s)")
    add_set_option(parser)
    add_data_option(parser)
    args = parser.parse_args()
    cfg = Config().override(*args.set)
    records, source = load_records(args.records, data_dir(args.data))
    print(f"{len(records)} records from {source}, batch {cfg.learner.batch_size}, torch threads {intra_op_threads(cfg)}, "
          f"checkpoint every {cfg.worker.checkpoint_every} records / {cfg.worker.checkpoint_seconds:g} s, "
          f"prequential every {cfg.worker.eval_every} batches, overrides {args.set}")
    no_periodic = cfg.override("worker.checkpoint_every=1000000000", "worker.checkpoint_seconds=1e9")
    rows = []
    with EmbeddedBroker() as broker, tempfile.TemporaryDirectory() as tmp:
        create_topic(broker.bootstrap, "bench", args.partitions)
        print(produce_rows(broker.bootstrap, "bench", [(None, r, None) for r in records]))
        for r in range(args.rounds):
            ref = reference(cfg, records)
            default = run_worker(cfg, broker.bootstrap, "bench", len(records), f"{tmp}/d{r}")
            bare = run_worker(no_periodic, broker.bootstrap, "bench", len(records), f"{tmp}/n{r}")
            rows.append(round_row(ref, default, bare, len(records)))
            print(f"round {r}: {describe(rows[-1])}", flush=True)
    median = {key: statistics.median(row[key] for row in rows) for key in rows[0]}
    print(f"median: {describe(median)}")
    print(f"targets: ratio {median['ratio']:.2f} >= 0.8 (cpu ratio {median['cpu_ratio']:.2f}); checkpointing "
          f"{median['ckpt_share']:.1%} of wall in commits, at most {median['ckpt_share'] + median['starved']:.1%} "
          f"counting every wait for a batch as a refill after a checkpoint (<= 5%)")


if __name__ == "__main__":
    sys.exit(run_main(main))
