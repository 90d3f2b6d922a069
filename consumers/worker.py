"""The worker: a fetch thread feeding this thread's training loop, checkpointing to LMDB.

::

    fetch thread (Fetcher)                          training loop (Worker.run, this thread)
    poll -> decode -> DLQ bad -> prepare   --->     learn_batch -> counters, metrics, status
            checkpoint due / revoke / stop --->     commit rows + offsets (one LMDB txn)
            advisory Kafka commit          <---     answer

The loop is thin on purpose: it learns what the queue gives it, answers checkpoint
requests, and reports. Everything about Kafka lives in :mod:`.fetcher`, the commit in
:mod:`.checkpoint`, the numbers in :mod:`.metrics`.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Callable

import torch

from ..compiled_loading import learning_meanwhile
from ..broker import topic_problem
from ..config import Config
from ..exceptions import ConfigError, StreamlearnError
from ..device import intra_op_threads
from ..state import open_store
from ..wording import counted
from ..checkpoint import read_live, read_topic_id
from .checkpoint import Checkpointer, open_learner
from .fetcher import Fetcher, FetchPlan
from .handoff import CheckpointRequest, Finished, Handoff, Prepared
from .live import Gauges, LiveHistory
from .metrics import WorkerMetrics, prequential_step
from .warmup import read_window, topic_task

log = logging.getLogger(__name__)

_UNASKED = object()

_JOIN_S = 15.0  # the fetch thread finishes its final checkpoint well before this


class WorkerError(StreamlearnError):
    """The worker stopped on an error (the state holds the last good checkpoint)."""


@dataclass(frozen=True)
class RunOptions:
    """What one run consumes, where its state lives, and when it stops on its own."""

    topic: str
    state: str
    max_records: int | None = None  # stop after this many records (learned or dead-lettered)
    until_idle_s: float | None = None  # stop after this long without a new record
    metrics_port: int = 0  # Prometheus metrics on this port; 0: off
    reset: bool = False  # discard the state in `state` and start a new model (open_store(reset=True))
    # the config keys the user set (config.load_config_given): on a restart the other model keys keep
    # their stored values (open_learner); None: the config is taken whole
    given: frozenset[str] | None = None

    def __post_init__(self) -> None:
        illegal = topic_problem(self.topic) if self.topic else None
        rules = [
            (bool(self.topic), "--topic must not be empty"),
            (illegal is None, f"--topic: {illegal}"),
            (bool(self.state), "--state must not be empty"),
            (self.max_records is None or self.max_records >= 1, f"--max-records must be >= 1, got {self.max_records}"),
            (self.until_idle_s is None or self.until_idle_s > 0,
             f"--until-idle must be > 0 seconds, got {self.until_idle_s}"),
            (0 <= self.metrics_port <= 65535, f"--metrics-port must be in [0, 65535], got {self.metrics_port}"),
        ]
        for ok, message in rules:
            if not ok:
                raise ConfigError(message)


@dataclass
class RunSummary:
    """What a run did. ``saved``: the state holds every record the run consumed."""

    records: int = 0
    learned: int = 0
    dead_letters: int = 0
    skipped: int = 0  # accepted records of steps not applied (a loss or gradient not finite)
    checkpoints: int = 0
    offsets: dict[int, int] = field(default_factory=dict)
    stop_reason: str = ""
    saved: bool = True

    def __str__(self) -> str:
        saved = "all saved" if self.saved else "NOT all saved: they will be consumed again on restart"
        skipped = f", {self.skipped} in SKIPPED STEPS (not learned)" if self.skipped else ""
        return (f"consumed {counted(self.records, 'record')} ({self.learned} learned, {self.dead_letters} dead-lettered"
                f"{skipped}), "
                f"{counted(self.checkpoints, 'checkpoint')}, {saved}; offsets {self.offsets}; stopped: {self.stop_reason}")


class Worker:
    """One consumer worker on ``options.topic`` with its state in ``options.state``.

    ``run()`` blocks until the worker stops (``stop()``, ``max_records``, ``until_idle_s``)
    and returns a :class:`RunSummary`; ``stop()`` may be called from any thread or a
    signal handler. Only one worker can write a state directory at a time.
    """

    def __init__(self, cfg: Config, options: RunOptions):
        self.cfg, self.options = cfg, options  # both validated themselves when built
        self._told_task: str | None | object = _UNASKED  # what the topic's first records say (_topic_task)
        self._open_state()
        self.checkpointer = self._new_checkpointer()
        self.check = self.learner.task.prequential_check()
        self.metrics = WorkerMetrics(cfg.worker.log_seconds, check=self.check, max_tokens=self.learner.cfg.hashing.max_tokens)
        manifest = self.store.manifest()
        self.metrics.resume(manifest.metrics, manifest.committed_at)
        self.handoff = Handoff(cfg.worker.queue_batches)
        plan = FetchPlan(options.topic, self.learner.schedule, options.max_records, options.until_idle_s,
                         assign=cfg.worker.assignment == "manual", steps=self.learner.steps,
                         topic_id=read_topic_id(self.store, options.topic))
        self.fetcher = self._new_fetcher(plan)
        self.checkpointer.topic_id = lambda: self.fetcher.topic_id
        self.live = LiveHistory(read_live(self.store), gauges=self._gauges)
        self.checkpointer.live = self.live  # committed with every checkpoint
        self.summary = RunSummary()
        self._batches = 0
        self._broker_errors = 0
        self._postponed = 0

    # ------------------------------------------------------------------ construction steps
    # A subclass (the group member, .scaleout) overrides the steps that differ.

    def _open_state(self) -> None:
        """Open the state directory for writing (``self.store``) and restore the learner
        from its last checkpoint (``self.learner``); on failure nothing stays open."""
        cfg = self.cfg
        self._ask_before_reset()
        self.store = open_store(self.options.state, cfg.store, reset=self.options.reset)
        try:
            window = lambda: read_window(cfg, self.options.topic, self.options.until_idle_s)  # noqa: E731
            with learning_meanwhile():  # its first records before numba's start-up (streamlearn.compiled_loading)
                self.learner = open_learner(self.store, cfg, window, self.options.given, self._task_asker())
        except BaseException:
            self.store.close()
            raise
        self.cfg = self.learner.cfg  # a derived size is set there (the manifest stores this config)

    def _topic_task(self) -> str | None:
        """A new model's task when the user gave none: the topic's first records say it
        (read once)."""
        if self._told_task is _UNASKED:
            self._told_task = topic_task(self.cfg, self.options.topic)
        return self._told_task

    def _task_asker(self) -> Callable[[], str | None] | None:
        """What tells a new model its task: the topic (:meth:`_topic_task`) where the user
        gave none; None where a task was given, or the config is taken whole (``given`` None)."""
        given = self.options.given
        return self._topic_task if given is not None and "learner.task" not in given else None

    def _ask_before_reset(self) -> None:
        """With ``--reset`` and no task given, the topic's task is asked before the old
        state is moved aside: a topic that raises a question (which token task?) leaves it
        in place (was: moved aside, then the question)."""
        ask = self._task_asker()
        if self.options.reset and ask is not None:
            ask()

    def _new_checkpointer(self) -> Checkpointer:
        """What commits the learner with the consumed offsets into ``self.store``."""
        return Checkpointer(self.store, self.learner, self.options.topic, self.cfg.worker.audit)

    def _new_fetcher(self, plan: FetchPlan, fetcher: type[Fetcher] = Fetcher, **options) -> Fetcher:
        """The fetch thread, of class ``fetcher`` with its extra ``options`` (a group
        member's makes its checkpoints group syncs)."""
        return fetcher(self.learner.prep, self.cfg.worker, plan, self.handoff, self.checkpointer.positions,
                       **options)

    def stop(self) -> None:
        self.fetcher.stop()

    def run(self) -> RunSummary:
        torch.set_num_threads(intra_op_threads(self.cfg))  # this thread is the training loop
        try:
            self.metrics.serve(self.options.metrics_port)
        except BaseException:
            self.store.close()  # nothing else started yet
            raise
        log.info("worker on %r: state %s at offsets %s (%d commits so far)", self.options.topic,
                 self.options.state, self.checkpointer.positions or "none", self.checkpointer.commits)
        others = self._other_topics()
        if others:
            log.warning("the model in %s was trained on topic(s) %s, never on %r: this run goes on training it on "
                        "another stream (for a new model: a new --state, or --reset)", self.options.state,
                        ", ".join(map(repr, others)), self.options.topic)
        self.fetcher.start()
        try:
            finished = self._loop()
        finally:
            self.handoff.close()
            self.fetcher.stop()
            self.fetcher.join(_JOIN_S)
            self.metrics.close()
            self.store.close()
        return self._summarize(finished)

    def _other_topics(self) -> list[str]:
        """The topics the state holds offsets of, when it holds none of this run's topic
        (a --topic typo that names another real topic trains the model on that stream)."""
        if self.checkpointer.positions:
            return []
        return sorted({key.rpartition(":")[0] for key in self.store.manifest().offsets})

    # ------------------------------------------------------------------ the loop
    def _loop(self) -> Finished:
        while True:
            item = self.handoff.get(timeout_s=0.25)
            if isinstance(item, Prepared):
                self._learn(item)
            elif isinstance(item, CheckpointRequest):
                self._checkpoint(item)
            elif isinstance(item, Finished):
                return item
            self._report()

    def _learn(self, item: Prepared) -> None:
        every = self.cfg.worker.eval_every
        evaluate = every and self._batches % every == 0
        if evaluate:
            scores, report = prequential_step(self.learner, item.batch, self.check)
        else:
            scores, report = None, self.learner.learn_batch(item.batch)
        self.check.learn(item.batch)
        if report.learned and not self.metrics.learned_records:  # bench/startup.py reads its time
            log.info("first records learned (%d)", report.learned)
        self._batches += 1
        hits = None if scores is None else scores.hits
        evaluated = report.examples if hits is not None else 0
        self.checkpointer.note(item, report.learned, evaluated, hits or 0)
        self.metrics.learned(item, report, scores)
        self.live.learned(item, report, scores, self.check.baseline)

    def _checkpoint(self, request: CheckpointRequest) -> None:
        ok, seconds = True, 0.0
        try:
            seconds = self.checkpointer.commit(self.metrics.snapshot(), self.cfg)
        except StreamlearnError as exc:
            ok = False
            log.error("%s checkpoint failed, the state is unchanged (the next one writes its %d rows again, "
                      "with what changes meanwhile): %s", request.reason, self.checkpointer.last_rows, exc)
        self.metrics.checkpointed(seconds, ok)
        if ok:
            self.summary.checkpoints += 1
            level = logging.DEBUG if request.reason == "interval" else logging.INFO
            log.log(level, "%s checkpoint: step %d, offsets %s, %.3f s", request.reason, self.learner.steps,
                    self.checkpointer.positions, seconds)
        request.answer(ok, self.checkpointer.positions, seconds)

    def _report(self) -> None:
        errors, postponed = self.fetcher.broker_errors, self.fetcher.postponed
        if errors > self._broker_errors:
            self.metrics.m_broker_errors.inc(errors - self._broker_errors)
            self._broker_errors = errors
        if postponed > self._postponed:
            self.metrics.m_ckpt_postponed.inc(postponed - self._postponed)
            self._postponed = postponed
        line = self.metrics.status(self.checkpointer.positions, self.fetcher.end_offsets)
        if line:
            log.info("%s: %s", self.options.topic, line)
        self.live.tick()

    def _gauges(self) -> Gauges:
        """The live history's gauges now: stream position, steps, lag, event-time lag."""
        c = self.checkpointer
        lag = {p: end - c.positions.get(p, 0) for p, end in self.fetcher.end_offsets.items()}
        return Gauges(sum(c.applied.values()), self.learner.steps, lag, self.metrics.event_lag_s())

    def _summarize(self, finished: Finished) -> RunSummary:
        s, m = self.summary, self.metrics
        s.records, s.learned, s.dead_letters, s.skipped = m.records, m.learned_records, m.dead_letters, m.skipped_records
        s.offsets, s.stop_reason = dict(self.checkpointer.positions), finished.reason
        s.saved = self.fetcher.final_ok is not False and finished.error is None
        kept = ("the state keeps its last checkpoint" if self.checkpointer.commits
                else "the state holds no checkpoint yet")
        if isinstance(finished.error, StreamlearnError):  # already says what to change
            raise WorkerError(f"{finished.error} ({kept})") from finished.error
        if finished.error is not None:
            raise WorkerError(f"the fetch thread failed: {finished.error!r}; {kept}") from finished.error
        log.info("worker stopped (%s): %s", finished.reason, s)
        return s
