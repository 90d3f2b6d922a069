"""The training loop's side of checkpoints: what the learner has applied, and the commit.

Commit order (the reason a killed worker neither loses nor repeats a record):

1. The fetch thread stops preparing and flushes the dead-letter producer, so every letter
   for an offset the checkpoint will cover is acknowledged.
2. The training loop learns every batch queued before the request (``Handoff`` order).
3. ONE store commit writes the learner's changed rows, blobs and kv together with the
   offsets (next offset to consume, per partition, counting dead-lettered records) and
   the records applied per partition. LMDB makes it all or nothing.
4. Only then the fetch thread commits the same offsets to Kafka. That commit is advisory
   (lag monitoring); on start and on every assignment the worker seeks to the offsets of
   step 3, never to Kafka's.

Killed before 3 completes, the worker restarts from the previous checkpoint: its state and
its offsets both predate the lost work, which is simply consumed again. Killed after 3,
the state holds the records and the offsets skip them.
"""
from __future__ import annotations

import logging
import time
from typing import Callable, Collection, Iterable

from ..checkpoint import audit_kv, has_checkpoint, read_full, stored_config, topic_id_kv, write
from ..config import Config, keep_stored, retasked
from ..exceptions import CheckpointMismatchError, ConfigError
from ..learner import Learner
from ..records import Record
from ..sizing import derived_keys, sized_config
from ..state import Checkpoint, Store
from .handoff import Prepared
from .live import LiveHistory

log = logging.getLogger(__name__)

# cumulative counts kept in the manifest metrics (prequential_*: the batches evaluated
# before learning, every worker.eval_every-th batch)
_TOTALS = ("records_learned", "dead_letters", "prequential_evaluated", "prequential_correct")


def partition_key(topic: str, partition: int) -> str:
    return f"{topic}:{partition}"


def topic_offsets(mapping: dict[str, int], topic: str) -> dict[int, int]:
    """``{"topic:p": n}`` entries of ``topic`` as ``{p: n}``."""
    out = {}
    for key, value in mapping.items():
        name, _, part = key.rpartition(":")
        if name == topic:
            out[int(part)] = int(value)
    return out


def open_learner(store: Store, cfg: Config, window: Callable[[], Iterable[Record]] | None = None,
                 given: Collection[str] | None = None, topic_task: Callable[[], str | None] | None = None) -> Learner:
    """The learner of the store's last checkpoint, or a new one for an empty store.

    The config passed in wins (it may change e.g. learning rates), but it must build the
    same tables and weights as the stored one: otherwise CheckpointMismatchError names the
    config keys that differ. A damaged checkpoint raises CorruptStateError.

    A size the config leaves to the stream (``model.out_B=0``) is the stored one on a
    restart (never derived again); a new model is sized from the records ``window()``
    returns (the warm-up window, :func:`.warmup.read_window`), and records how in
    ``learner.sizing``, which its checkpoints store.

    ``topic_task`` (a worker given no task): a new model takes the task it names
    (:func:`.warmup.topic_task`; None: ``cfg``'s), with the ``given`` keys
    (:func:`~streamlearn.config.retasked`). Was: classify, and every record of a next-item
    topic went to the dead-letter topic.

    ``given``: the config keys the user set (:func:`~streamlearn.config.load_config_given`). On a
    restart every other model key takes its stored value (logged), so a worker restarted
    without its first flags, or after an upgrade moved a default, resumes its model; None
    takes ``cfg`` whole, as given.
    """
    if not has_checkpoint(store):
        task = None if topic_task is None else topic_task()
        if task not in (None, cfg.learner.task):
            cfg = retasked(cfg, task, given or ())
        if not derived_keys(cfg):
            return Learner(cfg)
        if window is None:
            raise ConfigError(f"{', '.join(derived_keys(cfg))}=0 is derived from the stream, and this worker "
                              "has no warm-up window to read: set a size")
        sized, sizing = sized_config(cfg, window())
        learner = Learner(sized)
        learner.sizing = sizing
        log.info("new model: %s", sizing)
        return learner
    stored = stored_config(store)
    if cfg.learner.task != stored.learner.task and (given is None or "learner.task" in given):
        # said first: the other task's defaults would otherwise fail the config's own rules
        # against the stored model keys (model.counts of the stored task), one key at a time
        fresh = store.manifest().step == 0
        raise CheckpointMismatchError(
            f"the state at {store.path} holds a {stored.learner.task} model, and this run asks for "
            f"learner.task={cfg.learner.task}: run it as --task {stored.learner.task}, or use a new --state "
            "directory" + (f" (it has learned nothing yet: --reset discards it and starts a {cfg.learner.task} "
                           "model that reads the topic from the start)" if fresh else ""),
            (f"learner.task: stored {stored.learner.task!r}, now {cfg.learner.task!r}",),
            f"learner.task {stored.learner.task!r} -> {cfg.learner.task!r}")
    if given is not None:
        # a derived size (model.out_B=0) is read_full's to take from the store, as before
        cfg, kept = keep_stored(stored, cfg, {*given, *derived_keys(cfg)})
        if kept:
            log.info("kept the stored model config where this run sets nothing: %s", "; ".join(_as_kept(kept)))
    try:
        return read_full(store, cfg)
    except CheckpointMismatchError as exc:
        if not exc.config_diff:
            raise
        raise CheckpointMismatchError(
            f"the state at {store.path} was trained with another model config ({exc.config_diff}): pass "
            f"the same --config/--set as before, or use a new --state directory ({'; '.join(exc.misfits)})",
            exc.misfits, exc.config_diff,
        ) from exc


