"""Run the benchmarks one after another and print a summary: `make bench`.

    python bench/run_all.py                 # every benchmark in its quick form (about 12 minutes)
    python bench/run_all.py --full          # the commands behind docs/benchmarks.md (about 292 minutes)
    python bench/run_all.py --only hashing worker --data ../shared/data
    python bench/run_all.py --list          # what would run, with the commands and the usual times

Each benchmark runs as its own process (``python bench/NAME.py ...``, with this
interpreter), its output shown as it comes and kept in ``--logs`` (default runs/bench/).
A failing or timed-out benchmark is reported and the next one runs: nothing stops the
run. The summary lists each one's status, seconds and headline (the lines that state its
targets); the exit status is 1 if any failed.

Data: every script finds the datasets through ``--data`` or ``../shared/data`` beside the
repository, and replaces a missing dataset by a synthetic stream it labels SYNTHETIC
(bench/data.py); ``--data`` here is passed to every script that reads datasets, and a
folder that does not exist stops the run before any script starts.

The times are the sums of each benchmark's usual seconds (:class:`Benchmark`), as
``--list`` prints them; of the full run's, bench/tokens.py takes 180 minutes.

A script under bench/ that is neither listed in :data:`BENCHMARKS` nor a helper module
(:data:`HELPERS`) is reported at the start and the end of every run, so a new benchmark
is not silently left out (tests/test_bench_run_all.py checks the same).
"""
from __future__ import annotations

import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from data import folder
from options import parser_for, positive_float

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
HELPERS = {"data.py", "options.py", "peers.py", "quality_eval.py", "quality_streams.py", "run_all.py", "synthetic_items.py"}  # imported by the scripts, not run


@dataclass(frozen=True)
class Benchmark:
    """One script: its quick and full arguments, whether it takes ``--data``, its usual
    seconds in each form on the 2-core project machine, shared (quick: measured by `make
    bench` on 2026-11-25; full: the documented runs'), and the regex of the output lines
    that state its result (the summary's headline)."""

    name: str
    quick: tuple[str, ...]
    full: tuple[str, ...]
    quick_s: int
    full_s: int
    headline: str
    data: bool = False
    what: str = ""

    @property
    def script(self) -> Path:
        return BENCH / f"{self.name}.py"

    def command(self, full: bool, data: Path | None) -> list[str]:
        args = list(self.full if full else self.quick)
        if data is not None and self.data:
            args += ["--data", str(data)]
        return [sys.executable, str(self.script), *args]


