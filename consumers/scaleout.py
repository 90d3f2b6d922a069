"""Several workers in one consumer group training one model (``streamlearn worker --world-size``).

Kafka's group protocol shares the partitions; torch.distributed keeps the replicas one
model; one designated writer commits (see docs/operations.md, "Several workers").

Syncs. Every checkpoint of a group member is a group sync: whoever wants one (its
checkpoint interval, a partition revocation, its shutdown) bumps the counter
``sync.want`` in the group's TCPStore from ``done`` to ``done + 1`` (compare-and-set, so
simultaneous wishes make one sync); every fetch thread sees the counter ahead of its
``done`` on its next cycle and hands its training loop a checkpoint request, after the
batches it already queued. Each training loop then, in the same order on every rank:

1. averages the replicas (:func:`~.distributed.average_replicas`);
2. gathers every rank's offsets, records applied, totals and audit ranges; per
   partition the furthest offset wins (only the rank that consumed a partition since the
   last sync moved it; a revocation is itself a sync, so two ranks never both did);
3. the writer (rank 0 while the group lives) commits the averaged model with the merged
   offsets in one fenced LMDB commit; every rank learns whether it succeeded.

Exactly-once across the group: a rank's records since the last sync are either in the
committed averaged model together with their offsets, or neither.

``worker.sync = "allreduce"``: between syncs the training loops run lock-step rounds
(:mod:`.allreduce`): every rank enters every round, with its next batch or without one
(its queue is empty, it waits for the sync, its stream ended), and every rank takes the
same step from the mean gradient. A sync is the round in which every rank's next item is
the checkpoint request; step 1 above is then only the label table (the replicas are
equal already). A rank whose stream ended says so in its round, and the others go on
alone at once instead of failing on the next collective.

Ending idle (``--until-idle``). A rank idle that long asks for a sync, and in every
sync each rank says whether it has been idle that long (a rank still reading says no, and
the asker does not ask again in the same idle spell: the reader asks once it is idle).
When every rank was idle at one sync, that sync is the group's last: each rank stops
after it, and the group ends together instead of one rank stopping first and the others
finding it gone at their next collective.

Failure. A collective that fails or times out (``--dist-timeout``) means a peer died or
hangs. The survivor leaves the group and goes on alone with the next group generation:
its model is the last sync's average plus its own records since, its offsets the last
sync's plus its own, so its next commit is consistent; if it was not the writer it takes
the state directory's writer lock and writes every row once. Kafka's rebalance (after
``worker.session_timeout_ms``) then hands it the dead worker's partitions, and it seeks
them to the last sync's offsets. The dead worker's records since that sync were in
neither the state nor the offsets, so they are consumed again, once. (allreduce: the
survivor's model already holds the dead worker's gradients since that sync, so those
records count twice in the model; the offsets and the audit stay exactly-once.)
"""
from __future__ import annotations

import concurrent.futures
import dataclasses
import logging
import queue
import threading
import time

import torch.distributed as dist

from ..compiled_loading import learning_meanwhile
from ..config import Config, model_changes, retasked
from ..exceptions import ConfigError, StreamlearnError
from ..state import open_store
from ..tasks import REGISTRY, task_class
from .allreduce import GradientExchange, Round
from .checkpoint import Checkpointer, open_learner, topic_offsets
from .distributed import (DistributedError, DistSettings, Group, average_replicas, fenced_commit,
                          stored_generation)
from .fetcher import Fetcher, FetchPlan
from .handoff import CheckpointRequest, Finished, Item, Prepared
from .worker import RunOptions, RunSummary, Worker, WorkerError

log = logging.getLogger(__name__)

_WANT = "sync.want"