def _as_kept(lines: list[str]) -> list[str]:
    """:func:`~streamlearn.config.model_changes`' ``"K: stored A, now B"`` as ``"K=A (the
    default now: B)"``: the stored value is the one used (was: "now B" read as if B were).

    >>> _as_kept(["learner.recency: stored 1, now 3"])
    ['learner.recency=1 (the default now: 3)']
    """
    out = []
    for line in lines:
        key, _, values = line.partition(": stored ")
        stored, _, default = values.partition(", now ")
        out.append(f"{key}={stored} (the default now: {default})")
    return out


class AuditLog:
    """Offset ranges applied since the last commit, merged while contiguous."""

    def __init__(self) -> None:
        self.ranges: list[list[int]] = []  # [partition, first, last, count]
        self._open: dict[int, list[int]] = {}

    def add(self, spans: dict[int, tuple[int, int, int]]) -> None:
        for partition, (first, last, count) in spans.items():
            run = self._open.get(partition)
            if run is not None and run[2] + 1 == first and _dense(run[1], run[2], run[3]) and _dense(first, last, count):
                run[2], run[3] = last, run[3] + count
                continue
            run = [partition, first, last, count]
            self.ranges.append(run)
            self._open[partition] = run

    def clear(self) -> None:
        self.ranges, self._open = [], {}


def _dense(first: int, last: int, count: int) -> bool:
    return count == last - first + 1


