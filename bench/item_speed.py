"""next-item ``learn_many`` speed of several configurations, side by side in one run.

    python bench/item_speed.py [--limit 40000] [--rounds 2] [--sets "" "learner.batch_size=256" ...]
                               [--data DIR]

Each set (space-separated config overrides on top of next-item's defaults, with
``model.out_B=4096`` so every set has the same output size; "" is the defaults) learns
the first ``--limit`` events of MovieLens 100K in time order (bench/data.py; a SYNTHETIC
stand-in of its shape, said so, when the file is missing) with ``learn_many`` in batches of
its own ``learner.batch_size``, one torch thread; the sets take turns, ``--rounds`` times
(a shared machine's load comes and goes; every set meets it alike), after one untimed
warm-up on 2,000 events each. Prints records/s per
round (wall clock and per CPU-second) and each set's best round as a ratio to the first
set's.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from streamlearn.config import load_config
from streamlearn.learner import Learner

from data import add_data_option, data_dir, events_stream
from options import parser_for, positive_int, run_main


def rate(overrides: list[str], records: list[dict]) -> tuple[float, float]:
    learner = Learner(load_config(overrides=["learner.task=next-item", "model.out_B=4096", *overrides], use_env=False))
    size = learner.cfg.learner.batch_size
    wall, cpu = time.perf_counter(), time.thread_time()
    for i in range(0, len(records), size):
        learner.learn_many(records[i:i + size])
    return len(records) / (time.perf_counter() - wall), len(records) / (time.thread_time() - cpu)


def main() -> int:
    parser = parser_for(__doc__)
    add_data_option(parser)
    parser.add_argument("--limit", type=positive_int, default=40_000,
                        help="the first N events of MovieLens, learned by every set (default %(default)s)")
    parser.add_argument("--rounds", type=positive_int, default=2,
                        help="timed passes of every set, taking turns; the best counts (default %(default)s)")
    # the defaults; with the 2 output hashes they had before 2026-11-26's third session; and
    # with the input and batch of that day's morning too
    parser.add_argument("--sets", nargs="+", default=["", "model.out_m=2",
                                                      "model.out_m=2 learner.batch_size=256 learner.history=10 "
                                                      "learner.recency=1 learner.key_token=false learner.place_weights=false"],
                        metavar="OVERRIDES", help="the configurations, each a quoted string of space-separated "
                        "KEY=VALUE overrides on next-item's defaults (\"\": the defaults); ratios are to the first "
                        "(default: the defaults, then two earlier configurations)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    stream = events_stream(data_dir(args.data), args.limit)
    records = [{"key": r["key"], "item": r["item"]} for r in stream.records]
    print(f"{stream.name}: {len(records):,} events from {stream.source}")
    for overrides in args.sets:  # untimed: the process's first steps pay one-off costs
        rate(overrides.split(), records[:2_000])
    best: dict[str, float] = {}
    for round_ in range(args.rounds):
        for overrides in args.sets:
            wall, cpu = rate(overrides.split(), records)
            best[overrides] = max(best.get(overrides, 0.0), wall)
            print(f"round {round_}  {overrides or 'defaults':<100s} {wall:8,.0f} records/s ({cpu:,.0f} per CPU-second)",
                  flush=True)
    first = best[args.sets[0]]
    for overrides in args.sets:
        print(f"best  {overrides or 'defaults':<100s} {best[overrides]:8,.0f} records/s  {best[overrides] / first:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
