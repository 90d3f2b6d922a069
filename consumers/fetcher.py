"""The fetch thread: poll -> decode -> dead-letter the bad -> prepare -> hand over.

It owns every Kafka client of the worker (kafka-python clients are not thread-safe), so
the training loop never waits on Kafka while prepared batches are queued. It also decides
when to checkpoint (every ``worker.checkpoint_every`` records or
``worker.checkpoint_seconds``, on partition revocation, at shutdown) and asks the training
loop for one through the :class:`~streamlearn.consumers.handoff.Handoff` (see
:mod:`streamlearn.consumers.checkpoint` for the commit order).

Start-up (:meth:`Fetcher._connect`, bounded by ``worker.connect_timeout_s``): look up
the topic (a missing one is an error naming it, never created), set up the dead-letter
topic and the clients, read the topic's first and end offsets, and check the stored
offsets against them (:mod:`.positions`: a log that lost records stops the worker). Then
``plan.assign`` (a lone worker) assigns every partition at once, with no group join to
wait for; otherwise the consumer joins ``worker.group`` and Kafka shares the partitions.
Two lone workers cannot write one state: its writer lock refuses the second.

Positions: ``positions`` maps each partition to the next offset to prepare. It starts
from the checkpoint's offsets (the log's start for a partition the state has never
seen) and on every assignment the consumer is sought to it; Kafka's committed offsets
are never used. Every partition's start goes to the training loop at once (an empty
batch), so the next checkpoint records an offset for each partition of the topic, and
with them its partition count. Records fetched but not yet prepared are dropped on
reassignment and fetched again after the seek. While it runs the fetch thread checks
that no log went below its position (the probe's end offsets, records served below
it, the partition count): if one did, it checkpoints what it learned and stops.

Rebalance callbacks run on kafka-python's IO thread while this thread is blocked inside
``poll()`` (or ``close()``), so the two never touch the fetcher's state at once.
"""
from __future__ import annotations

import logging
import threading
import time
import dataclasses
from dataclasses import dataclass
from typing import Any

from kafka import ConsumerRebalanceListener

from ..config import WorkerConfig
from ..batching import Preparer, Schedule
from ..broker import create_topic, describe_topic
from ..records import Record, decode_many, reason_code
from . import positions as logs
from .connect import Backoff, StartUp, close_quietly, new_consumer, new_producer, topic_log
from .dlq import DeadLetters
from .handoff import CheckpointRequest, Finished, Handoff, Prepared
from .positions import Mismatch, OffsetsLostError, TopicLog

log = logging.getLogger(__name__)

_CHECKPOINT_WAIT_S = 120.0  # bound on waiting for the training loop to commit
_DLQ_FLUSH_S = 5.0
_PROBE_TIMEOUT_MS = 1_000
_COMMIT_TIMEOUT_MS = 2_000
FUTURE_TS_TOLERANCE_S = 86_400.0  # event times beyond now + this do not count for the event-time lag


@dataclass(frozen=True)
class FetchPlan:
    """What the fetch thread reads and when it stops on its own.

    ``max_records``: stop after this many records (learned or dead-lettered);
    ``until_idle_s``: stop when no record arrived for this long after the assignment;
    ``assign``: read every partition without joining the consumer group (only where no
    other worker can share the topic: a lone worker; its state's writer lock fences it);
    ``schedule``: the model's batch sizes by step (:attr:`Learner.schedule
    <streamlearn.learner.Learner.schedule>`), from ``steps``, its steps before this run.
    """

    topic: str
    schedule: Schedule
    max_records: int | None = None
    until_idle_s: float | None = None
    assign: bool = False
    steps: int = 0
    topic_id: str | None = None  # the topic's id the state stored (None: none yet)


