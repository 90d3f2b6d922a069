"""``streamlearn replay``: evaluate a model on a recorded stretch of a stream.

Examples::

    streamlearn replay --file SMSSpamCollection --baselines all --report r.json --plot r.png
    streamlearn replay --topic events --start-offset 0:1000 --end-offset 0:5000 --state model/ --mode frozen
    streamlearn replay --topic events --start-time 2024-05-01T00:00:00Z --compare old/ new/
"""
from __future__ import annotations

import argparse
import os
import sys

from ..config import TASKS, Config, KafkaConfig, WorkerConfig, load_config, load_config_given
from ..datasets import ReadOptions, task_of_fields
from ..exceptions import StreamlearnError
from ..wording import counted
from . import bootstrap_arg, silence_stdout, topic_arg


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "replay",
        help="replay a file or a Kafka range through a model and baselines; report metrics and a plot",
        description="Evaluate on a recorded stretch of a stream. prequential: predict each record, then "
        "learn it (per mini-batch: a batch is predicted before its optimizer step), from --state or from "
        "scratch (--config/--set/--task); frozen: a fixed --state, no learning. Nothing is written to any "
        "state unless --save names a new directory. Metrics (river): accuracy, macro_f1, log_loss "
        "(classify); recall@K and mrr (next-item, mlm, next-token), overall and over a rolling --window. "
        "Baselines run side by side on the same records. See docs/evaluation.md.",
    )
    src = parser.add_argument_group("source (one of --file or --topic)")
    src.add_argument("--file", metavar="FILE", help="log file: JSON lines, CSV/TSV, MovieLens, plain text (a token stream: "
                     "records of 32 words), or a msgpack stream")
    src.add_argument("--input-format", choices=_file_formats(), help="file format (default: detected)")
    src.add_argument("--text-column", help="CSV/TSV text column (name or 0-based index; 'a,b' joins)")
    src.add_argument("--label-column", help="CSV/TSV label column (name or 0-based index)")
    src.add_argument("--topic", type=topic_arg, help="Kafka topic to read (no consumer group: nothing is committed)")
    src.add_argument("--bootstrap", type=bootstrap_arg,
                     help="Kafka bootstrap servers (default: worker.bootstrap of the config or environment, else "
                     f"{WorkerConfig.bootstrap})")
    src.add_argument("--partitions", help="comma-separated partitions to read (default: all)")
    src.add_argument("--start-offset", metavar="N|P:N,..", help="first offset, for every partition or per partition")
    src.add_argument("--end-offset", metavar="N|P:N,..", help="end offset, exclusive (default: the end at start-up)")
    src.add_argument("--start-time", metavar="TIME", help="first record at or after TIME (ms or ISO 8601)")
    src.add_argument("--end-time", metavar="TIME", help="stop before the first record at or after TIME")
    src.add_argument("--limit", type=int, help="read at most N records")

    model = parser.add_argument_group("model")
    model.add_argument("--state", metavar="DIR", help="snapshot to start from (read-only)")
    model.add_argument("--mode", choices=("prequential", "frozen"), default="prequential",
                       help="prequential: predict then learn; frozen: predict only (default: %(default)s)")
    model.add_argument("--compare", nargs=2, metavar=("A", "B"), help="evaluate two snapshots on the same records")
    model.add_argument("--save", metavar="DIR", help="after a prequential replay, write the learner to this new directory")
    model.add_argument("--config", metavar="FILE", help="TOML config for a model from scratch")
    model.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                       help="dotted config override, repeatable (e.g. --set model.layers=0)")
    model.add_argument("--task", choices=TASKS, help="learner.task of a model from scratch (with --state: the "
                       "snapshot's own task, or omit it)")

    ev = parser.add_argument_group("evaluation")
    ev.add_argument("--baselines", default="", help="comma-separated: river-nb,river-logreg,vw,popularity,markov,ngram; or 'all' (those that fit the task)")
    ev.add_argument("--k", type=int, default=10, help="top-k list length for recall@K and mrr (default: %(default)s)")
    ev.add_argument("--window", type=int, default=1000, help="rolling window, in scored events: a record each for classify, mlm and next-item, "
                         "a position each for next-token (default: %(default)s)")
    ev.add_argument("--delay", type=int, default=0, help="labels arrive this many records late (default: %(default)s)")
    ev.add_argument("--seed", type=int, default=None,
                    help="learner.seed and the mlm masking seed (default: learner.seed from --set/--config, else 0)")
    ev.add_argument("--report", metavar="FILE", help="write the JSON report here")
    ev.add_argument("--plot", metavar="FILE", help="write the rolling metrics here as a chart (PNG; .pdf or "
                    ".svg by the file's suffix)")
    ev.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.set_defaults(func=run)


