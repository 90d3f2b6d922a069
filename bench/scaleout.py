"""Scale-out: 1 worker against 2 workers in each sync mode (``worker.sync`` average and
allreduce) on the real (embedded) broker, in the same run: records/s, bytes exchanged,
and the quality of the model they train.

    python bench/scaleout.py [--records 40000] [--repeat 3] [--partitions 4] [--checkpoint-every 2000]
                             [--quality-every 500] [--data DIR] [--skip-quality] [--set KEY=VALUE ...]

Speed: a synthetic stream of ``--records`` (the bench's MODEL, batch 64), each mode
``--repeat`` times interleaved, the median kept. Each worker runs
with one torch thread (``worker.torch_threads=1``, OMP_NUM_THREADS=1) so two workers plus
their fetch threads do not oversubscribe the cores. The rate is measured from the state,
as any user would see it: from the first committed checkpoint to the checkpoint holding
every record (group joins and the idle tail are start-up costs). With 2 workers every
checkpoint is a group sync, so the rate includes averaging or the per-step all-reduce.

Quality: SMS spam and AG News (the datasets folder, ``--data``, default ../shared/data;
each replaced by a labelled synthetic text stream of its size when absent), the project's default
model config, records in file order: the first 80% are the stream, the last 20% are held
out; ``--quality-seeds`` runs per mode (``learner.seed`` 0, 1, ...), their mean printed. Reported per mode: prequential accuracy over the stream (``worker.eval_every=1``:
each batch is scored before it is learned, by the replica that learns it) and held-out
accuracy of the final state (what a snapshot reader would serve).

Bytes: what each rank handed to collectives (a ring all-reduce sends about 2 (W-1)/W of
its part), from the workers' sync log lines: per sync, per exchange (all-reduce: one per
step) and per record of the stream.
"""
from __future__ import annotations

import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from streamlearn.broker import EmbeddedBroker, create_topic, free_port, produce_rows
from streamlearn.checkpoint import read_full
from streamlearn.device import usable_cpus
from streamlearn.state import NotAStoreError, open_store

sys.path.insert(0, str(Path(__file__).resolve().parent))
from data import add_data_option, ag_news, data_dir, text_stream  # bench/data.py: the datasets folder
from options import add_set_option, at_least, parser_for, positive_int, run_main

MODEL = ("model.layers=1", "model.d_model=64", "model.heads=4", "model.ffn=128", "embedding.K=50000",
         "embedding.B=4096", "embedding.d=64", "model.max_labels=16", "learner.batch_size=64")
WORKER = ("store.map_size_gb=1", "worker.torch_threads=1", "worker.poll_timeout_ms=100",
          "worker.session_timeout_ms=3000", "worker.heartbeat_interval_ms=500", "worker.max_poll_interval_ms=3000")
QUALITY = ("worker.eval_every=1", "store.shards=2")
MODES = (("1 worker", 1, "average"), ("2 average", 2, "average"), ("2 allreduce", 2, "allreduce"))
WORDS = [f"w{i}" for i in range(5000)]
SYNC_LINE = re.compile(r"sync \d+ \(\w+\): (\d+) bytes sent, ([\d.]+) s, rows .*?, (\d+) exchanges")


def synthetic(n: int):
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


