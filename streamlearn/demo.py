"""``make run``: the main job end to end on the embedded default.

1. start the embedded Kafka-compatible broker (Tansu, memory storage) on a free port;
2. produce the bundled SMS Spam Collection (5,574 labelled messages) to a topic;
3. run a consumer worker over it, checkpointing to ``runs/demo/state``;
4. answer a few example queries from the snapshot the worker left;
5. stop everything.

``python -m streamlearn.demo [--state DIR] [--partitions N] [--set key=value ...]``
"""
from __future__ import annotations

import argparse
import logging
import shutil
import sys
from pathlib import Path

from tqdm import tqdm

from .broker import EmbeddedBroker, create_topic, produce_rows
from .config import load_config
from .consumers import RunOptions, Worker
from .datasets import DatasetReader, bundled_path
from .exceptions import StreamlearnError
from .snapshot import Snapshot

TOPIC = "sms"
EXAMPLES = (
    "WINNER!! You have been selected to receive a 900 prize reward. Call 09061701461 to claim now",
    "Are we still on for lunch tomorrow? I'll be at the usual place around 1",
    "URGENT! Your mobile number has won 2000 cash. Text CLAIM to 81010",
    "Sorry, I'll call you later, I'm in a meeting",
)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m streamlearn.demo", description=__doc__.splitlines()[0])
    parser.add_argument("--state", default="runs/demo/state", help="state directory (replaced)")
    parser.add_argument("--partitions", type=int, default=3)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="dotted config override, repeatable")
    return parser.parse_args(argv)


def produce(bootstrap: str, partitions: int) -> int:
    path = bundled_path("SMSSpamCollection")
    create_topic(bootstrap, TOPIC, partitions)
    reader = DatasetReader(path)
    with tqdm(total=reader.estimate_rows(), unit="rec", desc=f"produce {path.name}") as bar:
        summary = produce_rows(bootstrap, TOPIC, reader, progress=bar)
    return summary.records


def train(bootstrap: str, state: Path, records: int, overrides: list[str]) -> None:
    # eval_every=1: every batch is predicted before it is learned, for the final accuracy
    cfg = load_config(overrides=[f"worker.bootstrap={bootstrap}", "worker.group=demo",
                                 "worker.eval_every=1", *overrides])
    options = RunOptions(TOPIC, str(state), max_records=records, until_idle_s=30.0)
    print(f"\n== worker: training on {records} records, state in {state}", flush=True)
    summary = Worker(cfg, options).run()
    print(f"   {summary}", flush=True)


def query(state: Path) -> None:
    snapshot = Snapshot.open(str(state))
    metrics = snapshot.manifest().metrics or {}
    evaluated, correct = metrics.get("prequential_evaluated"), metrics.get("prequential_correct")
    if evaluated:
        print(f"   prequential accuracy, cumulative: {correct / evaluated:.4f} over all {evaluated:,} messages "
              "(each predicted before it was learned, in the order the worker consumed them)", flush=True)
    print(f"\n== queries on snapshot step {snapshot.step}", flush=True)
    probs = snapshot.predict_proba([{"text": text} for text in EXAMPLES])
    for text, dist in zip(EXAMPLES, probs.values):
        label = max(dist, key=dist.get)
        print(f"   {label:>4} p={dist[label]:.3f}  {text}", flush=True)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("kafka").setLevel(logging.CRITICAL)
    state = Path(args.state)
    shutil.rmtree(state, ignore_errors=True)  # its offsets belong to a broker that is gone
    try:
        load_config(overrides=args.set)  # a bad value stops the demo here, before the broker starts
        with EmbeddedBroker() as broker:
            print(f"== embedded broker at {broker.bootstrap}", flush=True)
            records = produce(broker.bootstrap, args.partitions)
            train(broker.bootstrap, state, records, args.set)
        query(state)
    except StreamlearnError as exc:
        print(f"streamlearn demo: error: {exc}", file=sys.stderr)
        return 2
    print("\n== done: broker stopped; inspect the state with "
          f"`.venv/bin/streamlearn inspect --state {state}`, or see its dashboard with "
          f"`.venv/bin/streamlearn serve --state {state}` and http://127.0.0.1:8000/", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