def _file_formats() -> tuple[str, ...]:
    from ..replay.sources import FILE_FORMATS

    return FILE_FORMATS


def run(args: argparse.Namespace) -> int:
    _check_args(args)
    config, given = _config(args)
    args.seed = _seed(args, config, given)
    overrides = _snapshot_overrides(config, given)
    from ..compiled_loading import in_a_command, start_loading_for
    in_a_command()
    start_loading_for(config)  # numba's start-up in a thread while torch imports

    import torch
    from tqdm import tqdm

    from ..device import intra_op_threads
    from ..replay import replay
    from ..replay.baselines import parse_baselines

    source = _source(args, config.kafka, config.worker.max_record_bytes, config.worker.bootstrap,
                     labels=config.learner.task == "classify")
    if args.file is not None:
        print(source.preview(), file=sys.stderr)
    torch.set_num_threads(intra_op_threads(config))
    options = _options(args, parse_baselines(args.baselines, config.learner.task))  # a snapshot's task: _stored_task
    with tqdm(total=source.estimate() if args.limit is None else args.limit, unit="rec", desc="replay",
              disable=True if args.no_progress else None, file=sys.stderr) as bar:
        report = replay(source, options, state=args.state, compare=tuple(args.compare) if args.compare else None,
                        config=config, overrides=overrides, save=args.save, progress=bar)
    # the summary first: a file that cannot be written loses nothing the terminal shows;
    # the files then, even when stdout's reader has gone (``replay ... | head -1``; was:
    # the BrokenPipeError stopped the run before the report was written)
    broken = _print_out(summary(report))
    failed = _write(args, report)
    if broken is None:
        broken = _print_out(*_written(args, report, failed))
    for line in report["source"].get("notes", []):
        print(f"note: {line}", file=sys.stderr)
    if report["config"].get("sizing") and not (args.state or args.compare):  # a snapshot is never sized again
        from ..sizing import Sizing

        print(f"note: new model, {Sizing.from_dict(report['config']['sizing'])}", file=sys.stderr)
    if failed:
        if broken is not None:
            silence_stdout()
        raise StreamlearnError("; ".join(failed.values()))
    if broken is not None:
        raise broken  # main stops as on any closed pipe (exit 141)
    return 0


def _print_out(*lines: str) -> BrokenPipeError | None:
    """Print ``lines`` to stdout and flush; the BrokenPipeError if its reader has gone."""
    try:
        for line in lines:
            print(line)
        sys.stdout.flush()
    except BrokenPipeError as exc:
        return exc
    return None


