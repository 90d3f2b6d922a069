"""How soon a `streamlearn worker` process learns, from process start, against the embedded broker.

    python bench/startup.py [--records 2000] [--partitions 3] [--repeats 3] [--set KEY=VALUE ...]

One embedded broker and one topic of --records SMS Spam records (the copy bundled with
streamlearn), then, interleaved --repeats times after one warm-up run (page cache,
bytecode), a fresh `streamlearn worker --max-records N` process per path:

- ``manual``: the default, a lone worker assigns itself every partition (no group join);
- ``group``: ``worker.assignment=group``, the path every worker took before: it joins the
  consumer group and waits for the group's assignment.

Each process gets a fresh state directory and group, at the default config. From its
launch (wall clock, taken just before the fork) to the timestamps of its own log lines:

- ``worker ready``: "worker on ..." (interpreter, imports, config, state and model built);
- ``partitions``: "reading all N partitions" / "assigned partitions" (start-up done);
- ``first learned``: "first records learned" (the first batch's step is done);
- ``exit``: the process has exited after learning all N records (final checkpoint);
- ``cpu to exit``: the process's user + system CPU seconds (all threads), which other
  jobs on a shared machine disturb far less than the wall-clock figures.

Printed: every run, then the median per path. The process's log has millisecond
timestamps (``%(asctime)s``), so each figure is +-1 ms plus the clock reads.
"""
from __future__ import annotations

import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import datetime
from pathlib import Path

from options import add_set_option, parser_for, positive_int, run_main
from streamlearn.broker import EmbeddedBroker, create_topic, produce_rows
from streamlearn.datasets import DatasetReader, bundled_path

MARKS = {"worker ready": "worker on ", "partitions": ("reading all ", "assigned partitions "),
         "first learned": "first records learned"}
PATHS = {"manual": [], "group": ["--set", "worker.assignment=group"]}


def log_time(line: str) -> float | None:
    """Unix time of a log line stamped ``2026-11-30 12:34:56,789 INFO ...``."""
    try:
        return datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()
    except ValueError:
        return None


def one_run(bootstrap: str, topic: str, records: int, extra: list[str], workdir: Path) -> dict[str, float]:
    """Seconds from launch to each mark and to exit, for one fresh worker process."""
    state = workdir / f"state-{uuid.uuid4().hex[:8]}"
    cmd = [sys.executable, "-m", "streamlearn.cli", "worker", "--topic", topic, "--state", str(state),
           "--bootstrap", bootstrap, "--group", f"bench-{uuid.uuid4().hex[:8]}", "--max-records", str(records),
           *extra]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    launched = time.time()
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    exited = time.time() - launched
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"worker failed ({done.returncode}):\n{done.stderr[-3000:]}")
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    out = {"exit": exited, "cpu to exit": cpu}
    for line in done.stderr.splitlines():
        for name, prefixes in MARKS.items():
            message = line.split(": ", 1)[-1]
            if name not in out and message.startswith(prefixes) and (at := log_time(line)) is not None:
                out[name] = at - launched
    missing = [name for name in MARKS if name not in out]
    if missing:
        raise SystemExit(f"no log line for {missing} in:\n{done.stderr[-3000:]}")
    return out


def measure(records: int, partitions: int, repeats: int, paths: dict[str, list[str]],
            extra: list[str] = ()) -> dict[str, list[dict[str, float]]]:
    """:func:`one_run`'s figures per path, ``repeats`` times each, the paths interleaved
    after one warm-up run, against one embedded broker and one topic of ``records`` SMS
    records on ``partitions`` partitions."""
    base = [row.record for row in DatasetReader(bundled_path())]
    rows = [(None, base[i % len(base)], None) for i in range(records)]
    with EmbeddedBroker() as broker, tempfile.TemporaryDirectory() as tmp:
        topic = "startup"
        create_topic(broker.bootstrap, topic, partitions)
        produce_rows(broker.bootstrap, topic, rows)
        one_run(broker.bootstrap, topic, records, list(extra), Path(tmp))  # warm-up
        runs: dict[str, list[dict[str, float]]] = {path: [] for path in paths}
        for repeat in range(repeats):
            for path, flags in paths.items():
                result = one_run(broker.bootstrap, topic, records, [*flags, *extra], Path(tmp))
                runs[path].append(result)
                print(f"  {path:6s} run {repeat + 1}: " + ", ".join(f"{k} {v:.2f} s" for k, v in result.items()),
                      flush=True)
    return runs


def main() -> None:
    parser = parser_for(__doc__)
    parser.add_argument("--records", type=positive_int, default=2000,
                        help="SMS records in the topic, all learned by each worker process (default %(default)s)")
    parser.add_argument("--partitions", type=positive_int, default=3,
                        help="partitions of the topic (default %(default)s)")
    parser.add_argument("--repeats", type=positive_int, default=3,
                        help="timed runs of each path after the warm-up, the median kept (default %(default)s)")
    add_set_option(parser, "for every worker")
    args = parser.parse_args()
    extra = [item for kv in args.set for item in ("--set", kv)]
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs; {args.records} SMS records on "
          f"{args.partitions} partitions; default config {' '.join(args.set) or ''}".rstrip())
    runs = measure(args.records, args.partitions, args.repeats, PATHS, extra)
    columns = [*MARKS, "exit", "cpu to exit"]
    print(f"\nseconds from process start (median of {args.repeats})")
    print("| path | " + " | ".join(columns) + " |")
    print("|---|" + "---:|" * len(columns))
    for path, results in runs.items():
        cells = [f"{statistics.median(r[c] for r in results):.2f}" for c in columns]
        print(f"| {path} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    sys.exit(run_main(main))
