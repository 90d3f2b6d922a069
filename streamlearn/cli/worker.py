"""``streamlearn worker --topic T --state DIR``: train a model from a Kafka topic."""
from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
from typing import TYPE_CHECKING, Iterator

if TYPE_CHECKING:
    from ..consumers import Worker

from ..config import ON_LOST_OFFSETS, TASKS, Config, WorkerConfig, load_config_given
from . import bootstrap_arg, topic_arg

log = logging.getLogger("streamlearn.worker")


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "worker",
        help="run a consumer worker: train from a topic, checkpoint to a state directory",
        description="Read every partition of --topic (or, with --world-size or worker.assignment=group, join "
        "a consumer group), decode and validate each record (bad ones go "
        "to <topic>.dlq with the reason), train the model, and checkpoint it to --state together "
        "with the consumed offsets. Restarted, it resumes from the checkpoint: no record is lost or "
        "applied twice. SIGTERM or Ctrl-C: final checkpoint, exit 0. See docs/operations.md.",
    )
    parser.add_argument("--topic", required=True, type=topic_arg, help="topic to consume")
    parser.add_argument("--state", required=True, metavar="DIR", help="state directory (created if missing)")
    parser.add_argument("--bootstrap", type=bootstrap_arg,
                        help=f"Kafka bootstrap servers host:port (default: {WorkerConfig.bootstrap})")
    parser.add_argument("--group", help=f"consumer group (default: {WorkerConfig.group})")
    parser.add_argument("--task", choices=TASKS,
                        help="learner.task (default: a stored model's; for a new one, what the topic's first records "
                        "say: next-item for a key and an item, classify for labels or no records yet; text without "
                        "labels stops asking for next-token or mlm)")
    parser.add_argument("--config", metavar="FILE", help="TOML config file")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="dotted config override, repeatable (e.g. --set model.layers=0)")
    parser.add_argument("--max-records", type=int, help="stop after N records (checkpoint, exit 0)")
    parser.add_argument("--until-idle", type=float, metavar="SECONDS",
                        help="stop when no new record arrived for this long (checkpoint, exit 0)")
    parser.add_argument("--checkpoint-every", type=int, metavar="N",
                        help=f"checkpoint every N records (default: {WorkerConfig.checkpoint_every}; "
                        f"also every worker.checkpoint_seconds={WorkerConfig.checkpoint_seconds:g})")
    parser.add_argument("--metrics-port", type=int, default=0, metavar="PORT",
                        help="serve Prometheus metrics on this port (default: off)")
    parser.add_argument("--reset", action="store_true",
                        help="DISCARD the model in --state and start a new one: everything it learned (rows, "
                        "weights, optimizer state, histories) and its consumed offsets, so the topic is consumed "
                        "again from the start. The old files move to DIR/discarded-<UTC time>/ (delete them when "
                        "no longer needed); a line says what they held. Without --reset a damaged or incomplete "
                        "state is refused, never replaced")
    parser.add_argument("--connect-timeout", type=float, metavar="SECONDS",
                        help="stop with an error when the broker or the topic cannot be reached at start-up for "
                        f"this long (worker.connect_timeout_s, default: {WorkerConfig.connect_timeout_s:g}); a "
                        "broker lost later is retried until it is back")
    parser.add_argument("--on-lost-offsets", choices=ON_LOST_OFFSETS,
                        help="when stored offsets are past a partition's end or the partition count changed (the "
                        "broker lost records, or the topic was created again): stop with an error (default), or "
                        "read those partitions again from the log's start (worker.on_lost_offsets)")
    _add_group_options(parser)
    parser.set_defaults(func=run)


def _add_group_options(parser: argparse.ArgumentParser) -> None:
    """Several workers, one model (docs/operations.md, "Several workers"); torchrun's
    RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT are read when these are not given."""
    group = parser.add_argument_group("several workers (torch.distributed)")
    group.add_argument("--world-size", type=int, metavar="N", help="workers training this model together")
    group.add_argument("--rank", type=int, metavar="R", help="this worker's rank in [0, N); rank 0 writes")
    group.add_argument("--dist-url", metavar="tcp://HOST:PORT", help="rank 0's address for the process group")
    group.add_argument("--dist-timeout", type=float, default=15.0, metavar="SECONDS",
                       help="a sync waiting longer than this means a dead peer (default: 15)")
    group.add_argument("--sync", choices=("average", "allreduce"),
                       help=f"worker.sync: average the replicas at each checkpoint, or all-reduce the gradients "
                       f"of every step (default: {WorkerConfig.sync})")


