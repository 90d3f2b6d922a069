"""Replay every real dataset in the datasets folder: the model against the baselines, and speed.

For each dataset, with the configuration recommended for its stream shape
(the task of the file, ``streamlearn.datasets.task_of``, which brings the task's defaults, ``streamlearn.tasks.REGISTRY``; docs/choosing-a-configuration.md):
one prequential replay from scratch with every baseline of the task (river-nb,
river-logreg, vw when installed and popularity for classification; popularity and Markov
for next-item), the model's learner saved with --save; then one frozen replay of that
snapshot on the same records; then the model alone again in both modes, alternating
(--passes), each mode's throughput being its best pass. The frozen/prequential
throughput ratio is the check of "frozen replay runs at >= 2x prequential throughput"
(frozen only predicts: no backward, no optimizer step). The table replaces the part of docs/benchmarks.md between
``<!-- bench/streams.py:begin -->`` and ``<!-- bench/streams.py:end -->`` (--out another
file with those markers; --dry-run only prints it).

    python bench/streams.py                          # every dataset, all of MovieLens
    python bench/streams.py --movielens-limit 20000  # MovieLens: its first 20,000 events
    python bench/streams.py --only sms-spam --dry-run

The datasets folder is ``--data`` (default ../shared/data beside the repository). A dataset
missing from it is replayed as a synthetic stand-in of its shape and size (bench/data.py),
named SYNTHETIC in the output; a table with a synthetic row is printed, never written into
docs/benchmarks.md.
"""
from __future__ import annotations

import csv
import datetime
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import torch

from streamlearn.config import Config
from streamlearn.datasets import task_of
from streamlearn.replay import FileSource, ReplayOptions, replay
from streamlearn.replay.baselines import parse_baselines

from data import ROOT, SIZES, add_data_option, data_dir, path, synthetic_events, synthetic_text, write_between_markers
from options import at_least, names, nonneg_int, parser_for, positive_int, run_main

DATASETS = [("sms-spam", "sms"), ("ag-news-5000", "ag-news-5000"), ("ag-news-581", "ag-news-581"),
            ("movielens-100k", "movielens")]  # table name, bench/data.py name
BASELINES = ("river-nb", "river-logreg", "vw", "popularity", "markov")
BEGIN, END = "<!-- bench/streams.py:begin -->", "<!-- bench/streams.py:end -->"
TARGET = 2.0  # frozen / prequential records/s


def run(name: str, path: Path, limit: int | None, window: int, passes: int) -> dict:
    """The prequential replay with the baselines (saving the learner) and the frozen
    replay of its snapshot, then ``passes - 1`` more of each, alternating, model only:
    each mode's throughput is its best pass (a shared machine's load comes and goes; the
    alternation exposes both modes to it alike). Every prequential pass must give the
    same metrics (replay is deterministic)."""
    overrides = (f"learner.task={task_of(path)}",)  # the task brings its defaults
    cfg = Config().override(*overrides)
    task = cfg.learner.task
    options = ReplayOptions(window=window, baselines=tuple(parse_baselines("all", task)), limit=limit)
    frozen_options = ReplayOptions(mode="frozen", window=window, limit=limit)
    with tempfile.TemporaryDirectory() as tmp:
        saved = Path(tmp) / "state"
        started = time.perf_counter()
        pre = replay(FileSource(path), options, config=cfg, save=saved)
        frozen = replay(FileSource(path), frozen_options, state=saved)
        rates = {"pre": [pre["records_per_s"]], "frozen": [frozen["records_per_s"]]}
        for _ in range(passes - 1):
            again = replay(FileSource(path), ReplayOptions(window=window, limit=limit), config=cfg)
            if again["metrics"] != pre["metrics"]:
                raise SystemExit(f"{name}: two prequential passes disagree: {pre['metrics']} vs {again['metrics']}")
            rates["pre"].append(again["records_per_s"])
            rates["frozen"].append(replay(FileSource(path), frozen_options, state=saved)["records_per_s"])
        wall = time.perf_counter() - started
    return {"name": name, "task": task, "overrides": overrides, "pre": pre, "frozen": frozen, "wall": wall,
            "passes": passes,
            "rates": rates, "pre_rate": max(rates["pre"]), "frozen_rate": max(rates["frozen"])}


def stand_in(key: str, folder: Path) -> Path:
    """A synthetic file of dataset ``key``'s shape and size in ``folder``, in a format whose
    recommended configuration is the dataset's: a CSV of text and label, or MovieLens
    ``u.data`` lines (next-item)."""
    if key != "movielens":
        file = folder / f"{key}.csv"
        with file.open("w", newline="", encoding="utf-8") as f:
            writer = csv.writer(f)
            writer.writerow(["text", "label"])
            writer.writerows([r["text"], r["label"]] for r in synthetic_text(SIZES[key], 2 if key == "sms" else 4))
        return file
    lines = [f"{e['key']}\t{e['item']}\t4\t{e['ts'] // 1000}\n" for e in synthetic_events(SIZES[key])]
    file = folder / "u.data"
    file.write_text("".join(lines))
    return file


