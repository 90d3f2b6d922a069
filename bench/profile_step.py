"""Where a ``learn_many`` step's time goes, by torch operator, on the device the defaults pick.

    python bench/profile_step.py [--task classify|next-token|mlm|next-item] [--data DIR]
                                 [--warm 200] [--steps 200] [--set KEY=VALUE] [--top 15]

The question it answers first on a GPU (docs/gpu.md: at the defaults an H100 trained at a
fifth to a half of two CPU cores' rate): is a step bound by kernel launches, by host work
between them, or by waits for the device? A learner at the task's defaults (plus
``--set``) learns ``--warm`` mini-batches of its development stream, then ``--steps`` more
under ``torch.profiler``. It prints records/s without and with the profiler, the share
of the wall time that torch's operators take on the CPU, the operators by self CPU time
(and by self CUDA time on a GPU), and per step: the kernels launched, the host-device
copies and the explicit synchronizations.

Classify at its defaults on the CPU runs a step as one compiled call
(``learner.compiled``, streamlearn.compiled), which torch's profiler cannot see into: the
script says so and prints no operator table; ``--set learner.compiled=false`` profiles
the same step as torch's operators (the reference the compiled step is tested against,
several times slower).

Streams (from --data, default ../shared/data beside the repository; a labelled synthetic
stand-in when absent, bench/data.py): classify the SMS Spam Collection, next-token and
mlm War and Peace in records of 32 words (bench/tokens.py), next-item MovieLens 100K.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parent))

from data import add_data_option, data_dir, events_stream, text_stream
from options import add_set_option, nonneg_int, parser_for, positive_int, run_main
from tokens import stream as book

from streamlearn.config import load_config
from streamlearn.learner import Learner

# CUDA runtime and driver calls as the profiler names them, by what they do (prefixes and a
# part: the exact names vary with the CUDA version, e.g. cudaLaunchKernelExC, cuLaunchKernel).
RUNTIME = {"kernel launches": lambda k: k.startswith(("cudaLaunch", "cuLaunch")),
           "host-device copies": lambda k: k.startswith(("cudaMemcpy", "cuMemcpy")),
           "synchronizations": lambda k: k.startswith(("cuda", "cu")) and "Synchronize" in k}


def records_of(task: str, data: Path, n: int) -> tuple[list[dict], str]:
    if task == "classify":
        s = text_stream("sms", data, n)
        return s.records, s.source
    if task == "next-item":
        s = events_stream(data, n)
        return s.records, s.source
    return book(data, n)


def learn(learner: Learner, batches: list[list[dict]]) -> float:
    """Records/s of ``learn_many`` over ``batches``, the device's queue drained."""
    started = time.perf_counter()
    for batch in batches:
        learner.learn_many(batch)
    learner.dev.synchronize()
    return sum(map(len, batches)) / (time.perf_counter() - started)


def main() -> int:
    parser = parser_for(__doc__)
    parser.epilog = ("classify at its defaults runs a step as one compiled call that torch's profiler cannot see "
                     "into: add --set learner.compiled=false to profile torch's operators")
    add_data_option(parser)
    parser.add_argument("--task", default="classify", choices=("classify", "next-token", "mlm", "next-item"),
                        help="the task, at its defaults (default %(default)s)")
    parser.add_argument("--warm", type=nonneg_int, default=200,
                        help="mini-batches learned before any timing (default %(default)s)")
    parser.add_argument("--steps", type=positive_int, default=200,
                        help="mini-batches timed, then profiled (as many again; default %(default)s)")
    add_set_option(parser)
    parser.add_argument("--top", type=positive_int, default=15, help="operators listed (default %(default)s)")
    args = parser.parse_args()
    learner = Learner(load_config(None, [f"learner.task={args.task}", *args.set], use_env=False))
    size = learner.cfg.learner.batch_size
    records, source = records_of(args.task, data_dir(args.data), (args.warm + 2 * args.steps) * size)
    batches = [records[i:i + size] for i in range(0, len(records), size)]
    if len(batches) < args.warm + 2 * args.steps:
        parser.error(f"the stream ({source}) holds {len(batches)} batches of {size}, fewer than --warm {args.warm} "
                     f"+ 2 x --steps {args.steps}: lower them")
    warm, timed, profiled = (batches[:args.warm], batches[args.warm:args.warm + args.steps],
                             batches[args.warm + args.steps:])
    learn(learner, warm)
    plain = learn(learner, timed)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if learner.dev.cuda else [])
    with profile(activities=activities) as prof:
        under = learn(learner, profiled)
    events = prof.key_averages()
    steps = len(profiled)
    per_step = {what: sum(e.count for e in events if named(e.key)) / steps for what, named in RUNTIME.items()}
    print(f"{args.task} at its defaults{' + ' + ' '.join(args.set) if args.set else ''} on "
          f"{learner.dev.describe()}, torch {torch.__version__}; stream {source}, batch {size}")
    wall_ms = sum(map(len, profiled)) / under * 1e3
    torch_ms = sum(e.self_cpu_time_total for e in events) / 1e3
    print(f"learn_many: {plain:,.0f} records/s; under the profiler {under:,.0f} ({len(profiled)} steps)")
    if learner.runs_compiled:
        print("torch operators: none to show: a step runs as one compiled call (learner.compiled, "
              "streamlearn.compiled) that torch's profiler cannot see into; --set learner.compiled=false "
              "profiles the same step as torch's operators")
        return 0
    print(f"torch operators' own CPU time: {torch_ms:,.1f} ms of {wall_ms:,.1f} ms wall ({torch_ms / wall_ms:.0%}; "
          "the rest is Python, numpy and waits)")
    print(events.table(sort_by="self_cpu_time_total", row_limit=args.top))
    if learner.dev.cuda:
        print(events.table(sort_by="self_cuda_time_total", row_limit=args.top))
        print("per step: " + ", ".join(f"{n:,.1f} {what}" for what, n in per_step.items()))
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
