"""SIGKILL trials of the store's commit protocol (>= 50 kills by default).

    python bench/state_faults.py [--kills 60] [--chain 6] [--scale 20000] [--max-delay 1.5]
                                 [--map-mb 4] [--sync 1] [--seed 0] [--dir DIR]

A child process commits deterministic checkpoints in a loop (streamlearn.state.faultcheck);
this script SIGKILLs it after a random delay, reopens the directory read-only and checks
that the whole state (rows of three tables, blobs, kv, offsets, records applied, config,
metrics) equals the reference for the checkpoint the manifest reports, and that this
checkpoint lies between the last one the child saw committed and the last it had begun.
``--chain`` kills share one directory (the child resumes from the stored checkpoint), so
later kills hit a store with history, free pages and a map that grew from ``--map-mb``.
About one kill in ten lands before the child is ready (while it opens and declares).

Prints one line per kill, a summary, and exits 1 if any kill found a wrong state.
"""
from __future__ import annotations

import json
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

from options import nonneg_float, nonneg_int, parser_for, positive_float, positive_int, run_main
from streamlearn.state.faultcheck import Reference, kill_once


def main() -> int:
    ap = parser_for(__doc__)
    ap.add_argument("--kills", type=positive_int, default=60, help="SIGKILLs in all (default %(default)s)")
    ap.add_argument("--chain", type=positive_int, default=6, help="kills per directory (default %(default)s)")
    ap.add_argument("--scale", type=positive_int, default=20_000,
                    help="rows per table per checkpoint, about (default %(default)s)")
    ap.add_argument("--max-delay", type=nonneg_float, default=1.5,
                    help="the longest wait after the child is ready before the kill, seconds (default %(default)s)")
    ap.add_argument("--map-mb", type=positive_float, default=4.0,
                    help="the store's initial map in MB; it grows (default %(default)s)")
    ap.add_argument("--sync", type=int, choices=(0, 1), default=1,
                    help="1: the child's commits are durable (store.sync); 0: not (default %(default)s)")
    ap.add_argument("--seed", type=nonneg_int, default=0,
                    help="seeds the kill delays and the checkpoints' contents (default %(default)s)")
    ap.add_argument("--dir", default=None, help="scratch directory (default: a temp dir)")
    args = ap.parse_args()
    rng = random.Random(args.seed)
    root = Path(tempfile.mkdtemp(prefix="bench-faults-", dir=args.dir))
    kills, started = [], time.perf_counter()
    try:
        for k in range(args.kills):
            if k % args.chain == 0:
                directory = root / f"chain{k // args.chain}"
                ref = Reference(seed=args.seed * 1000 + k // args.chain, scale=args.scale)
            kill = kill_once(directory, ref, rng, args.max_delay, args.map_mb, bool(args.sync))
            kills.append(kill)
            where = "in commit" if kill.in_commit else ("before ready" if kill.delay < 0 else "between commits")
            status = "OK" if not kill.problems else "WRONG: " + "; ".join(kill.problems)
            print(f"kill {k + 1:3d}  {directory.name}  delay {abs(kill.delay):5.3f}s  {where:<15}  "
                  f"reopened at checkpoint {kill.step:4d} (child: committed {kill.last_ended}, "
                  f"begun {kill.last_begun})  {status}", flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    bad = [k for k in kills if k.problems]
    summary = {
        "kills": len(kills), "wrong_states": len(bad),
        "in_commit": sum(k.in_commit for k in kills),
        "before_ready": sum(k.delay < 0 for k in kills),
        "between_commits": sum(not k.in_commit and k.delay >= 0 for k in kills),
        "checkpoints_committed": sum(k.step for k in kills[args.chain - 1::args.chain]),
        "scale": args.scale, "sync": bool(args.sync), "seconds": round(time.perf_counter() - started, 1),
    }
    print(json.dumps(summary, sort_keys=True))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(run_main(main))