class Fetcher(threading.Thread):
    """The fetch/decode/prepare thread of one worker (see the module docstring).

    Read by the training loop: ``end_offsets`` (partition -> end offset, refreshed every
    ``worker.log_seconds``), ``broker_errors``, ``consumed``, ``stop_reason`` and
    ``final_ok`` (None: nothing was left to checkpoint at the end; else whether the final
    checkpoint succeeded).
    """

    def __init__(self, prep: Preparer, cfg: WorkerConfig, plan: FetchPlan, handoff: Handoff,
                 positions: dict[int, int]):
        super().__init__(name=f"fetch-{plan.topic}", daemon=True)
        # The learner's ingest half only (numpy): this thread never touches the model.
        self.prep, self.cfg, self.plan, self.handoff = prep, cfg, plan, handoff
        self.positions = dict(positions)
        self.end_offsets: dict[int, int] = {}
        self.broker_errors = 0
        self.postponed = 0  # checkpoints put off
        self.topic_id = plan.topic_id  # the broker's id of the topic, once connected
        self._broker_down = False  # the last probe of the log ends failed
        self._probed_at = 0.0  # monotonic time of the last probe
        self.consumed = 0  # records prepared (learned or dead-lettered) by this process
        self.stop_reason = ""
        self.final_ok: bool | None = None
        self._stopping = threading.Event()
        self._consumer: Any = None
        self._dlq: DeadLetters | None = None
        self._buffer: list[Any] = []  # fetched, not yet prepared
        self._buffered_at = 0.0
        self._emitted = 0  # mini-batches prepared in this run (Schedule.size)
        self._unsaved = 0  # records prepared since the last checkpoint
        self._saved_at = time.monotonic()
        self._retry_at = 0.0  # after a failed checkpoint: not before this time
        self._idle_since: float | None = None  # set once partitions are assigned
        self._probe_at = 0.0
        self._closing = False
        self._backoff = Backoff(cfg.retry_max_s)
        self._partitions = 0  # the topic's partition count at start-up
        self._dead_codes: set[tuple[str, str]] = set()  # (reason code, hint) already logged once

    @property
    def dlq_topic(self) -> str:
        return self.plan.topic + self.cfg.dlq_suffix

    def stop(self) -> None:
        """Ask the thread to checkpoint what it prepared and finish (returns at once)."""
        self._stopping.set()

    # ------------------------------------------------------------------ lifecycle
    def run(self) -> None:
        error: BaseException | None = None
        try:
            self.stop_reason = self._run()
        except BaseException as exc:  # handed to the training loop, which re-raises it
            error = exc
            self.stop_reason = f"error: {exc!r}"
        finally:
            self._close()
            self.handoff.put(Finished(error, self.stop_reason))

    def _run(self) -> str:
        startup = StartUp(self.cfg, self._stopping)
        if not self._connect(startup):
            return f"stopped during start-up, before reading {self.plan.topic!r} ({startup.failure or 'nothing tried yet'})"
        try:
            while (reason := self._why_stop()) is None:
                self._cycle()
        except OffsetsLostError:
            self._final_checkpoint()  # what was learned from the old log is kept
            raise
        self._final_checkpoint()
        return reason

    def _final_checkpoint(self) -> None:
        if self._unsaved and not self.handoff.closed:
            self.final_ok = self.checkpoint("shutdown", blocking_commit=True)

    def _connect(self, startup: StartUp) -> bool:
        """Start-up, each step retried within ``worker.connect_timeout_s`` (see the module
        docstring); False when asked to stop first."""
        cfg, topic, security = self.cfg, self.plan.topic, self.prep.cfg.kafka
        wait = startup.wait_s  # each attempt waits on the broker within what is left of start-up
        described = startup.step(f"looking up topic {topic!r}",
                                 lambda: describe_topic(cfg.bootstrap, topic, wait(10.0), security))
        partitions, topic_id = described or (0, None)
        dlq = partitions and startup.step(f"setting up dead-letter topic {self.dlq_topic!r}",
                                          lambda: create_topic(cfg.bootstrap, self.dlq_topic, partitions, wait(10.0),
                                                               security))
        producer = dlq and startup.step("connecting the dead-letter producer",
                                        lambda: new_producer(cfg, security, wait(5.0)))
        if not producer:
            return False
        self._dlq = DeadLetters(producer, self.dlq_topic, dlq, cfg.dlq_max_bytes)
        self._consumer = startup.step("connecting the consumer", lambda: new_consumer(cfg, security, wait(5.0)))
        found = self._consumer and startup.step(f"reading the offsets of {topic!r}",
                                                lambda: topic_log(self._consumer, topic, partitions, self.positions))
        if not found:
            return False
        self._start_from(dataclasses.replace(found, topic_id=topic_id))
        if self.plan.assign:
            self._assign_all()
        else:
            self._consumer.subscribe([topic], listener=_Rebalance(self))
            log.info("joining group %r on %s for topic %r", cfg.group, cfg.bootstrap, topic)
        return True

    def _assign_all(self) -> None:
        from kafka import TopicPartition

        tps = [TopicPartition(self.plan.topic, p) for p in range(self._partitions)]
        self._consumer.assign(tps)
        log.info("reading all %d partitions of %r on %s (worker.assignment=manual: no group join)",
                 self._partitions, self.plan.topic, self.cfg.bootstrap)
        self.on_assigned(tps)

    def _start_from(self, found: TopicLog) -> None:
        """Check the stored offsets against the log (stop, or restart the partitions that
        lost theirs), then hand every partition's start to the training loop."""
        stored = dict(self.positions)
        mismatch = logs.compare(stored, found, self.plan.topic_id)
        self.topic_id = found.topic_id  # the checkpoints store it from now on
        restart: list[int] = []
        if mismatch is not None:
            if self.cfg.on_lost_offsets != logs.RESTART:
                raise mismatch.error()
            restart = mismatch.restart()
            log.error("%s. worker.on_lost_offsets=%s: reading partitions %s again from the log's start; the "
                      "model keeps what it learned from the old log", mismatch.describe(), logs.RESTART, restart)
        for p, (offset, first) in logs.deleted(stored, found).items():
            log.warning("partition %d of %r: retention deleted offsets %d to %d before they were learned; "
                        "reading on from %d", p, found.topic, offset, first - 1, first)
        self.positions = logs.starts(stored, found, restart)
        self._partitions = found.partitions
        spans = {p: (offset, offset - 1, 0) for p, offset in self.positions.items()}
        self.handoff.put(Prepared(self.prep.train([]), spans))
        if mismatch is not None:
            self._unsaved = max(self._unsaved, 1)  # the new offsets reach the state now, records or not
            self.checkpoint(logs.RESTART)

    def _close(self) -> None:
        self._closing = True  # the close-time revocation needs no checkpoint: it is done
        if self._consumer is not None:
            close_quietly(lambda: self._consumer.close(autocommit=False, timeout_ms=_COMMIT_TIMEOUT_MS), "consumer")
        if self._dlq is not None:
            if self._dlq.pending:
                log.error("%d dead letters were not confirmed; the records they belong to are after the "
                          "last checkpoint and will be consumed (and dead-lettered) again", self._dlq.pending)
            close_quietly(self._dlq.close, "dead-letter producer")

    def _why_stop(self) -> str | None:
        plan, now = self.plan, time.monotonic()
        if self._stopping.is_set():
            return "stop requested"
        if self.handoff.closed:
            return "training loop stopped"
        if plan.max_records is not None and self.consumed >= plan.max_records:
            return f"{plan.max_records} records consumed (--max-records)"
        idle = self._idle_since is not None and not self._buffer and now - self._idle_since
        # A broker that stops answering is an outage, not the stream's end: no idle stop
        # while it lasts, and the idle time counts again from its end (was: --until-idle
        # ended the run with exit 0 and thousands of records unread)
        if (plan.until_idle_s is not None and idle and idle >= plan.until_idle_s and self._reachable_now()
                and self._may_stop_idle()):
            return f"no new record for {plan.until_idle_s:g} s (--until-idle)"
        return None

    def _reachable_now(self) -> bool:
        """The broker answered a probe of the log ends within the last second (one is made
        now if not): the last scheduled probe, up to ``worker.log_seconds`` old, may predate
        an outage."""
        if time.monotonic() - self._probed_at > 1.0:
            self._probe_at = 0.0
            self._probe()
        return not self._broker_down

    def _may_stop_idle(self) -> bool:
        """Whether a stream idle for ``--until-idle`` has really ended (a group member asks
        whether partitions are still on their way to it)."""
        return True

    def unassigned(self) -> list[int]:
        """The topic's partitions this worker does not hold now, ascending (fetch thread only)."""
        held = {tp.partition for tp in self._consumer.assignment()}
        return [p for p in range(self._partitions) if p not in held]

    # ------------------------------------------------------------------ one cycle
    def _cycle(self) -> None:
        if self._checkpoint_due():
            self.checkpoint("interval")
        self._probe()
        messages = self._poll()
        now = time.monotonic()
        if messages:
            self._idle_since = now
            if not self._buffer:
                self._buffered_at = now
            self._buffer.extend(messages)
        lingered = now - self._buffered_at >= self.cfg.poll_timeout_ms / 1000
        self._emit(flush=not messages or lingered)

    def _checkpoint_due(self) -> bool:
        now, cfg = time.monotonic(), self.cfg
        if not self._unsaved or now < self._retry_at:
            return False
        return self._unsaved >= cfg.checkpoint_every or now - self._saved_at >= cfg.checkpoint_seconds

    def _poll(self) -> list[Any]:
        from kafka.errors import KafkaError

        try:
            polled = self._consumer.poll(timeout_ms=self.cfg.poll_timeout_ms)
        except KafkaError as exc:
            self.broker_errors += 1
            delay = self._backoff.next()
            log.warning("poll failed (%s); retrying in %.1f s", exc, delay)
            self._stopping.wait(delay)
            return []
        self._backoff.reset()
        if polled:  # the ends cover every record handed on, so the learned lag never reads < 0
            ends = {tp.partition: max(self.end_offsets.get(tp.partition, 0), self._consumer.highwater(tp) or 0,
                                      records[-1].offset + 1) for tp, records in polled.items()}
            self.end_offsets = {**self.end_offsets, **ends}  # one rebinding: the training loop reads it
        return [m for records in polled.values() for m in records]

    def _probe(self) -> None:
        """Refresh ``end_offsets`` (lag) every ``log_seconds``; log an unreachable broker."""
        from kafka.errors import KafkaError

        now = time.monotonic()
        assigned = self._consumer.assignment()
        if now < self._probe_at or not assigned:
            return
        self._probe_at, self._probed_at = now + self.cfg.log_seconds, now
        try:
            ends = self._consumer.end_offsets(list(assigned), timeout_ms=_PROBE_TIMEOUT_MS)
        except KafkaError as exc:
            self.broker_errors += 1
            self._broker_down = True
            log.warning("broker %s unreachable (%s); the client reconnects with backoff up to %g s, "
                        "nothing is lost meanwhile", self.cfg.bootstrap, type(exc).__name__, self.cfg.retry_max_s)
            return
        if self._broker_down:
            self._broker_down = False
            if self._idle_since is not None:
                self._idle_since = now  # the outage was no idle time: read what came meanwhile
            log.info("broker %s answers again", self.cfg.bootstrap)
        # A fetch response's high watermark is exact where a broker's ListOffsets is not
        # (Tansu 0.6: the last batch's base offset + 1; see connect.topic_log): only a
        # partition fetched since its assignment can be checked. Until then its end is
        # taken as no less than what this worker has read (a lag of 0, not a negative one
        # that reads as lost records).
        fetched = {tp.partition: (max(offset, self._consumer.highwater(tp)))
                   for tp, offset in ends.items() if self._consumer.highwater(tp) is not None}
        self.end_offsets = {**{tp.partition: max(offset, self.positions.get(tp.partition, 0))
                               for tp, offset in ends.items()}, **fetched}
        self._check_log(fetched)

    def _check_log(self, ends: dict[int, int]) -> None:
        """Stop if a log's exact end went below what this worker read, or the partition
        count changed (Kafka logs only grow: the broker lost records, or the topic was
        created again)."""
        from kafka.errors import KafkaError

        beyond = {p: (self.positions[p], end) for p, end in ends.items() if self.positions.get(p, 0) > end}
        try:
            known = self._consumer.partitions_for_topic(self.plan.topic)  # cached metadata, refreshed by the client
        except KafkaError:
            known = None  # no answer now: the next probe asks again
        count = len(known) if known else self._partitions
        if beyond or count != self._partitions:
            raise Mismatch(self.plan.topic, beyond, self._partitions, count).error(" while the worker ran")

    # ------------------------------------------------------------------ preparing
    def _emit(self, flush: bool) -> None:
        size = self._next_size()
        while self._buffer and (flush or len(self._buffer) >= size) and self._why_stop() is None:
            take = size
            if self.plan.max_records is not None:
                take = min(take, self.plan.max_records - self.consumed)
            chunk, self._buffer = self._buffer[:take], self._buffer[take:]
            self._buffered_at = time.monotonic()
            self._prepare(chunk)
            self._emitted += 1
            size = self._next_size()
            if self._checkpoint_due():
                self.checkpoint("interval")

    def _next_size(self) -> int:
        """Records in the next mini-batch (:meth:`~streamlearn.batching.Schedule.size`)."""
        return self.plan.schedule.size(self.plan.steps + self._emitted)

    def _prepare(self, chunk: list[Any]) -> None:
        spans = _spans(chunk)
        self._check_order(spans)
        decoded, errors = decode_many([m.value for m in chunk], self.cfg.max_record_bytes)
        records = [_with_event_time(record, chunk[i]) for i, record in decoded]
        batch = self.prep.train(records)
        rejected = [(decoded[j][0], str(exc)) for j, exc in batch.rejected]
        # source order: decoding and the learner reject at different stages
        dead = [self._dead_letter(chunk[i], reason) for i, reason in sorted(errors + rejected)]
        for partition, (_, last, _) in spans.items():
            self.positions[partition] = last + 1
        self.consumed += len(chunk)
        self._unsaved += len(chunk)
        # A timestamp far in the future (a producer's bad clock, ts = 2^63 - 1) would pin
        # the event-time lag at a huge negative value for the rest of the run: not counted.
        # Only records the learner takes: a dead letter without a ts carries its Kafka
        # timestamp (about now), which would read as a fresh model.
        horizon = int((time.time() + FUTURE_TS_TOLERANCE_S) * 1000)
        refused = {j for j, _ in batch.rejected}
        times = [r.ts for j, r in enumerate(records) if j not in refused and r.ts is not None and r.ts <= horizon]
        self.handoff.put(Prepared(batch, spans, dead, max(times) if times else None))
        self._idle_since = time.monotonic()  # waiting for queue space is not idleness

    def _check_order(self, spans: dict[int, tuple[int, int, int]]) -> None:
        """A record below the position means the client went back on its own (Kafka
        answered "offset out of range" for a position past the log's end, and the client
        reset to the earliest offset): the log lost records, stop before learning any."""
        back = {p: (self.positions[p], first) for p, (first, _, _) in spans.items()
                if first < self.positions.get(p, first)}
        if back:
            each = ", ".join(f"partition {p} served offset {first:,} after offset {at - 1:,} was read"
                             for p, (at, first) in sorted(back.items()))
            raise OffsetsLostError(f"topic {self.plan.topic!r}: {each}: the broker's log went back below what this "
                                   "worker read (records were lost, or the topic was created again). Refusing to "
                                   f"go on; restart with --on-lost-offsets {logs.RESTART} to read those partitions "
                                   "again from the log's start")

    def _dead_letter(self, message: Any, reason: str) -> str:
        self._dlq.send(message, reason)
        code, hint = reason_code(reason), _hint(reason)
        if (code, hint) not in self._dead_codes:  # the first of each reason says why; the rest are counted
            self._dead_codes.add((code, hint))
            log.warning("dead-lettered partition %s offset %s to %r: %s%s (later records with reason %r go there "
                        "too without a line; dead_letters_total counts them)", message.partition, message.offset,
                        self.dlq_topic, reason, hint, code)
        return code

    # ------------------------------------------------------------------ checkpoints
    def checkpoint(self, reason: str, blocking_commit: bool = False, kafka_commit: bool = True) -> bool:
        """Have the training loop checkpoint everything prepared so far, then commit the
        offsets to Kafka (advisory). Returns True if the state holds everything prepared."""
        if not self._unsaved:
            return True
        if not self._dlq.flush(_DLQ_FLUSH_S):
            return self._postpone(reason, f"{self._dlq.pending} dead letters not confirmed by the broker")
        request = CheckpointRequest(reason)
        if not (self.handoff.put(request) and self.handoff.wait(request, _CHECKPOINT_WAIT_S)):
            return self._postpone(reason, "the training loop did not answer")
        if not request.ok:
            return self._postpone(reason, "the commit failed (see above)")
        self._unsaved, self._saved_at = 0, time.monotonic()
        if kafka_commit:
            self._commit_kafka(request.offsets, blocking_commit)
        return True

    def _postpone(self, reason: str, why: str) -> bool:
        self.postponed += 1  # read by the training loop (checkpoints_postponed_total)
        delay = self._backoff.next()
        self._retry_at = time.monotonic() + delay
        log.warning("%s checkpoint postponed: %s; retrying in %.1f s", reason, why, delay)
        return False

    def _commit_kafka(self, offsets: dict[int, int], blocking: bool) -> None:
        """Advisory: lets lag monitors and other tools see our progress; never read back."""
        from kafka.errors import KafkaError
        from kafka.structs import OffsetAndMetadata

        assigned = self._consumer.assignment()
        commit = {tp: OffsetAndMetadata(offsets[tp.partition], "", -1)
                  for tp in assigned if tp.partition in offsets}
        if not commit:
            return
        try:
            if blocking:
                self._consumer.commit(commit, timeout_ms=_COMMIT_TIMEOUT_MS)
            else:
                self._consumer.commit_async(commit, callback=_log_commit)
        except KafkaError as exc:
            log.info("advisory Kafka offset commit failed (%s); the checkpoint is what counts", exc)

    # ------------------------------------------------------------------ rebalance (IO thread)
    def on_revoked(self, partitions: Any, lost: bool = False) -> None:
        if self._closing:
            return
        log.info("partitions %s %s: checkpointing first", _names(partitions), "lost" if lost else "revoked")
        self.checkpoint("lost" if lost else "revoke", kafka_commit=not lost)

    def on_assigned(self, partitions: Any) -> None:
        self._buffer.clear()
        self._broker_down = False  # the group's coordinator answered (none assigned: no probe would clear it)
        for tp in partitions:
            position = self.positions.get(tp.partition)
            if position is None:
                self._consumer.seek_to_beginning(tp)
            else:
                self._consumer.seek(tp, position)
        self._idle_since = time.monotonic()
        self._probe_at = 0.0  # check the new partitions' logs on the next cycle
        where = {tp.partition: self.positions.get(tp.partition, "beginning") for tp in partitions}
        log.info("assigned partitions %s of %r; seeking to the checkpoint's offsets %s",
                 _names(partitions), self.plan.topic, where)