def overrides(args: argparse.Namespace) -> list[str]:
    """--set items, then the dedicated flags (which win)."""
    flags = {"worker.bootstrap": args.bootstrap, "worker.group": args.group, "learner.task": args.task,
             "worker.checkpoint_every": args.checkpoint_every, "worker.sync": args.sync,
             "worker.connect_timeout_s": args.connect_timeout, "worker.on_lost_offsets": args.on_lost_offsets}
    return [*args.set, *(f"{key}={value}" for key, value in flags.items() if value is not None)]


def run(args: argparse.Namespace) -> int:
    # torch's C++ warnings (a TCPStore peer closing, in a group's normal stop too) print
    # multi-frame stack traces around the worker's own one-line account; errors still show
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
    signals = _Signals()
    with signals.installed():  # from the start: importing torch and opening the state take seconds
        try:
            worker = _new_worker(args)
        except _StoppedEarly as stopped:
            reached = "".join(f"; {note}" for note in getattr(stopped, "__notes__", ()))  # the topic's look-up
            print(f"streamlearn worker: stopped by {stopped} during start-up (opening the state, or waiting for "
                  f"the topic's first records{reached}): nothing consumed, no checkpoint written", flush=True)
            return 0
        signals.worker = worker
        summary = worker.run()
    print(f"streamlearn worker: {summary}", flush=True)
    from ..compiled_loading import settle
    settle()  # a short run's kernels still loading: numba's cache filled before the process exits
    return 0 if summary.saved else 1


def _new_worker(args: argparse.Namespace) -> Worker:
    cfg, given = run_config(args)
    from ..compiled_loading import in_a_command
    in_a_command()  # the kernels load after the worker's start (consumers.Worker), without numba's BLAS probe
    from ..consumers import RunOptions, Worker  # torch and kafka: only when a worker runs
    from ..consumers.scaleout import GroupWorker

    _check_kafka(cfg)
    options = RunOptions(args.topic, args.state, args.max_records, args.until_idle, args.metrics_port, args.reset,
                         given)
    settings = group_settings(args, cfg)
    return Worker(cfg, options) if settings is None else GroupWorker(cfg, options, settings)


def group_settings(args: argparse.Namespace, cfg: Config):
    """The group's settings (None: a lone worker). A CPU learner's group is gloo's whatever
    GPUs the machine has: NCCL moves CUDA tensors only, so its buffers would travel through a
    CUDA context the rank otherwise never opens."""
    from ..consumers.distributed import dist_settings

    return dist_settings(args.world_size, args.rank, args.dist_url, args.dist_timeout,
                         gpus=0 if cfg.learner.device == "cpu" else None)


def run_config(args: argparse.Namespace) -> tuple[Config, frozenset[str]]:
    """The run's config and the keys the user gave. With no task given, a state that holds
    a model lends its task, so the task's defaults and its keys' rules apply (was: classify's,
    which refused --set model.recent_pairs=1000 for a next-token state)."""
    from ..checkpoint import stored_task

    task = None if args.reset else stored_task(args.state)
    cfg, given = load_config_given(args.config, overrides(args), default_task=task)
    if task is not None and "learner.task" not in given:
        log.info("no task given: %s holds a %s model, so this run is %s", args.state, task, task)
    return cfg, given


def _check_kafka(cfg: Config) -> None:
    """A [kafka] section that cannot connect is a ConfigError now, not a warning repeated by
    the fetch thread's retry loop."""
    cfg.kafka.client_options()


class _StoppedEarly(BaseException):
    """SIGTERM / SIGINT before the worker could take it (its name is the message). A
    BaseException, as KeyboardInterrupt: what it interrupts closes what it opened."""


class _Signals:
    """SIGTERM / SIGINT: before the worker exists (imports, opening the state, a next-item
    model's warm-up window on an empty topic), stop the start-up (:class:`_StoppedEarly`);
    then checkpoint and stop; a second one: stop now (exit 130; the state keeps its last
    checkpoint)."""

    def __init__(self):
        self.worker: Worker | None = None
        self.received: list[int] = []

    def handle(self, signum: int, frame: object) -> None:
        self.received.append(signum)
        name = signal.Signals(signum).name
        if len(self.received) > 1:
            raise KeyboardInterrupt
        if self.worker is None:
            raise _StoppedEarly(name)
        log.info("%s: stopping after a final checkpoint (send it again to stop at once)", name)
        self.worker.stop()

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        previous = {sig: signal.signal(sig, self.handle) for sig in (signal.SIGTERM, signal.SIGINT)}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