BENCHMARKS = (
    Benchmark("hashing", ("--repeats", "3"), (), 5, 30, r"TokenHasher / bare loop|SYNTHETIC", data=True,
              what="TokenHasher tokens/s against a bare xxh3 loop"),
    Benchmark("embeddings", ("--repeats", "5"), (), 35, 90, r"fwd\+bwd ratio|table / hash|SYNTHETIC", data=True,
              what="hash embedding forward+backward against nn.Embedding; every scheme; memory"),
    Benchmark("decoding", ("--n", "200000", "--reps", "2"), (), 5, 60, r"^\| |^add|^merge",
              what="Superbloom's beam search against exhaustive scoring at 10^6 candidates; the index's add and merge"),
    Benchmark("checkpoint", ("--rows", "100000", "--reps", "3"), (), 10, 120, r"^\| (checkpoint|1%|snapshot)", what=
              "incremental checkpoints and snapshot reads against bare py-lmdb"),
    Benchmark("state_faults", ("--kills", "10", "--chain", "5"), (), 20, 120, r'"wrong_states"',
              what="SIGKILL during commits: every reopened state checked"),
    Benchmark("init_compare", ("--quick",), (), 60, 120, r"^\| |SYNTHETIC", data=True,
              what="hash embedding init paper vs mean, prequential accuracy"),
    Benchmark("quality", ("--quick", "--threads", "1", "--only", "sms", "movielens", "step_cost"),
              (), 70, 150, r"^\| (SMS|AG|Movie)|step cost|SYNTHETIC", data=True,
              what="prequential quality against river NB, VW, Markov, popularity; step cost"),
    Benchmark("shapes", ("--task", "text", "--streams", "sms", "yelp", "--seeds", "0"), (), 30, 1500,
              r"^worst", data=True,
              what="one set of defaults on every text and next-item stream against per-record peers; the worst"),
    Benchmark("streams", ("--only", "sms-spam,ag-news-581", "--passes", "1", "--dry-run"), (), 35, 300, r"^\| .*\| accuracy \||^\| .*\| recall|Frozen replay", data=True,
              what="replay of every dataset: model vs baselines, frozen vs prequential speed"),
    Benchmark("worker", ("--records", "3000", "--rounds", "1"), ("--records", "60000"), 25, 240, r"^median|^targets", data=True,
              what="worker records/s from the embedded broker against in-memory learn_many"),
    Benchmark("serve", ("--windows", "1", "--window-seconds", "3"), ("--windows", "4", "--window-seconds", "6"),
              90, 150, r"POST /v1/predict|drop|freshness", what="HTTP predict latency while a worker trains"),
    Benchmark("scaleout", ("--records", "12000", "--checkpoint-every", "1500", "--repeat", "1", "--skip-quality"),
              (), 120, 840, r"^records/s|^ratios|prequential / held-out", data=True,
              what="1 worker vs 2 workers averaging vs all-reduce, speed and quality"),
    Benchmark("depth", ("--quick", "--sets", "30000"), ("--seeds", "2", "--control", "--jobs", "2"), 70, 1080, r"^\| ", what="Superbloom's depth claim on heavily hashed synthetic sets"),
    Benchmark("speed", ("--records", "2000", "--passes", "1", "--dry-run"), (), 30, 900,
              r"streamlearn `learn_many`|prequential replay \(|bare torch \|", data=True,
              what="streamlearn records/s against Vowpal Wabbit, river NB and bare torch of the same shape"),
    Benchmark("tokens", ("--records", "600", "--seeds", "1", "--depths", "0,1", "--rss-records", "3000", "--dry-run"),
              (), 30, 10800, r"^\| (model|markov|ngram)|^targets|^At the defaults", data=True,
              what="War and Peace as a token stream: next-token and mlm at depths 0/1/2 against Markov and KN n-grams"),
    Benchmark("item_speed", ("--limit", "4000", "--rounds", "1"), (), 15, 300, r"^best|SYNTHETIC", data=True,
              what="next-item learn_many of the defaults against other configurations, side by side"),
    Benchmark("moving_items", ("--streams", "growing,one-event"), ("--seeds", "0,1,2"), 6, 330, r"^\| |^worst",
              what="next-item streams whose catalog, popularity or taste moves: the model against Markov, popularity, ngram"),
    Benchmark("profile_step", ("--warm", "20", "--steps", "20", "--top", "8"), ("--task", "next-token"), 15, 60,
              r"^learn_many|^torch operators|^per step|SYNTHETIC", data=True,
              what="where a learn_many step's time goes by torch operator; launches, copies and syncs per step"),
    Benchmark("advance", ("--commits", "2", "--warm", "500"), (), 15, 60, r"^\| (next|classify)",
              what="the first query after a checkpoint: the store's change log against whole tables"),
    Benchmark("startup", ("--records", "500", "--repeats", "1"), ("--repeats", "5"), 60, 240, r"^median|^\| (manual|group)",
              what="process start to the first record learned: a lone worker vs a group join"),
)
BY_NAME = {b.name: b for b in BENCHMARKS}


def unregistered() -> list[str]:
    """Scripts under bench/ that run_all does not know."""
    known = {b.script.name for b in BENCHMARKS} | HELPERS
    return sorted(p.name for p in BENCH.glob("*.py") if p.name not in known)


@dataclass
class Outcome:
    name: str
    status: str  # "ok", "failed (exit N)", "timed out after N s", "missing"
    seconds: float
    headline: list[str]


def run_one(bench: Benchmark, full: bool, data: Path | None, logs: Path, timeout: float) -> Outcome:
    """Run one benchmark, echoing its output and keeping it in ``logs/NAME.log``."""
    if not bench.script.is_file():
        return Outcome(bench.name, "missing", 0.0, [f"{bench.script} not found"])
    command = bench.command(full, data)
    print(f"\n=== {bench.name}: {' '.join(_shown(command))}", flush=True)
    pattern = re.compile(bench.headline)
    headline, started = [], time.monotonic()
    with open(logs / f"{bench.name}.log", "w", encoding="utf-8") as log:
        proc = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                bufsize=1)
        status = _follow(proc, log, pattern, headline, timeout)
    return Outcome(bench.name, status, time.monotonic() - started, headline)