def run(name: str, world: int, sync: str, bootstrap: str, topic: str, records: int, every: int,
        settings: list[str], workdir: Path) -> dict:
    """Run ``world`` workers to the end of ``topic``; the rate, sync log figures, state."""
    tag = re.sub(r"\W", "", name) + topic[-6:]
    state = workdir / f"state-{tag}"
    common = ["--topic", topic, "--state", str(state), "--bootstrap", bootstrap, "--group", f"bench-{tag}",
              "--checkpoint-every", str(every), "--until-idle", "3", "--sync", sync,
              *(f"--set={s}" for s in settings)]
    if world > 1:
        common += ["--world-size", str(world), "--dist-url", f"tcp://127.0.0.1:{free_port()}"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    paths = [workdir / f"{tag}-r{r}.log" for r in range(world)]
    logs = [open(p, "w") for p in paths]
    procs = [subprocess.Popen([sys.executable, "-m", "streamlearn.cli", "worker", *common,
                               *(["--rank", str(r)] if world > 1 else [])],
                              stdout=logs[r], stderr=subprocess.STDOUT, env=env) for r in range(world)]
    first_at = first_n = done_at = None
    try:
        while done_at is None:
            n = applied(state)
            now = time.monotonic()
            if n and first_at is None:
                first_at, first_n = now, n
            if n >= records:
                done_at = now
            if any(p.poll() not in (None, 0) for p in procs):
                tails = "\n".join(p.read_text()[-3000:] for p in paths)
                raise SystemExit(f"a worker of {name} failed:\n{tails}")
            time.sleep(0.02)
        for p in procs:
            p.wait(60)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        for f in logs:
            f.close()
    syncs = [(int(b), float(s), int(e)) for p in paths for b, s, e in SYNC_LINE.findall(p.read_text())]
    rate = (records - first_n) / max(done_at - first_at, 1e-9)
    return {"rate": rate, "syncs": syncs, "measured": records - first_n, "state": state, "world": world}


def held_out_accuracy(state: Path, held: list[dict]) -> float:
    with open_store(str(state), readonly=True) as store:
        learner = read_full(store)
    hits = 0
    for at in range(0, len(held), 256):
        chunk = held[at:at + 256]
        hits += sum(p == r["label"] for p, r in zip(learner.predict_many(chunk), chunk))
    return hits / len(held)


def prequential_accuracy(state: Path) -> float:
    with open_store(str(state), readonly=True) as store:
        m = store.manifest().metrics
    return m["prequential_correct"] / max(m["prequential_evaluated"], 1)


def bytes_line(result: dict) -> str:
    syncs = result["syncs"]
    if not syncs:
        return "no collectives"
    sent = [b for b, _, _ in syncs]
    exchanges = sum(e for _, _, e in syncs)
    ranks = result["world"]
    per_record = sum(sent) / ranks / result["records"]
    return (f"{len(syncs) // ranks} syncs/rank; bytes/rank per sync median {statistics.median(sent):,.0f}; "
            f"exchanges/rank per sync median {statistics.median(e for _, _, e in syncs):,.0f}; "
            f"bytes per exchange {sum(sent) / max(exchanges, 1):,.0f}; bytes/rank per stream record "
            f"{per_record:,.0f}; collective s/sync median {statistics.median(s for _, s, _ in syncs):.3f}")


def speed(broker: EmbeddedBroker, args, workdir: Path) -> dict:
    """Each mode ``--repeat`` times, interleaved (the machine's load drifts); per mode the
    run with the median rate is kept, every rate is listed."""
    runs: dict[str, list[dict]] = {name: [] for name, _, _ in MODES}
    for repeat in range(args.repeat):
        for name, world, sync in MODES:
            topic = f"scaleout-{world}{sync[:2]}-{time.time_ns()}"
            create_topic(broker.bootstrap, topic, args.partitions)
            produce_rows(broker.bootstrap, topic, synthetic(args.records))
            r = run(name, world, sync, broker.bootstrap, topic, args.records, args.checkpoint_every,
                    [*MODEL, *WORKER, *args.set], workdir)
            r["records"] = args.records
            runs[name].append(r)
            print(f"speed  {name:12s} {r['rate']:8,.0f} records/s (over {r['measured']:,} records); "
                  f"{bytes_line(r)}", flush=True)
    results = {}
    for name, rs in runs.items():
        rs = sorted(rs, key=lambda r: r["rate"])
        results[name] = {**rs[len(rs) // 2], "rates": [r["rate"] for r in runs[name]]}
    return results


def quality(broker: EmbeddedBroker, args, workdir: Path) -> dict:
    datasets = {}
    for key, stream in (("sms", text_stream("sms", data_dir(args.data))), ("ag_news", ag_news(data_dir(args.data)))):
        print(f"quality: {key} from {stream.source}")
        datasets[key + (" (SYNTHETIC)" if stream.synthetic else "")] = stream.records
    out = {}
    for key, records in datasets.items():
        cut = int(len(records) * 0.8)
        stream, held = records[:cut], records[cut:]
        for seed in range(args.quality_seeds):
            for name, world, sync in MODES:
                topic = f"quality-{key}-{world}{sync[:2]}-{time.time_ns()}"
                create_topic(broker.bootstrap, topic, args.partitions)
                produce_rows(broker.bootstrap, topic, ((None, r, None) for r in stream))
                r = run(name, world, sync, broker.bootstrap, topic, len(stream), args.quality_every,
                        [*WORKER, *QUALITY, f"learner.seed={seed}", *args.set], workdir)
                r["records"] = len(stream)
                r["prequential"] = prequential_accuracy(r["state"])
                r["held_out"] = held_out_accuracy(r["state"], held)
                out.setdefault((key, name), []).append(r)
                print(f"quality {key:8s} seed {seed} {name:12s} prequential {r['prequential']:.4f}  held-out "
                      f"{r['held_out']:.4f} ({len(stream):,} streamed, {len(held):,} held out); {bytes_line(r)}",
                      flush=True)
    return out


def main() -> None:
    parser = parser_for(__doc__)
    parser.add_argument("--records", type=positive_int, default=40_000,
                        help="synthetic records of the speed runs, at least 4 x --checkpoint-every (default %(default)s)")
    parser.add_argument("--repeat", type=positive_int, default=3,
                        help="speed runs per mode, interleaved, the median kept (default %(default)s)")
    parser.add_argument("--partitions", type=at_least(2), default=4,
                        help="partitions of each topic, shared by the 2 workers (default %(default)s)")
    parser.add_argument("--checkpoint-every", type=positive_int, default=2000,
                        help="speed runs: records per sync per worker (default %(default)s)")
    parser.add_argument("--quality-every", type=positive_int, default=500,
                        help="quality runs: records per sync per worker (default %(default)s)")
    add_data_option(parser)
    parser.add_argument("--quality-seeds", type=positive_int, default=2,
                        help="quality runs per mode, learner.seed 0, 1, ... (default %(default)s)")
    parser.add_argument("--skip-quality", action="store_true", help="the speed runs only")
    add_set_option(parser, "for every worker")
    args = parser.parse_args()
    if args.records < 4 * args.checkpoint_every:  # the rate runs from the first sync to the last: 2 a worker
        parser.error(f"--records {args.records} leaves 2 workers under two syncs each at --checkpoint-every "
                     f"{args.checkpoint_every}: give at least {4 * args.checkpoint_every} records")
    torch.set_num_threads(1)
    cpus = usable_cpus()
    with EmbeddedBroker() as broker, tempfile.TemporaryDirectory() as tmp:
        fast = speed(broker, args, Path(tmp))
        good = {} if args.skip_quality else quality(broker, args, Path(tmp))
    one = fast["1 worker"]["rate"]
    print(f"\nCPUs available: {cpus}; torch threads per worker: 1; speed: {args.records:,} synthetic records, "
          f"{args.partitions} partitions, sync every {args.checkpoint_every} records per worker; "
          f"quality: sync every {args.quality_every}")
    print("records/s (median of runs: every run)   " + "   ".join(
        f"{n} {r['rate']:,.0f} ({', '.join(f'{x:,.0f}' for x in r['rates'])})" for n, r in fast.items()))
    print(f"ratios      2 average / 1 = {fast['2 average']['rate'] / one:.2f}   "
          f"2 allreduce / 1 = {fast['2 allreduce']['rate'] / one:.2f}   "
          f"allreduce / average = {fast['2 allreduce']['rate'] / fast['2 average']['rate']:.2f}")
    for key in sorted({k for k, _ in good}):
        mean = {n: {m: statistics.mean(r[m] for r in good[(key, n)]) for m in ("prequential", "held_out")}
                for n, _, _ in MODES}
        base = mean["1 worker"]
        cells = [f"{n} {q['prequential']:.4f} ({q['prequential'] - base['prequential']:+.4f}) / "
                 f"{q['held_out']:.4f} ({q['held_out'] - base['held_out']:+.4f})" for n, q in mean.items()]
        print(f"{key:8s} prequential / held-out, mean of {args.quality_seeds} seeds (vs 1 worker): " + "   ".join(cells))

if __name__ == "__main__":
    sys.exit(run_main(main))