def _check_args(args: argparse.Namespace) -> None:
    if (args.file is None) == (args.topic is None):
        raise StreamlearnError("give one source: --file FILE or --topic T")
    kafka_only = ("partitions", "start_offset", "end_offset", "start_time", "end_time")
    for name in kafka_only:  # was: an empty value read as not given, and the whole topic replayed
        if getattr(args, name) is not None and not getattr(args, name).strip():
            raise StreamlearnError(f"--{name.replace('_', '-')} is empty: give a value, or leave the option out")
    if args.file is not None and any(getattr(args, name) is not None for name in kafka_only):
        raise StreamlearnError("--partitions/--start-*/--end-* select a Kafka range: use them with --topic")
    if args.topic is not None and any(getattr(args, n) for n in ("input_format", "text_column", "label_column")):
        raise StreamlearnError("--input-format/--text-column/--label-column read files: use them with --file")
    offsets, times = (args.start_offset, args.end_offset), (args.start_time, args.end_time)
    if any(v is not None for v in offsets) and any(v is not None for v in times):
        raise StreamlearnError("give an offset range (--start-offset/--end-offset) or a time range "
                               "(--start-time/--end-time), not both")
    _check_output("report", args.report)
    _check_output("plot", args.plot)
    if args.plot is not None:
        from ..replay.plot import plot_format

        plot_format(args.plot)  # a suffix of no chart format: said now, not after the replay
    if (args.state or args.compare) and args.config and not _kafka_only(args.config):
        raise StreamlearnError("--config builds a model from scratch; a snapshot keeps its own config "
                               "(use --set for overrides that keep its tables; a --config with only a [kafka] "
                               "table is fine)")  # --task: the snapshot's own is fine, another is refused


def _config(args: argparse.Namespace) -> tuple[Config, frozenset[str]]:
    """The run's config and the keys the user gave. Given no task, a snapshot's task, or
    for a new model the task its file says, comes first, so --set and the environment
    are checked against that task's defaults and rules (not classify's)."""
    stored = _stored_task(args)
    file_task, file_question = _file_task(args)
    if stored is not None:
        _check_file_fits(args, stored, file_task, file_question)
        file_task, file_question = None, None
    elif args.topic is not None:
        file_task = _topic_task(args)
    overrides = [*args.set, *([f"learner.task={args.task}"] if args.task else [])]
    try:
        config, given = load_config_given(args.config, overrides, default_task=stored or file_task)
    except StreamlearnError:
        if file_question is not None and not _task_typed(args):
            raise file_question from None  # running text: which token task comes first
        raise
    if "learner.task" in given:
        if stored is not None and config.learner.task != stored:
            raise StreamlearnError(f"the snapshot at {_snapshot(args)} holds a {stored} model, and "
                                   f"this run asks for learner.task={config.learner.task}: drop the task (a "
                                   "snapshot keeps its own)")
    elif file_question is not None:
        raise file_question
    return config, given


def _task_typed(args: argparse.Namespace) -> bool:
    return bool(args.task) or any(s.partition("=")[0].strip() == "learner.task" for s in args.set)


def _stored_task(args: argparse.Namespace) -> str | None:
    """The snapshot's task (``--state``, ``--compare``'s first): --set is checked with its
    defaults and rules, not classify's."""
    if _snapshot(args) is None:
        return None
    from ..checkpoint import stored_task

    return stored_task(_snapshot(args))


def _snapshot(args: argparse.Namespace) -> str | None:
    """The snapshot a run starts from: ``--state``, or ``--compare``'s first (None: a new model)."""
    return args.state or (args.compare[0] if args.compare else None)


def _snapshot_overrides(config: Config, given: frozenset[str]) -> list[str]:
    """What --set and the environment change on a snapshot's stored config (a model key
    changed is refused there, naming it). The [kafka] keys only connect the source."""
    from ..config import values_of

    keys = sorted(k for k in given if k != "learner.task" and not k.startswith("kafka."))
    return [f"{k}={v}" for k, v in values_of(config, keys)]


def _check_file_fits(args: argparse.Namespace, stored: str, file_task: str | None,
                     question: StreamlearnError | None) -> None:
    """A snapshot replayed on a file of another task: every record would be bad (exit 0)."""
    from ..datasets import TokenStreamQuestion

    holds = file_task if file_task not in (None, stored) else None
    if isinstance(question, TokenStreamQuestion) and stored not in ("next-token", "mlm"):
        holds = "running text (a token stream)"
    if holds is not None:
        raise StreamlearnError(f"the snapshot at {_snapshot(args)} holds a {stored} model, and "
                               f"{args.file} holds {holds}: replay it on a {stored} stream")