def _follow(proc: subprocess.Popen, log, pattern: re.Pattern, headline: list[str], timeout: float) -> str:
    """Copy the process's output to the terminal and the log until it ends or ``timeout``
    seconds pass (then it is killed); collect the headline lines."""
    import selectors

    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    deadline = time.monotonic() + timeout
    while True:
        if time.monotonic() > deadline:
            proc.kill()
            proc.wait()
            return f"timed out after {timeout:.0f} s"
        if not sel.select(timeout=1.0):
            continue
        line = proc.stdout.readline()
        if not line:
            break
        log.write(line)
        print(f"  {line}", end="", flush=True)
        if pattern.search(line):
            headline.append(line.rstrip())
    code = proc.wait()
    return "ok" if code == 0 else f"failed (exit {code})"


def _shown(command: list[str]) -> list[str]:
    """The command as a user would type it from the repository root."""
    return ["python", str(Path(command[1]).relative_to(ROOT)), *command[2:]]


def summary(outcomes: list[Outcome], full: bool) -> str:
    lines = [f"\nbench/run_all.py summary ({'full' if full else 'quick'}): "
             f"{sum(o.status == 'ok' for o in outcomes)} of {len(outcomes)} ok, "
             f"{sum(o.seconds for o in outcomes) / 60:.1f} minutes"]
    for o in outcomes:
        lines.append(f"  {o.name:<13}{o.status:<22}{o.seconds:>7.0f} s")
        lines += [f"      {h[:160]}" for h in o.headline[-6:]]
    missing = unregistered()
    if missing:
        lines.append(f"  not run (not listed in bench/run_all.py BENCHMARKS): {', '.join(missing)}")
    return "\n".join(lines)


def listing(selected: list[Benchmark], full: bool, data: Path | None) -> str:
    lines = [f"{'full' if full else 'quick'} run, about {sum(b.full_s if full else b.quick_s for b in selected) / 60:.0f} "
             "minutes on the 2-core project machine:"]
    for b in selected:
        lines.append(f"  {b.name:<13}~{(b.full_s if full else b.quick_s):>5} s  {' '.join(_shown(b.command(full, data)))}")
        lines.append(f"  {'':<21}{b.what}")
    missing = unregistered()
    if missing:
        lines.append(f"  not listed in BENCHMARKS, so not run: {', '.join(missing)}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = parser_for(__doc__)
    parser.add_argument("--full", action="store_true", help="the full commands of docs/benchmarks.md instead of the "
                        "quick ones (bench/streams.py then rewrites its table in docs/benchmarks.md)")
    parser.add_argument("--only", nargs="+", choices=sorted(BY_NAME), metavar="NAME", help="these benchmarks only")
    parser.add_argument("--data", type=folder, help="the datasets folder, passed to every script that reads one "
                        "(default: each script's own, ../shared/data beside the repository)")
    parser.add_argument("--logs", type=Path, default=ROOT / "runs" / "bench",
                        help="where each output is kept (default runs/bench)")
    parser.add_argument("--timeout", type=positive_float, help="seconds per benchmark before it is killed "
                        "(default: 4 x its usual time, at least 10 minutes)")
    parser.add_argument("--list", action="store_true", help="print what would run, and run nothing")
    args = parser.parse_args(argv)
    selected = [BY_NAME[n] for n in args.only] if args.only else list(BENCHMARKS)
    print(listing(selected, args.full, args.data), flush=True)
    if args.list:
        return 0
    args.logs.mkdir(parents=True, exist_ok=True)
    outcomes = []
    for bench in selected:
        usual = bench.full_s if args.full else bench.quick_s
        outcomes.append(run_one(bench, args.full, args.data, args.logs, args.timeout or max(600, 4 * usual)))
    print(summary(outcomes, args.full))
    print(f"outputs: {args.logs}/NAME.log")
    return 0 if all(o.status == "ok" for o in outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
