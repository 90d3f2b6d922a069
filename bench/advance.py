"""The first query after a checkpoint: a snapshot that reads only the rows the commits since
wrote (the store's change log) against one that reads its whole tables again, in one run.

    python bench/advance.py [--tasks next-item,next-token,classify] [--commits 8]
                            [--warm 3000] [--between 160]

Per task, at its defaults: a Learner learns ``--warm`` records and commits into a new LMDB
state; then ``--commits`` times it learns ``--between`` records (next-item: events), commits,
and each snapshot answers one query (``topk`` of 10; classify: ``predict``), timed. Two
snapshots take turns over the same commits, in two rounds: one as served (the change log),
one told the log does not reach back (what every advance read before the log: the tables a
head or the count part reads in full, and every lazily read row stale); each asks first
after half the commits. Printed: the median
and range of the first query after a commit for each, their ratio, and the rows one commit
wrote per table.

Records: text from the bundled SMS Spam Collection (next-token, classify: each message as
it is; the text tasks take it as a token stream); next-item events are SYNTHETIC (500 keys,
items of a Pareto popularity over 3,000 ids, seeded), as no bundled file holds events.
"""
from __future__ import annotations

import random
import statistics
import sys
import tempfile
import time

from options import names, parser_for, positive_int, run_main

TASKS = ("next-item", "next-token", "classify")


def records(task: str, n: int, rng: random.Random, texts: list[dict]) -> list[dict]:
    if task == "next-item":
        return [{"key": f"u{rng.randrange(500)}", "item": f"i{int(rng.paretovariate(1.2)) % 3000}"} for _ in range(n)]
    picked = [texts[rng.randrange(len(texts))] for _ in range(n)]
    return picked if task == "classify" else [{"text": r["text"]} for r in picked]


class WithoutLog:
    """A store whose change log never reaches back: a snapshot of it advances as every
    snapshot did before the log (everything read again, every advance)."""

    def __init__(self, store):
        self._store = store

    def changed_rows(self, since: int, until: int) -> None:
        return None

    def __getattr__(self, name: str):
        return getattr(self._store, name)


def run(task: str, warm: int, between: int, commits: int) -> dict:
    from streamlearn.checkpoint import write
    from streamlearn.config import Config
    from streamlearn.datasets import DatasetReader, bundled_path
    from streamlearn.learner import Learner
    from streamlearn.snapshot import Snapshot
    from streamlearn.state import Checkpoint, open_store

    rng = random.Random(0)
    texts = [dict(row.record) for row in DatasetReader(bundled_path())]
    learner = Learner(Config().override(f"learner.task={task}", *(["model.out_B=4096"] if task == "next-item" else [])))
    learner.learn_many(records(task, warm, rng, texts))
    folder = tempfile.mkdtemp(prefix="advance-")
    store = open_store(folder)

    def commit() -> None:
        specs, rows, blobs, kv = write(learner)
        store.declare_tables(specs)
        store.commit(Checkpoint(step=learner.steps, rows=rows, blobs=blobs, kv=kv, config=learner.cfg.to_dict()))

    commit()
    query = ([{"key": "u1"}] if task == "next-item" else [{"text": "see you later at the"}])
    ask = (lambda s: s.predict(query)) if task == "classify" else (lambda s: s.topk(query, k=10))
    served = Snapshot(open_store(folder, readonly=True), owns_store=True)
    whole = Snapshot(WithoutLog(open_store(folder, readonly=True)), owns_store=True)
    times: dict[str, list[float]] = {"change log": [], "whole tables": []}
    for snap in (served, whole):
        ask(snap)  # the first advance reads everything in both
    turns = (("change log", served), ("whole tables", whole))
    for i in range(2 * commits):
        learner.learn_many(records(task, between, rng, texts))
        commit()
        for name, snap in turns if i % 2 else turns[::-1]:  # each goes first after half the commits
            started = time.perf_counter()
            ask(snap)
            times[name].append(time.perf_counter() - started)
    n = store.manifest().commits
    wrote = {t: len(ids) for t, ids in store.changed_rows(n - 1, n).items() if not t.endswith(".sum")}
    rows = {t: spec.rows for t, spec in store.tables().items()}
    for snap in (served, whole):
        snap.close()
    store.close()
    return {"times": times, "wrote": wrote, "rows": rows, "whole": sorted(learner.task.whole_tables(learner.model))}


def main() -> None:
    parser = parser_for(__doc__)
    parser.add_argument("--tasks", type=names(TASKS), default=list(TASKS),
                        help=f"comma-separated tasks to time (default: {','.join(TASKS)})")
    parser.add_argument("--commits", type=positive_int, default=8, help="commits per round (two rounds)")
    parser.add_argument("--warm", type=positive_int, default=3000, help="records learned before the first commit")
    parser.add_argument("--between", type=positive_int, default=160, help="records learned between commits")
    args = parser.parse_args()
    import torch

    torch.set_num_threads(1)
    print(f"first query after a checkpoint of {args.between} records, {2 * args.commits} commits, after "
          f"{args.warm} records (ms: median, min-max)")
    print("| task | change log | whole tables | ratio | rows one commit wrote (of the table) |")
    print("|---|---|---|---|---|")
    for task in args.tasks:
        got = run(task, args.warm, args.between, args.commits)
        med = {name: statistics.median(t) * 1e3 for name, t in got["times"].items()}
        shown = {name: f"{med[name]:.1f} ({min(t) * 1e3:.1f}-{max(t) * 1e3:.1f})" for name, t in got["times"].items()}
        wrote = ", ".join(f"{t} {n:,}/{got['rows'][t]:,}{' (whole)' if t in got['whole'] else ''}"
                          for t, n in got["wrote"].items())
        print(f"| {task} | {shown['change log']} | {shown['whole tables']} | "
              f"{med['whole tables'] / med['change log']:.1f}x | {wrote} |", flush=True)


if __name__ == "__main__":
    sys.exit(run_main(main))
