"""What a worker reports: a status line every ``worker.log_seconds`` and Prometheus metrics.

Metric names (all prefixed ``streamlearn_worker_``; counters end in ``_total``):

==============================================  =========================================
``records_total``                               records consumed (learned or dead-lettered)
``records_learned_total``                       valid records learned
``dead_letters_total{reason}``                  records sent to the dead-letter topic
``records_per_second``                          consumption rate over the last interval
``lag_records{partition}``                      end offset - next offset to learn (< 0: records lost)
``loss``                                        training loss, moving average over batches
``prequential_accuracy``                        accuracy before learning, moving average (classify)
``prequential_evaluated_total`` / ``_correct``  evaluated and correct predictions (classify)
``prequential_loss``                            nats per answer before learning, moving average (token tasks)
``prequential_baseline_loss``                   the same for the check's counting baseline (popularity)
``steps_total``                                 optimizer steps
``skipped_steps_total``                         steps not applied: loss or gradient not finite
``records_truncated_total``                     records cut to their first ``hashing.max_tokens`` tokens
``checkpoint_seconds``                          histogram of checkpoint durations
``checkpoint_failures_total``                   checkpoints that failed (state unchanged)
``checkpoints_postponed_total``                 checkpoints put off (dead letters unconfirmed, no answer)
``last_checkpoint_timestamp_seconds``           unix time of the last checkpoint
``broker_errors_total``                         failed polls and end-offset probes
==============================================  =========================================
"""
from __future__ import annotations

import logging
import math
import time
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from ..exceptions import ConfigError
from ..learner import Batch, Learner, StepReport
from ..prequential import ACCURACY, Check, Scores
from .handoff import Prepared

log = logging.getLogger(__name__)

_PREFIX = "streamlearn_worker_"
_SMOOTHING = 0.05  # weight of the newest batch in the moving averages (about 20 batches)
_CHECKPOINT_BUCKETS = (0.01, 0.03, 0.1, 0.3, 1.0, 3.0, 10.0, 30.0)


def prequential_step(learner: Learner, batch: Batch, check: Check) -> tuple[Scores | None, StepReport]:
    """Learn a training batch the worker evaluates: the model's and the counting
    baseline's scores on it, made before learning it (the task's ``check``: a classifier's
    right labels, a token task's loss), and the step's report. Uses the prepared batch,
    so the records are not tokenized and hashed again on the training thread
    (:meth:`Learner.learn_batch_scored <streamlearn.learner.Learner.learn_batch_scored>`)."""
    return learner.learn_batch_scored(batch, check)


class _Average:
    def __init__(self) -> None:
        self.value = math.nan

    def add(self, x: float) -> float:
        self.value = x if math.isnan(self.value) else (1 - _SMOOTHING) * self.value + _SMOOTHING * x
        return self.value


