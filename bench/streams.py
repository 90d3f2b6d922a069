"""Replay every real dataset in ../shared/data: the model against the baselines, and speed.

For each dataset: one prequential replay from scratch with every baseline of the task
(the model's learner saved with --save), then one frozen replay of that snapshot on the
same records; the frozen/prequential throughput ratio is the check of "frozen replay runs
at >= 2x prequential throughput" (frozen only predicts: no backward, no optimizer step).
Writes the markdown table to docs/streams-table.md (or --out) and prints it.

    python bench/streams.py                 # MovieLens: its first 20,000 events
    python bench/streams.py --movielens-limit 0   # all 100,000 (slow on 2 cores)
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch

from streamlearn.config import Config
from streamlearn.replay import FileSource, ReplayOptions, replay
from streamlearn.replay.baselines import parse_baselines

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data"
CLASSIFY = ["model.layers=1", "learner.batch_size=32"]
NEXT_ITEM = ["learner.task=next-item", "hashing.tokenizer=ids", "model.layers=1", "model.out_B=4096",
             "learner.batch_size=64", "learner.history=10"]
DATASETS = [  # name, file under DATA, config overrides
    ("sms-spam", "sms-spam-collection/SMSSpamCollection", CLASSIFY),
    ("ag-news-5000", "ag-news-train-samples/train_random5000_text_label.csv", CLASSIFY),
    ("ag-news-581", "ag-news-train-samples/train_first581.csv", CLASSIFY),
    ("movielens-100k", "movielens-100k/u.data", NEXT_ITEM),
]


def run(name: str, path: Path, overrides: list[str], limit: int | None, window: int) -> dict:
    cfg = Config().override(*overrides)
    task = cfg.learner.task
    options = ReplayOptions(window=window, baselines=tuple(parse_baselines("all", task)), limit=limit)
    with tempfile.TemporaryDirectory() as tmp:
        saved = Path(tmp) / "state"
        started = time.perf_counter()
        pre = replay(FileSource(path), options, config=cfg, save=saved)
        frozen = replay(FileSource(path), ReplayOptions(mode="frozen", window=window, limit=limit), state=saved)
        wall = time.perf_counter() - started
    return {"name": name, "task": task, "pre": pre, "frozen": frozen, "wall": wall}


def table(rows: list[dict]) -> str:
    lines = ["| dataset | records | metric | model | river-nb | river-logreg | vw | popularity | markov "
             "| model rec/s (prequential) | frozen rec/s | frozen / prequential | frozen metric |",
             "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        pre, frozen = r["pre"], r["frozen"]
        for metric in pre["metrics"]:
            if metric == "log_loss":
                continue
            cells = [_cell(pre["baselines"].get(b), metric) for b in ("river-nb", "river-logreg", "vw", "popularity", "markov")]
            ratio = frozen["records_per_s"] / pre["records_per_s"]
            lines.append(f"| {r['name']} | {pre['records']:,} | {metric} | **{pre['metrics'][metric]:.4f}** | "
                         + " | ".join(cells)
                         + f" | {pre['records_per_s']:,.0f} | {frozen['records_per_s']:,.0f} | {ratio:.1f}x"
                         + f" | {frozen['metrics'][metric]:.4f} |")
    return "\n".join(lines)


def _cell(row: dict | None, metric: str) -> str:
    if row is None or "skipped" in row:
        return "-"
    return f"{row[metric]:.4f} ({row['records_per_s']:,.0f}/s)"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DATA)
    parser.add_argument("--movielens-limit", type=int, default=20_000, help="events of MovieLens (0: all)")
    parser.add_argument("--window", type=int, default=1000)
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads (default 1: on a shared 2-core machine, 2 threads spin against "
                        "other processes and run many times slower)")
    parser.add_argument("--only", help="comma-separated dataset names")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "streams-table.md")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if not args.data.is_dir():
        print(f"no data directory {args.data}", file=sys.stderr)
        return 1
    rows = []
    for name, rel, overrides in DATASETS:
        if args.only and name not in args.only.split(","):
            continue
        path = args.data / rel
        if not path.is_file():
            print(f"skip {name}: {path} missing", file=sys.stderr)
            continue
        limit = (args.movielens_limit or None) if name.startswith("movielens") else None
        r = run(name, path, overrides, limit, args.window)
        rows.append(r)
        print(f"{name}: {r['pre']['records']} records, {r['wall']:.0f} s; model {r['pre']['metrics']}; "
              f"prequential {r['pre']['records_per_s']:,.0f} rec/s, frozen {r['frozen']['records_per_s']:,.0f} rec/s",
              file=sys.stderr, flush=True)
    text = (f"Produced by `python bench/streams.py --movielens-limit {args.movielens_limit} --window {args.window} "
            f"--threads {args.threads}` (torch {torch.__version__}, CPU). Metrics are prequential over the whole "
            "stream (every record predicted before it is learned); baselines learn on the same records; "
            "rec/s counts each contestant's own predict+learn time. Frozen: the snapshot saved after the "
            "prequential pass, replayed on the same records without learning.\n\n" + table(rows) + "\n")
    args.out.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