def _file_task(args: argparse.Namespace) -> tuple[str | None, StreamlearnError | None]:
    """The task a file says (MovieLens, JSON lines of key and item: next-item;
    :func:`~streamlearn.datasets.task_of_records`), or the question it raises (running
    text: which token task?), asked only when the run gives no task. Was: every such
    record scored as a bad classify record, exit status 0."""
    if args.file is None:
        return None, None
    from ..datasets import task_of_records

    try:
        return task_of_records(args.file, args.input_format), None
    except StreamlearnError as question:
        return None, question


_PEEK = 20  # records a new model's task is read from, on a topic


def _topic_task(args: argparse.Namespace) -> str | None:
    """For a new model given no task (--task, --set, --config or the environment), the
    task the topic's first records say: ``key`` and ``item`` are next-item; labels are
    classify (None). Records of text without labels (a token stream), or a mix, stop the
    run asking for --task. Read in a pass of their own: the replay starts from the
    range's first record all the same. Was: every such record scored as a bad classify
    record ("0 scored, 3000 bad (missing-field: 3000)"), exit status 0."""
    if _task_typed(args):
        return None
    from ..replay.sources import first_records

    connection = [s for s in args.set if s.partition("=")[0].strip().startswith(("kafka.", "worker."))]
    config, given = load_config_given(args.config, connection)  # the task's rules wait for the task
    if "learner.task" in given:
        return None
    source = _source(args, config.kafka, config.worker.max_record_bytes, config.worker.bootstrap)
    records = first_records(source, _PEEK if args.limit is None else max(0, min(_PEEK, args.limit)))
    task = task_of_fields([set(r.to_dict()) for r in records], f"topic {args.topic!r}")
    if task is not None:
        print(f"note: task {task}: the first records of {args.topic!r} hold a key and an item "
              "(--task to choose another)", file=sys.stderr)
    return task


def _seed(args: argparse.Namespace, config: Config, given: frozenset[str]) -> int:
    """``--seed``, else ``learner.seed`` as --set/--config/the environment give it."""
    if args.seed is None:
        return config.learner.seed
    if "learner.seed" in given and config.learner.seed != args.seed:
        raise StreamlearnError(f"--seed {args.seed} and learner.seed={config.learner.seed} disagree: give one")
    return args.seed


def _kafka_only(path: str) -> bool:
    """Whether the config file at ``path`` sets nothing but the [kafka] connection settings."""
    import dataclasses

    file_config = load_config(path, use_env=False)
    return dataclasses.replace(file_config, kafka=KafkaConfig()) == Config()


def _source(args: argparse.Namespace, security: KafkaConfig, max_bytes: int, bootstrap: str, labels: bool = False):
    """The records to replay; one over ``max_bytes`` (``worker.max_record_bytes``) is bad,
    too-large, from a file as from Kafka, as the worker has it. ``labels``: the task learns
    from labels, so a table without a label column is refused."""
    from ..replay.sources import FileSource, KafkaRange, KafkaSource, parse_offsets, parse_time

    if args.file is not None:
        return FileSource(args.file, ReadOptions(args.input_format, args.text_column, args.label_column,
                                                 max_line_bytes=max_bytes, labels=labels))
    rng = KafkaRange(
        args.topic,
        start=_parsed("--start-offset", args.start_offset, parse_offsets),
        end=_parsed("--end-offset", args.end_offset, parse_offsets),
        start_ms=_parsed("--start-time", args.start_time, parse_time),
        end_ms=_parsed("--end-time", args.end_time, parse_time),
        partitions=_partitions(args.partitions),
    )
    return KafkaSource(args.bootstrap or bootstrap, rng, max_bytes=max_bytes, security=security)


def _parsed(option: str, value: str | None, parse):
    """``parse(value)`` (None: not given), its error naming ``option``."""
    if value is None:
        return None
    try:
        return parse(value)
    except StreamlearnError as exc:
        raise StreamlearnError(f"{option} {value}: {exc}") from exc