class WorkerMetrics:
    """Counters, moving averages and the Prometheus registry of one worker (its own
    registry, so several workers can live in one process, e.g. in tests).

    ``check`` is the worker's prequential check (:meth:`Task.prequential_check
    <streamlearn.tasks.base.Task.prequential_check>`): its metric says what the status
    line reports, a classifier's accuracy or a token task's loss against its baseline's."""

    def __init__(self, log_seconds: float, registry: CollectorRegistry | None = None, check: Check | None = None,
                 max_tokens: int | None = None):
        self.registry = registry or CollectorRegistry()
        self.log_seconds = log_seconds
        self.check_metric = ACCURACY if check is None else check.metric
        self.baseline = None if check is None else check.baseline
        self._make_metrics()
        self.records = self.learned_records = self.dead_letters = self.skipped_steps = self.skipped_records = 0
        self.truncated = 0  # records cut to hashing.max_tokens tokens (the first cut is logged)
        self.max_tokens = max_tokens
        self.newest_event_ms: int | None = None  # latest event time learned (ms since the epoch)
        self.loss, self.accuracy = _Average(), _Average()
        self.check_loss, self.baseline_loss = _Average(), _Average()  # LOSS checks: nats per answer
        self.checkpoint_s: float | None = None
        self._checkpoint_at: float | None = None
        self._last_line = time.monotonic()
        self._records_at_line = 0
        self._server: Any = None
        self._lag_partitions: set[str] = set()  # the lag series exported (a rebalance takes some away)

    def resume(self, stored: dict | None, committed_at: float | None) -> None:
        """Carry the figures of the state's last checkpoint (its manifest's metrics) into
        this run: the newest event time learned, the moving averages and the last
        checkpoint's time. A restarted worker on an idle topic then reports how old its
        data is, not a fresh model, and its first checkpoint keeps them (not nulls)."""
        stored = stored or {}
        if committed_at:  # alerts read it: the state's last checkpoint, not 0
            self.m_ckpt_time.set(committed_at)
        newest = stored.get("newest_event_ms")
        if isinstance(newest, int) and not isinstance(newest, bool):
            self.newest_event_ms = newest
            self.m_event_lag.set(self.event_lag_s())
        for name, average, gauge in (("loss", self.loss, self.m_loss), ("prequential_accuracy", self.accuracy, self.m_acc),
                                     ("prequential_loss", self.check_loss, self.m_check_loss),
                                     ("prequential_baseline_loss", self.baseline_loss, self.m_baseline_loss)):
            value = stored.get(name)
            if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
                gauge.set(average.add(float(value)))

    def _make_metrics(self) -> None:
        r, p = self.registry, _PREFIX
        self.m_records = Counter(p + "records", "records consumed (learned or dead-lettered)", registry=r)
        self.m_learned = Counter(p + "records_learned", "valid records learned", registry=r)
        self.m_dead = Counter(p + "dead_letters", "records sent to the dead-letter topic", ["reason"], registry=r)
        self.m_rate = Gauge(p + "records_per_second", "records consumed per second (last interval)", registry=r)
        self.m_lag = Gauge(p + "lag_records", "end offset minus next offset to learn", ["partition"], registry=r)
        self.m_loss = Gauge(p + "loss", "training loss (moving average over batches)", registry=r)
        self.m_acc = Gauge(p + "prequential_accuracy", "accuracy before learning (moving average)", registry=r)
        self.m_evaluated = Counter(p + "prequential_evaluated", "records predicted before learning", registry=r)
        self.m_correct = Counter(p + "prequential_correct", "records predicted right before learning", registry=r)
        self.m_check_loss = Gauge(p + "prequential_loss", "nats per answer before learning (token tasks; "
                                  "moving average)", registry=r)
        self.m_baseline_loss = Gauge(p + "prequential_baseline_loss", "nats per answer of the check's counting "
                                     "baseline before learning (token tasks; moving average)", registry=r)
        for gauge in (self.m_loss, self.m_acc, self.m_check_loss, self.m_baseline_loss):
            gauge.set(math.nan)  # no figure yet (and never one where the task's check has another metric), not 0
        self.m_steps = Counter(p + "steps", "optimizer steps", registry=r)
        self.m_skipped = Counter(p + "skipped_steps", "steps not applied: loss or gradient not finite", registry=r)
        self.m_truncated = Counter(p + "records_truncated", "records cut to their first hashing.max_tokens tokens",
                                   registry=r)
        self.m_ckpt = Histogram(p + "checkpoint_seconds", "checkpoint duration", registry=r,
                                buckets=_CHECKPOINT_BUCKETS)
        self.m_ckpt_failed = Counter(p + "checkpoint_failures", "failed checkpoints", registry=r)
        self.m_ckpt_postponed = Counter(p + "checkpoints_postponed", "checkpoints put off: dead letters not confirmed "
                                        "by the broker, or the training loop did not answer", registry=r)
        self.m_ckpt_time = Gauge(p + "last_checkpoint_timestamp_seconds", "unix time of the last checkpoint",
                                 registry=r)
        self.m_event_lag = Gauge(p + "event_time_lag_seconds", "wall clock minus the newest event time learned "
                                 "(record ts, else the Kafka timestamp)", registry=r)
        self.m_event_lag.set(math.nan)  # nothing learned yet: unknown, not fresh
        self.m_broker_errors = Counter(p + "broker_errors", "failed polls and end-offset probes", registry=r)

    def serve(self, port: int) -> None:
        """Expose the metrics over HTTP on ``port`` (0: not at all)."""
        if port:
            try:
                self._server, _ = start_http_server(port, registry=self.registry)
            except OSError as exc:  # the port is taken, or below 1024 without the right
                raise ConfigError(f"--metrics-port {port}: cannot listen there ({exc.strerror or exc}): choose "
                                  "another port, or 0 for none") from exc
            log.info("metrics on http://0.0.0.0:%d/metrics", port)

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    # ---------------------------------------------------------------- events
    def learned(self, item: Prepared, report: StepReport, scores: Scores | None) -> None:
        """Count a learned batch; ``scores``: the prequential check's, where the batch was
        evaluated."""
        self.records += item.records
        self.learned_records += report.learned
        self.m_records.inc(item.records)
        self.m_learned.inc(report.learned)
        for code in item.dead:
            self.m_dead.labels(code).inc()
        if report.truncated:
            if not self.truncated:
                log.warning("records longer than hashing.max_tokens=%s tokens are cut to their first %s (%d in this "
                            "batch); counted in records_truncated_total. A new model with a larger "
                            "hashing.max_tokens keeps more of each record", self.max_tokens, self.max_tokens,
                            report.truncated)
            self.truncated += report.truncated
            self.m_truncated.inc(report.truncated)
        self.dead_letters += len(item.dead)
        if report.skipped:
            self.skipped_steps += 1
            self.skipped_records += report.records
            self.m_skipped.inc()
            self.m_loss.set(math.nan)  # not the last good step's loss: this one was not finite
        elif report.examples:
            self.m_steps.inc()
            self.m_loss.set(self.loss.add(report.loss))
        if item.newest_event_ms is not None:
            self.newest_event_ms = max(self.newest_event_ms or 0, item.newest_event_ms)
            self.m_event_lag.set(self.event_lag_s())
        if scores is None or not scores.examples:
            return
        if scores.hits is not None:
            self.m_evaluated.inc(scores.examples)
            self.m_correct.inc(scores.hits)
            self.m_acc.set(self.accuracy.add(scores.hits / scores.examples))
        else:
            self.m_check_loss.set(self.check_loss.add(scores.model / scores.examples))
            self.m_baseline_loss.set(self.baseline_loss.add(scores.baseline / scores.examples))

    def event_lag_s(self) -> float | None:
        """Seconds from the newest event learned to now (how stale the model's data is)."""
        return None if self.newest_event_ms is None else time.time() - self.newest_event_ms / 1000

    def checkpointed(self, seconds: float, ok: bool) -> None:
        if not ok:
            self.m_ckpt_failed.inc()
            return
        self.checkpoint_s, self._checkpoint_at = seconds, time.monotonic()
        self.m_ckpt.observe(seconds)
        self.m_ckpt_time.set(time.time())

    def broker_error(self) -> None:
        self.m_broker_errors.inc()

    def snapshot(self) -> dict[str, float | None]:
        """The numbers a checkpoint stores in the manifest's metrics."""
        stored = {"loss": _finite(self.loss.value), "prequential_accuracy": _finite(self.accuracy.value),
                  "checkpoint_seconds": self.checkpoint_s, "newest_event_ms": self.newest_event_ms,
                  "skipped_steps": self.skipped_steps}
        if self.check_metric != ACCURACY:
            stored.update(prequential_loss=_finite(self.check_loss.value), prequential_baseline=self.baseline,
                          prequential_baseline_loss=_finite(self.baseline_loss.value))
        return stored

    # ---------------------------------------------------------------- status line
    def status(self, positions: dict[int, int], end_offsets: dict[int, int]) -> str | None:
        """The status line when ``log_seconds`` have passed since the last one, else None."""
        now = time.monotonic()
        elapsed = now - self._last_line
        if elapsed < self.log_seconds:
            return None
        rate = (self.records - self._records_at_line) / elapsed
        self._last_line, self._records_at_line = now, self.records
        self.m_rate.set(rate)
        lag = self._lag(positions, end_offsets)
        ago = "" if self._checkpoint_at is None else f" ({now - self._checkpoint_at:.0f} s ago)"
        ckpt = "none yet" if self.checkpoint_s is None else f"{self.checkpoint_s:.3f} s{ago}"
        event = self.event_lag_s()
        if event is not None:
            self.m_event_lag.set(event)
        return (f"{rate:,.0f} records/s, lag {'?' if lag is None else f'{lag:,}'}, "
                f"event-time lag {'?' if event is None else f'{event:,.1f} s'}, loss {_fmt(self.loss.value)}, "
                f"{self._check_phrase()}, "
                f"dead letters {self.dead_letters}, "
                f"records {self.records:,}, last checkpoint {ckpt}"
                + (f", SKIPPED STEPS {self.skipped_steps} (non-finite loss or gradient)" if self.skipped_steps else ""))

    def _check_phrase(self) -> str:
        """The prequential check's figure: a classifier's accuracy, or a token task's loss
        before learning beside its counting baseline's (lower is better)."""
        if self.check_metric == ACCURACY:
            return f"recent accuracy {_fmt(self.accuracy.value)} (prequential, moving average)"
        return (f"recent loss before learning {_fmt(self.check_loss.value)} nats, {self.baseline} "
                f"{_fmt(self.baseline_loss.value)} (prequential, moving average)")

    def _lag(self, positions: dict[int, int], end_offsets: dict[int, int]) -> int | None:
        """Records behind the ends, summed; never clamped: a negative lag means the log is
        shorter than what was learned (records lost), an error the fetch thread stops on."""
        if not end_offsets:
            return None
        total, negative = 0, {}
        exported = {str(partition) for partition in end_offsets}
        for gone in self._lag_partitions - exported:  # revoked in a rebalance: another worker reports it
            self.m_lag.remove(gone)
        self._lag_partitions = exported
        for partition, end in end_offsets.items():
            lag = end - positions.get(partition, 0)
            self.m_lag.labels(str(partition)).set(lag)
            total += lag
            if lag < 0:
                negative[partition] = lag
        if negative:
            log.error("NEGATIVE lag %s: the log ends before offsets this worker learned; the broker lost "
                      "records or the topic was created again", negative)
        return total


def _finite(x: float) -> float | None:
    return None if math.isnan(x) else x


def _fmt(x: float) -> str:
    return "n/a" if math.isnan(x) else f"{x:.4f}"