class SyncClock:
    """Which group sync comes next. ``done`` is advanced by the training loop only; the
    fetch thread reads it while the loop is idle (it waits for the loop's answer).

    The group's store lives in rank 0. A rank 0 that hangs (stopped, a long pause, a
    network partition) keeps its connections open, and TCPStore's calls then wait past
    their own timeout, for good: each call here runs in a daemon thread and is given up
    after ``timeout_s`` (``--dist-timeout``), as a RuntimeError the fetch thread answers
    with a checkpoint, whose sync then finds the peer gone."""

    def __init__(self, store, timeout_s: float):
        self.store, self.timeout_s = store, timeout_s
        self.done = 0
        self.group_idle = False  # every rank was idle for --until-idle at the last sync: stop
        self.alive = True
        self.alone_since = 0.0  # monotonic time the group broke up (once not alive)
        self._calls: queue.SimpleQueue = queue.SimpleQueue()
        self._hung = False  # a call was given up: the next ones would queue behind it
        self.thread = threading.Thread(target=self._serve, name="group-store", daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            item = self._calls.get()
            if item is None:  # end(): the group is gone
                return
            call, args, answer = item
            try:
                answer.set_result(call(*args))
            except BaseException as exc:  # handed to the caller
                answer.set_exception(exc)

    def _ask(self, call, *args):
        if self._hung:
            raise RuntimeError("the group's store on rank 0 stopped answering")
        answer: concurrent.futures.Future = concurrent.futures.Future()
        self._calls.put((call, args, answer))
        try:
            return answer.result(timeout=self.timeout_s)
        except concurrent.futures.TimeoutError:
            self._hung = True
            raise RuntimeError(f"the group's store on rank 0 did not answer in {self.timeout_s:g} s "
                               "(--dist-timeout)") from None

    def end(self) -> None:
        """The group broke up: no more syncs; this rank goes on alone."""
        self.alive = False
        self.alone_since = time.monotonic()
        self._calls.put(None)  # the store thread ends (once a hung call returns, if one does)

    def wanted(self) -> int:
        """Syncs requested so far by any rank; raises if rank 0's store is gone."""
        return int(self._ask(self.store.add, _WANT, 0))

    def request(self) -> None:
        """Ask for sync ``done + 1`` (a no-op if another rank already did)."""
        self._ask(self.store.compare_set, _WANT, str(self.done), str(self.done + 1))


class SyncedFetcher(Fetcher):
    """A fetch thread whose checkpoints are group syncs while the group lives."""

    def __init__(self, *args, clock: SyncClock, **kwargs):
        super().__init__(*args, **kwargs)
        self.clock = clock
        self._told_missing = False
        self.idle = False  # idle for --until-idle when the last checkpoint was asked for (the sync reads it)
        self._asked_idle: float | None = None  # the idle spell whose sync found a rank still reading

    def _idle_long(self) -> bool:
        """No record for ``--until-idle`` and none waiting to be handed over."""
        wait = self.plan.until_idle_s
        return (wait is not None and self._idle_since is not None and not self._buffer and not self._broker_down
                and time.monotonic() - self._idle_since >= wait)

    def _why_stop(self) -> str | None:
        if self.clock.group_idle:
            return f"no new record for {self.plan.until_idle_s:g} s on any worker of the group (--until-idle)"
        return super()._why_stop()

    def _checkpoint_due(self) -> bool:
        if not self.clock.alive:
            return super()._checkpoint_due()
        try:
            if self.clock.wanted() > self.clock.done:
                return True
            if super()._checkpoint_due():
                self.clock.request()
                return True
        except (RuntimeError, ValueError) as exc:  # rank 0's store is gone: let the loop find out
            log.warning("group store unreachable (%s): checkpointing now", exc)
            return True
        return False

    def _may_stop_idle(self) -> bool:
        """Idle in a live group: sync first (the shutdown checkpoint, early), which is also how
        a peer's death shows when nothing else needed the group lately. Alone after the group
        broke up: not before Kafka has handed over every partition of the topic (the others'
        move here after ``worker.session_timeout_ms``, a hung peer's after
        ``worker.max_poll_interval_ms``); stopping sooner would leave them unread until the
        next start."""
        if self.clock.alive:
            if self._asked_idle == self._idle_since or time.monotonic() < self._retry_at:
                return False  # asked in this idle spell (the reading rank asks when it is idle), or backing off
            saved = self.checkpoint("idle")
            if self.clock.alive:
                if self.clock.group_idle:
                    return True
                if saved:  # another rank is still reading: go on with the group (and answer its syncs)
                    self._asked_idle = self._idle_since
                return False  # a failed sync is asked again after its backoff (was: never, and the group ran on)
        missing = self.unassigned()
        if not missing:
            return True
        waited = time.monotonic() - self.clock.alone_since
        # Kafka evicts a dead member after the session timeout (a hung one, whose heartbeats
        # go on, after the poll interval), and the rebalance waits up to the poll interval for
        # the members to rejoin; doubled, as brokers run late (Tansu 0.6: about 3 s late).
        bound = 2 * (self.cfg.session_timeout_ms + 2 * self.cfg.max_poll_interval_ms) / 1000
        if waited >= bound:
            log.warning("partitions %s were never handed to this worker within %g s of the group breaking up; "
                        "stopping without them (they resume from the stored offsets on the next start)",
                        missing, bound)
            return True
        if not self._told_missing:
            self._told_missing = True
            log.info("idle, but partitions %s have not moved here from the departed worker yet; waiting for "
                     "Kafka's rebalance (at most %g s)", missing, bound - waited)
        return False

    def checkpoint(self, reason: str, blocking_commit: bool = False, kafka_commit: bool = True) -> bool:
        if not self.clock.alive:
            return super().checkpoint(reason, blocking_commit, kafka_commit)
        if self.clock.group_idle and not self._unsaved:
            return True  # the group's last sync holds everything (a peer's leaving revokes partitions now)
        try:
            self.clock.request()  # a revocation or shutdown wants a sync the others join
        except (RuntimeError, ValueError):
            pass  # the training loop's collective will fail and take it solo
        self.idle = self._idle_long()
        unsaved = self._unsaved
        self._unsaved = max(unsaved, 1)  # a member answers every sync, even with nothing new
        ok = super().checkpoint(reason, blocking_commit, kafka_commit)
        if not ok and not unsaved:
            self._unsaved = 0
        return ok


class _FencedStore:
    """The writer's store: every commit carries and checks the group generation."""

    def __init__(self, store, worker: "GroupWorker"):
        self._store, self._worker = store, worker

    def commit(self, ckpt) -> None:
        w = self._worker
        fenced_commit(self._store, ckpt, w.generation, w.rank, w.live_world)

    def __getattr__(self, name: str):
        return getattr(self._store, name)


def _forming(collective, *args, **kwargs):
    """A collective while the group forms. A peer that stops now (a refused config, a
    damaged state: its own error says why) closes its connections, and torch raises a
    RuntimeError from deep inside gloo: one line instead."""
    try:
        return collective(*args, **kwargs)
    except (RuntimeError, ValueError) as exc:
        raise DistributedError(f"a peer left while the group formed ({str(exc).splitlines()[0][:200]}): see its "
                               "own error, mend it and start the group again") from exc


class GroupWorker(Worker):
    """One rank of a group of workers on ``options.topic`` sharing ``options.state``.

    Rank 0 is the writer while the group lives; every rank must see the state directory
    (one machine, or a shared filesystem): a survivor takes over writing.
    """

    def __init__(self, cfg: Config, options: RunOptions, settings: DistSettings):
        _check_group(cfg)  # before joining a group or opening the state
        self.settings = settings
        self.rank, self.live_world = settings.rank, settings.world_size
        super().__init__(cfg, options)
        # allreduce: every step is a round of the group (see .allreduce); average: None
        self.exchange = GradientExchange(self.learner, self.group) if cfg.worker.sync == "allreduce" else None
        self._held: Item | None = None  # allreduce: the queue's next item, until its round serves it
        self.learner.replica.keep_log()  # token tasks: every replica starts from the same checkpoint
        self._base = self._progress()  # what the last sync merged

    # ------------------------------------------------------------------ construction steps
    def _open_state(self) -> None:
        """Join the group, then open the state (:meth:`_open_store`), restore the learner
        and agree on the group generation; on failure the group is left."""
        cfg = self.cfg
        self.group = Group(self.settings, cuda=cfg.learner.device != "cpu")
        try:
            self._ask_before_reset()
            self.store, self.writer = self._open_store()
            with learning_meanwhile():  # as a lone worker's (Worker._open_state)
                self.learner = open_learner(self.store, cfg, given=self.options.given, topic_task=self._task_asker())
            self.generation = self._agree_generation()
        except BaseException:
            self.group.close()
            raise
        self.cfg = self.learner.cfg  # with the stored model keys it kept (the commits store this config)
        self.clock = SyncClock(self.group.store, self.settings.timeout_s)

    def _topic_task(self) -> str | None:
        """:meth:`Worker._topic_task`, refused as ``--task`` would be where a group cannot
        run it (was: the check before, on classify, let a next-item topic through)."""
        task = super()._topic_task()
        if task is not None:
            _check_group(retasked(self.cfg, task, self.options.given or ()))
        return task

    def _new_checkpointer(self) -> Checkpointer:
        """The writer's commits carry and check the group generation (fencing)."""
        checkpointer = super()._new_checkpointer()
        if self.writer:
            checkpointer.rebind(_FencedStore(self.store, self))
        return checkpointer

    def _new_fetcher(self, plan: FetchPlan) -> Fetcher:
        # Group members always join the consumer group: Kafka's protocol shares the partitions.
        return super()._new_fetcher(dataclasses.replace(plan, assign=False), SyncedFetcher, clock=self.clock)

    def _open_store(self):
        """Rank 0 opens the state for writing first (with --reset, after moving the old one
        aside), the others then read the same checkpoint (nobody commits before the first
        sync, so every replica starts equal)."""
        if self.rank == 0:
            store = open_store(self.options.state, self.cfg.store, reset=self.options.reset)
            _forming(dist.barrier)
            return store, True
        _forming(dist.barrier)
        return open_store(self.options.state, self.cfg.store, readonly=True), False

    def _agree_generation(self) -> int:
        """A new group is one generation past the stored one (rank 0 reads it), and every
        rank's model config is rank 0's: on a new state nothing else compares them, and a
        rank hashing its records otherwise would blend two models (or crash gloo with
        buffers of another size)."""
        mine = [stored_generation(self.store) + 1 if self.rank == 0 else 0, self.learner.cfg.to_dict()]
        _forming(dist.broadcast_object_list, mine, src=0)
        theirs = Config.from_dict(mine[1])
        differ = [None] * self.live_world
        _forming(dist.all_gather_object, differ, model_changes(theirs, self.learner.cfg))
        named = [f"rank {r}: " + "; ".join(c.replace("stored", "rank 0").replace("now", "here") for c in changes)
                 for r, changes in enumerate(differ) if changes]
        if named:
            raise ConfigError(f"the ranks of the group run other model configs ({' / '.join(named)}): give every "
                              "rank the same --config, --set and --task")
        log.info("rank %d of %d, group generation %d", self.rank, self.live_world, mine[0])
        return int(mine[0])

    def run(self) -> RunSummary:
        try:
            return super().run()
        finally:
            self.group.close()

    # ------------------------------------------------------------------ all-reduce rounds
    def _loop(self) -> Finished:
        """average: the plain loop. allreduce: lock-step rounds while the group lives
        (every rank enters every round, with a batch or without), then the plain loop."""
        if self.exchange is None:
            return super()._loop()
        waiting = True  # nobody brought a batch last round: wait a little for one
        while self.clock.alive:
            if self._held is None:
                self._held = self.handoff.get(timeout_s=0.25 if waiting else 0.0)
            if isinstance(self._held, Prepared) and not self._held.batch.examples:
                self._learn(self._take())  # no gradient: no round
                continue
            try:
                rnd = self._round()
            except DistributedError as exc:
                log.error("%s; leaving the group and going on alone", exc)
                self._go_solo()
                break
            if rnd.finished:
                if isinstance(self._held, Finished):
                    return self._take()
                if self.clock.group_idle:  # the group ends together: this rank's own end is on its way
                    break
                log.info("a peer's stream ended: going on alone")
                self._go_solo()
                break
            if rnd.syncs == self.live_world:
                self._checkpoint(self._take())
            waiting = not rnd.batches
            self._report()
        held = self._take()
        if isinstance(held, Finished):
            return held
        if isinstance(held, Prepared):
            self._learn(held)
        elif isinstance(held, CheckpointRequest):
            self._checkpoint(held)
        return super()._loop()

    def _round(self) -> Round:
        """One round with the held item: learn it if it is a batch whose labels the group
        knows, else take part without one. Raises DistributedError."""
        ex, held = self.exchange, self._held
        ready = isinstance(held, Prepared) and ex.ready(held.batch)
        ex.offer(ready, sync=isinstance(held, CheckpointRequest), finished=isinstance(held, Finished))
        if ready:
            self._learn(self._take())  # the learner's gradient hook runs the round
            if ex.failed is not None:  # the batch was learned alone
                raise ex.failed
        else:
            ex.idle()
        if ex.last.new_labels:
            ex.share_labels()
        return ex.last

    def _take(self) -> Item | None:
        held, self._held = self._held, None
        return held

    def _learn(self, item: Prepared) -> None:
        if self.exchange is not None:
            self.exchange.to_group_labels(item.batch)
        super()._learn(item)

    # ------------------------------------------------------------------ checkpoints
    def _checkpoint(self, request: CheckpointRequest) -> None:
        if self.clock.alive:
            try:
                self._sync(request)
                return
            except DistributedError as exc:
                log.error("%s; leaving the group and going on alone", exc)
                self._go_solo()
        if self.exchange is not None:
            self.exchange.settle_labels()  # the fetch thread waits: no batch holds old label ids
        super()._checkpoint(request)

    def _sync(self, request: CheckpointRequest) -> None:
        started = time.monotonic()
        everyone = self._gather()  # before averaging: a peer dying in between leaves both unmerged
        if self.exchange is not None:
            report = self.exchange.settle()  # the replicas are equal already
        else:
            report = average_replicas(self.learner, self.group)
        merged = self._merge(everyone)
        ok = True
        if self.writer:
            try:
                self.checkpointer.commit(self.metrics.snapshot(), self.cfg)
            except StreamlearnError as exc:
                ok = False
                log.error("group checkpoint failed, the state is unchanged: %s", exc)
        else:
            self.learner.take_dirty()  # the writer stores the averaged rows
        ok = self._all_ok(ok)
        # Every rank idle: the group's last sync, failed or not (a failed one ends the group as a
        # lone worker ends, its final checkpoint trying once more: "NOT all saved", exit 1)
        self.clock.group_idle = all(p["idle"] for p in everyone)
        if ok:
            self.checkpointer.clear_audit()
        self.clock.done += 1
        self._base = merged
        seconds = time.monotonic() - started  # every rank's checkpoint is the whole sync (the writer's commit in it)
        self.metrics.checkpointed(seconds, ok)
        if ok:
            self.summary.checkpoints += 1
        log.info("sync %d (%s): %d bytes sent, %.3f s, rows %s, %d exchanges, step %d, offsets %s, digest %s",
                 self.clock.done, request.reason, report.payload_bytes, report.seconds, report.rows,
                 report.exchanges, self.learner.steps, self.checkpointer.positions, self.learner.replica.digest())
        request.answer(ok, self.checkpointer.positions, seconds)

    def _progress(self) -> dict:
        c = self.checkpointer
        return {"positions": dict(c.positions), "applied": dict(c.applied), "totals": dict(c.totals),
                "audit": c.audit_ranges(), "steps": self.learner.steps, "idle": self.fetcher.idle}

    def _gather(self) -> list[dict]:
        everyone: list = [None] * self.live_world
        try:
            dist.all_gather_object(everyone, self._progress())
        except RuntimeError as exc:
            raise DistributedError(f"gathering offsets failed (a peer stopped or died): {exc}") from exc
        return everyone

    def _merge(self, everyone: list[dict]) -> dict:
        """Per partition the furthest offset and count; totals add each rank's part since
        the last sync; the step count is the furthest; the writer's audit gets every rank's
        ranges."""
        c, base = self.checkpointer, self._base
        for key in ("positions", "applied"):
            merged = getattr(c, key)
            for progress in everyone:
                for p, n in progress[key].items():
                    merged[p] = max(merged.get(p, 0), n)
        for name in c.totals:
            c.totals[name] = base["totals"][name] + sum(p["totals"][name] - base["totals"][name] for p in everyone)
        # Averaging replicas count their own steps; the store refuses a commit whose step is
        # behind the stored one, so every replica takes the furthest count: a survivor that
        # takes over writing is never behind the last group checkpoint.
        self.learner.steps = max(p["steps"] for p in everyone)
        for p, n in c.positions.items():
            if self.fetcher.positions.get(p, -1) < n:
                self.fetcher.positions[p] = n  # another rank consumed it: start there if it moves here
        c.replace_audit([r for progress in everyone for r in progress["audit"]])
        return self._progress()

    def _all_ok(self, ok: bool) -> bool:
        flags: list = [None] * self.live_world
        try:
            dist.all_gather_object(flags, ok)
        except RuntimeError as exc:
            raise DistributedError(f"confirming the group checkpoint failed (a peer stopped or died): {exc}") from exc
        return all(flags)

    def _take_writer_lock(self):
        """Open the state for writing once the old writer's lock is free (a killed
        process drops its flock at once; a hung one keeps it, and then we stop)."""
        deadline = time.monotonic() + self.settings.timeout_s
        while True:
            try:
                return open_store(self.options.state, self.cfg.store)
            except StreamlearnError as exc:
                if time.monotonic() > deadline:
                    raise WorkerError(f"cannot take over writing {self.options.state}: {exc}") from exc
                time.sleep(0.2)

    def _go_solo(self) -> None:
        """Leave the broken group; become the writer with the next generation."""
        self.clock.end()
        self.learner.replica.keep_log(False)  # no more merges: the log would only grow
        if self.exchange is not None:
            self.exchange.go_solo()
        self.group.close()
        self.live_world = 1
        if not self.writer:
            self.store.close()
            self.store = self._take_writer_lock()
            self.writer = True
        # The failed sync may have consumed the dirty rows: write every row once.
        self.checkpointer.rebind(_FencedStore(self.store, self), full=True)
        stored = topic_offsets(self.store.manifest().offsets, self.options.topic)
        if stored == self.checkpointer.positions:
            self.checkpointer.clear_audit()  # the old writer committed this sync before it died
        self.generation = stored_generation(self.store) + 1
        log.warning("rank %d now works alone as the writer, generation %d", self.rank, self.generation)


def _check_group(cfg: Config) -> None:
    """What a group of workers cannot do (the config checked each key when it was built)."""
    if not task_class(cfg.learner.task).replicable:
        able = [name for name in REGISTRY if task_class(name).replicable]
        raise ConfigError(f"--world-size > 1 supports learner.task={', '.join(able)}, got {cfg.learner.task!r}: "
                          "its per-key histories are not merged between workers; run one worker")