class _Rebalance(ConsumerRebalanceListener):
    def __init__(self, fetcher: Fetcher):
        self.fetcher = fetcher

    def on_partitions_revoked(self, revoked: Any) -> None:
        if revoked:
            self.fetcher.on_revoked(revoked)

    def on_partitions_lost(self, lost: Any) -> None:
        if lost:
            self.fetcher.on_revoked(lost, lost=True)

    def on_partitions_assigned(self, assigned: Any) -> None:
        self.fetcher.on_assigned(assigned)


def _with_event_time(record: Record, message: Any) -> Record:
    """``record`` with ``ts`` from its Kafka message when it carries none (records.py's
    contract: event time defaults to the Kafka timestamp; -1 means the broker gave none)."""
    if record.ts is not None or getattr(message, "timestamp", None) is None or message.timestamp < 0:
        return record
    return dataclasses.replace(record, ts=int(message.timestamp))


def _hint(reason: str) -> str:
    """What to change when a reason says the worker runs the wrong task for the stream
    (a classify model started before its topic held a record takes no task from it).

    >>> _hint("missing-field: text or tokens (task classify)")[:60]
    '; if the records are events (a key and an item), run the wor'
    """
    if reason.startswith("missing-field: label (task classify)"):
        return ("; if the topic is running text (a token stream), run the worker with --task next-token or "
                "--task mlm on a new --state directory")
    if reason.startswith("missing-field: text or tokens (task classify)"):
        return ("; if the records are events (a key and an item), run the worker with --task next-item on a new "
                "--state directory")
    return ""


def _spans(chunk: list[Any]) -> dict[int, tuple[int, int, int]]:
    """Per partition: (first offset, last offset, records) of a chunk in fetch order."""
    spans: dict[int, list[int]] = {}
    for m in chunk:
        span = spans.get(m.partition)
        if span is None:
            spans[m.partition] = [m.offset, m.offset, 1]
        else:
            span[1], span[2] = m.offset, span[2] + 1
    return {p: (first, last, n) for p, (first, last, n) in spans.items()}


def _names(partitions: Any) -> str:
    return "[" + ", ".join(str(tp.partition) for tp in sorted(partitions)) + "]"


def _log_commit(offsets: Any, response: Any) -> None:
    if isinstance(response, Exception):
        log.info("advisory Kafka offset commit failed (%s); the checkpoint is what counts", response)