def _partitions(spec: str | None) -> tuple[int, ...] | None:
    if spec is None:
        return None
    try:
        return tuple(int(p) for p in spec.split(","))
    except ValueError as exc:
        raise StreamlearnError(f"--partitions {spec!r}: a comma-separated list of partition numbers") from exc


def _options(args: argparse.Namespace, baselines: list[str]):
    from ..replay import ReplayOptions

    return ReplayOptions(mode=args.mode, k=args.k, window=args.window, delay=args.delay,
                         baselines=tuple(baselines), seed=args.seed, limit=args.limit)


def _write(args: argparse.Namespace, report: dict) -> dict[str, str]:
    """Write the report and the plot, each on its own; ``{option: error}`` of those that failed."""
    from ..replay import plot_report, write_report

    failed = {}
    for option, path, write in (("report", args.report, write_report), ("plot", args.plot, plot_report)):
        if path:
            try:
                write(report, path)
            except StreamlearnError as exc:
                failed[option] = str(exc)
    return failed


def _check_output(option: str, path: str | None) -> None:
    """Before a replay that may run for long: its --report/--plot can be written."""
    if path is None:
        return
    parent = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        raise StreamlearnError(f"--{option} {path} is a directory: name a file")
    if not os.path.isdir(parent):
        raise StreamlearnError(f"--{option} {path}: no directory {parent}; create it first")
    if not os.access(parent, os.W_OK) or (os.path.exists(path) and not os.access(path, os.W_OK)):
        raise StreamlearnError(f"--{option} {path}: not writable here")


def _written(args: argparse.Namespace, report: dict, failed: dict[str, str]) -> list[str]:
    """Where this run wrote its files, one line each (absolute paths: the user may have
    given a relative one from another directory's habit)."""
    lines = []
    if args.report and "report" not in failed:
        lines.append(f"report written to {os.path.abspath(args.report)}")
    if args.plot and "plot" not in failed:
        lines.append(f"plot written to {os.path.abspath(args.plot)}")
    if args.save:
        lines.append(f"learner saved to {os.path.abspath(args.save)} (step {report['saved_step']}): "
                     f"serve --state, replay --state and inspect read it")
    return lines


def summary(report: dict) -> str:
    """A few lines for the terminal: counts, then one row per model and baseline. A
    metric nothing was scored for (an empty range, a file of bad records) reads n/a."""
    bad, rej = report["bad_records"], report["rejected_records"]
    lines = [f"replay {report['task']} {report['mode']}: {report['records']} records, {report['evaluated']} scored, "
             f"{bad['total']} bad{_reasons(bad)}, {rej['total']} rejected{_reasons(rej)}"]
    if report["compare"]:
        lines.append(f"  a = {report['compare']['a']['state']}, b = {report['compare']['b']['state']}")
    lines += _truncated(report)
    names = list(report["metrics"])
    lines.append(f"  {'':<14}" + "".join(f"{n:>11}" for n in names) + f"{'records/s':>14}")
    rows = {**report["models"], **report["baselines"]}
    for who, row in rows.items():
        if "skipped" in row:
            lines.append(f"  {who:<14}skipped: {row['skipped']}")
            continue
        rate = row["records_per_s"]
        lines.append(f"  {who:<14}" + "".join(f"{_value(row[n]):>11}" for n in names)
                     + f"{(f'{rate:,.0f}' if rate else '-'):>14}")
    return "\n".join(lines)


def _truncated(report: dict) -> list[str]:
    """How many records each model's learner cut to hashing.max_tokens, where any were
    (was: counted by the learner, shown nowhere)."""
    lines = []
    for who, row in report["models"].items():
        n = row.get("truncated_records")
        if n:
            whose = f"{who}: " if len(report["models"]) > 1 else ""
            lines.append(f"  {whose}{counted(n, 'record')} cut to hashing.max_tokens={row['max_tokens']} tokens")
    return lines


def _value(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.4f}"


def _reasons(counts: dict) -> str:
    return f" ({', '.join(f'{k}: {v}' for k, v in counts['reasons'].items())})" if counts["reasons"] else ""