def table(rows: list[dict]) -> str:
    lines = ["| dataset | records | metric | model | " + " | ".join(BASELINES)
             + " | model rec/s (prequential) | frozen rec/s | frozen / prequential | frozen metric |",
             "|---|---:|---|---:|" + "---:|" * len(BASELINES) + "---:|---:|---:|---:|"]
    for r in rows:
        pre, frozen = r["pre"], r["frozen"]
        ratio = r["frozen_rate"] / r["pre_rate"]
        for metric in pre["metrics"]:
            if metric == "log_loss":
                continue
            cells = [_cell(pre["baselines"].get(b), metric) for b in BASELINES]
            lines.append(f"| {r['name']}{' (SYNTHETIC)' if r['synthetic'] else ''} | {pre['records']:,} | {metric} | "
                         f"**{pre['metrics'][metric]:.4f}** | "
                         + " | ".join(cells)
                         + f" | {r['pre_rate']:,.0f} | {r['frozen_rate']:,.0f} | {ratio:.1f}x"
                         + f" | {frozen['metrics'][metric]:.4f} |")
    return "\n".join(lines)


def _cell(row: dict | None, metric: str) -> str:
    if row is None or "skipped" in row:
        return "-"
    return f"{row[metric]:.4f} ({row['records_per_s']:,.0f}/s)"


def section(rows: list[dict], command: str) -> str:
    """The markdown that goes between the markers: how it was made, the table, the check."""
    configs = {}
    for r in rows:
        configs.setdefault(" ".join(f"`{o}`" for o in r["overrides"]) or "the defaults", []).append(r["name"])
    ratios = {r["name"]: r["frozen_rate"] / r["pre_rate"] for r in rows}
    missed = [n for n, x in ratios.items() if x < TARGET]
    verdict = (f"Frozen replay >= {TARGET:.0f}x prequential: met on every dataset "
               f"({min(ratios.values()):.1f}x to {max(ratios.values()):.1f}x)." if not missed else
               f"Frozen replay >= {TARGET:.0f}x prequential: **missed** on {', '.join(missed)}.")
    intro = (
        f"Produced by `{command}` on {datetime.date.today()} (torch {torch.__version__}, CPU, a shared 2-core "
        "machine: compare "
        "figures within this table only). Metrics are prequential over the whole stream (every record "
        "predicted before it is learned, the k best items minus those the user already had for "
        "next-item); baselines learn on the same records in the same run; rec/s counts each "
        "contestant's own predict+learn time. Frozen: the snapshot saved after the prequential pass, "
        "replayed on the same records without learning; the model's two rec/s are each the best of "
        f"{rows[0]['passes']} passes per mode, run alternately (prequential, frozen, prequential, ...), "
        "baselines' from the first pass. Configurations "
        "(the task of each file and its defaults, `streamlearn.tasks.REGISTRY`, see docs/choosing-a-configuration.md): "
        + "; ".join(f"{', '.join(names)}: {cfg}" for cfg, names in configs.items()) + ". The frozen "
        "metric scores the end-of-stream snapshot on records it has learned: a check that frozen replay "
        "works, not an estimate of quality.")
    wrapped = textwrap.fill(intro, width=100, break_long_words=False, break_on_hyphens=False)
    return "\n".join([wrapped, "", table(rows), "", verdict])


def main() -> int:
    parser = parser_for(__doc__)
    add_data_option(parser)
    parser.add_argument("--movielens-limit", type=nonneg_int, default=0,
                        help="events of MovieLens (0: all; default %(default)s)")
    parser.add_argument("--window", type=at_least(10), default=1000,
                        help="replay's rolling metrics' window, in evaluated events (default %(default)s)")
    parser.add_argument("--threads", type=positive_int, default=1,
                        help="torch threads (default 1: on a shared 2-core machine, 2 threads spin against "
                        "other processes and run many times slower)")
    parser.add_argument("--passes", type=positive_int, default=2,
                        help="passes per mode for the model's throughput (the best counts; 1: no repeat; "
                        "default %(default)s)")
    parser.add_argument("--only", type=names(name for name, _ in DATASETS), metavar="NAMES",
                        help=f"comma-separated dataset names, of {', '.join(name for name, _ in DATASETS)} "
                        "(default: all)")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "benchmarks.md",
                        help="markdown file whose marked section receives the table (default docs/benchmarks.md)")
    parser.add_argument("--dry-run", action="store_true", help="print the table, write nothing")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    data = data_dir(args.data)
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        for name, key in DATASETS:
            if args.only and name not in args.only:
                continue
            file = path(key, data)
            if file is None:
                print(f"{name}: {data} has no {key}; replaying a SYNTHETIC stand-in of its shape", file=sys.stderr)
            limit = (args.movielens_limit or None) if name.startswith("movielens") else None
            r = run(name, file or stand_in(key, Path(scratch)), limit, args.window, args.passes)
            r["synthetic"] = file is None
            rows.append(r)
            print(f"{name}: {r['pre']['records']} records, {r['wall']:.0f} s; model {r['pre']['metrics']}; "
                  f"prequential rec/s {r['rates']['pre']}, frozen rec/s {r['rates']['frozen']}",
                  file=sys.stderr, flush=True)
    if not rows:
        print("no dataset replayed", file=sys.stderr)
        return 1
    command = " ".join(["python bench/streams.py", *sys.argv[1:]])
    text = section(rows, command)
    if any(r["synthetic"] for r in rows):
        print(f"not written to {args.out}: synthetic rows are no benchmark result", file=sys.stderr)
    elif not args.dry_run:
        write_between_markers(args.out, BEGIN, END, text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