class Checkpointer:
    """Tracks what the learner has applied and commits it with the learner's state.

    ``positions``: partition -> next offset to consume (the learner holds every record
    before it); ``applied``: partition -> records applied (learned or dead-lettered).
    Both start from the store's manifest and advance in :meth:`note`, after each learned
    batch; :meth:`commit` writes them with the learner (steps 2-3 of the module docstring)
    and, when ``live`` is set (the worker's :class:`~.live.LiveHistory`), the live figures.
    """

    live: LiveHistory | None = None
    topic_id: Callable[[], str | None] | None = None  # the topic's id now (the fetch thread's), stored with the offsets

    def __init__(self, store: Store, learner: Learner, topic: str, audit: bool = False):
        self.store, self.learner, self.topic = store, learner, topic
        manifest = store.manifest()
        self.positions = topic_offsets(manifest.offsets, topic)
        self.applied = topic_offsets(manifest.records_applied, topic)
        metrics = manifest.metrics or {}
        self.totals = {name: int(metrics.get(name) or 0) for name in _TOTALS}
        self.commits = manifest.commits
        self._audit = AuditLog() if audit else None
        self._full = False  # the next commit writes every row (see rebind)
        # What a failed commit carried (row ids per table, kv entries); the next one carries it again.
        self._unwritten: tuple[dict[str, object], dict[str, dict]] | None = None
        self._specs_declared = False
        self.last_rows = 0  # rows the last commit attempt carried, all tables together

    def audit_ranges(self) -> list[list[int]]:
        """The offset ranges applied since the last commit, copied (``[partition, first,
        last, count]``; empty with ``worker.audit`` off)."""
        return [list(r) for r in self._audit.ranges] if self._audit is not None else []

    def replace_audit(self, ranges: list[list[int]]) -> None:
        """Make ``ranges`` the ones the next commit records (a group's writer records
        every rank's); ignored with ``worker.audit`` off."""
        if self._audit is not None:
            self._audit.clear()
            self._audit.ranges = [list(r) for r in ranges]

    def clear_audit(self) -> None:
        """Forget the ranges since the last commit (another process committed them)."""
        if self._audit is not None:
            self._audit.clear()

    def rebind(self, store: Store, full: bool = False) -> None:
        """Commit through ``store`` from now on (e.g. a process that just took the writer
        lock): the tables are declared to it again and audit entries numbered from its
        manifest. ``full``: the next commit writes every row (the learner's changed-row
        lists may have been consumed by a commit that never reached this store)."""
        self.store = store
        self._specs_declared = False
        self._full = self._full or full
        self.commits = store.manifest().commits

    def note(self, item: Prepared, learned: int, evaluated: int = 0, correct: int = 0) -> None:
        """Account for a learned batch: its offsets, counts, prequential hits and audit ranges."""
        for partition, (_, last, count) in item.spans.items():
            self.positions[partition] = last + 1
            self.applied[partition] = self.applied.get(partition, 0) + count
        self.totals["records_learned"] += learned
        self.totals["dead_letters"] += len(item.dead)
        self.totals["prequential_evaluated"] += evaluated
        self.totals["prequential_correct"] += correct
        if self._audit is not None:
            self._audit.add(item.spans)

    def commit(self, metrics: dict, config: Config) -> float:
        """One atomic store commit of the learner and the offsets; returns its seconds.

        A failure raises (the store is unchanged). That attempt consumed the learner's
        changed-row lists, changed histories and new candidates, so the row ids and kv
        entries it carried are kept and merged into the next attempt, which writes them
        again with whatever changed since: only what is dirty. (Rewriting every row
        instead, about 80 MB at the default sizes, needs that much free room beyond the
        file under LMDB's copy-on-write, and so kept failing on a disk that had been full.)
        """
        started = time.perf_counter()
        if self.live is not None:
            self.live.close()  # the figures up to now go with this checkpoint
        specs, rows, blobs, kv = self._take_parts()
        try:
            if not self._specs_declared:
                self.store.declare_tables(specs)
                self._specs_declared = True
            self.store.commit(self._checkpoint(rows, blobs, kv, metrics, config))
        except BaseException:
            self._unwritten = ({name: ids for name, (ids, _) in rows.items()}, kv)
            if self.live is not None:
                self.live.checkpointed(0.0, False, self.last_rows)
            raise
        self._unwritten = None
        self._full = False
        self.commits += 1
        if self._audit is not None:
            self._audit.clear()
        seconds = time.perf_counter() - started
        if self.live is not None:
            self.live.checkpointed(seconds, True, self.last_rows)
        return seconds

    def _take_parts(self):
        """The learner's checkpoint parts, with what a failed attempt carried merged in:
        its rows are marked dirty again (their current values are read now), its kv entries
        sit under the newer ones."""
        if self._unwritten is not None:
            row_ids, old_kv = self._unwritten
            self.learner.mark_dirty(row_ids)
        specs, rows, blobs, kv = write(self.learner, full=self._full)
        if self._unwritten is not None:
            kv = {ns: {**old_kv.get(ns, {}), **kv.get(ns, {})} for ns in {*old_kv, *kv}}
        self.last_rows = sum(len(ids) for ids, _ in rows.values())
        return specs, rows, blobs, kv

    def _checkpoint(self, rows: dict, blobs: dict, kv: dict, metrics: dict, config: Config) -> Checkpoint:
        if self._audit is not None:
            kv.update(audit_kv(self.commits + 1, self._audit.ranges))
        topic_id = self.topic_id() if self.topic_id is not None else None
        if topic_id is not None:
            kv.update(topic_id_kv(self.topic, topic_id))
        if self.live is not None:
            for namespace, entries in self.live.take_kv().items():  # under a failed attempt's entries
                kv[namespace] = {**kv.get(namespace, {}), **entries}
        key = lambda p: partition_key(self.topic, p)  # noqa: E731
        return Checkpoint(
            step=self.learner.steps,
            offsets={key(p): n for p, n in self.positions.items()},
            records_applied={key(p): n for p, n in self.applied.items()},
            rows=rows, blobs=blobs, kv=kv, config=config.to_dict(),
            metrics={**metrics, **self.totals},
        )

