"""The model as a replay contestant: a :class:`~streamlearn.learner.Learner` behind the
same two verbs as the baselines (``predict`` the arriving events, ``learn`` the revealed).

Prequential evaluation works per mini-batch: every record is predicted before it is
learned; within a mini-batch, all records are predicted with the model as it was before
that batch's optimizer step (one step per mini-batch, as the worker trains).

Top-k answers of a mini-batch are decoded in one call (``Learner.topk_batch``). Events
of a keyed stream (next-item) exclude the items their key already had: each key's
candidate ids are cached here, so each item is looked up once, and a Superbloom head
then scores every candidate of the whole batch in one gather and sum, sets the excluded
ids to -inf in one scatter, and keeps the k best with one partition
(``decoding.exhaustive_topk_many``; a per-record beam search as wide as the hashed output
plus a Python filter of each list had spent ~85% of a MovieLens replay).
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from ..batching import Batch
from ..decoding import CandidateIndex
from ..exceptions import StreamlearnError
from ..learner import Learner, StepReport
from ..tasks.base import Event

__all__ = ["ModelContestant"]

_NONE = np.zeros(0, dtype=np.int64)


class ModelContestant:
    """``learning=False`` is frozen replay: predictions only, the learner never changes.

    ``fused`` (prequential, no label delay; a labels task, or one whose events are its
    training examples, ``Task.events_are_examples``): each arriving mini-batch is prepared
    once as a training batch, predicted from it and learned, instead of tokenized and
    hashed twice: with no delay every arriving record is revealed right after the
    contestants predict it, so the step taken at prediction time is the step ``learn``
    would take; ``learn`` hands back its report. A labels task scores and learns in one
    ``predict_learn_batch`` call (at depth 0 one forward for both); next-token answers
    each position from the training batch's outputs (``topk_batch``), whose count scores
    see the batch's earlier records, as the counting baselines' do; next-item each
    record whose key had an item, from the same outputs, its transition counts seeing
    the batch's earlier records and its list holding the items they brought
    (``Task.fresh``), minus the key's earlier items.
    """

    def __init__(self, name: str, learner: Learner, learning: bool, k: int, fused: bool):
        self.name, self.learner, self.learning, self.k = name, learner, learning, k
        self.labels = learner.task.answers == "labels"
        self.fused = fused and learning and (self.labels or learner.task.events_are_examples)
        self.steps = 0
        # records the learner cut to hashing.max_tokens, from its step reports (frozen: None,
        # nothing is learned, and a query batch does not count them)
        self.truncated: int | None = 0 if learning else None
        self.max_tokens = learner.cfg.hashing.max_tokens
        self.notes: list[str] = []
        self._learned: tuple[tuple[int, ...], StepReport] | None = None  # fused: the step taken when predicting
        self._had: dict[str, _KeyItems] = {}  # keyed streams: per key, its items' candidate ids

    # ------------------------------------------------------------------ predict

    def predict(self, events: Sequence[Event]) -> list:
        """A prediction per arrived event, in order (None for one not evaluated: a
        next-item key's first)."""
        if self.fused:
            return self._fused_proba(events) if self.labels else self._fused_topk(events)
        asked = [e for e in events if e.evaluate]
        preds = iter((self._proba(asked) if self.labels else self._topk(asked)) if asked else [])
        return [next(preds) if e.evaluate else None for e in events]

    def _proba(self, events: Sequence[Event]) -> list[dict]:
        return self.learner.predict_proba_many([e.record for e in events])

    def _fused_proba(self, events: Sequence[Event]) -> list[dict]:
        batch = self.learner.prepare([e.record for e in events], train=True)
        # Preparing added this batch's new labels to the table; a prediction made before
        # learning does not know them: the probabilities are over the labels known before.
        probs, report = self.learner.predict_learn_batch(batch)  # (accepted, label_start)
        self._learned = (tuple(e.position for e in events), report)
        self.steps += 1
        rejected = {i for i, _ in batch.rejected}
        labels = self.learner.labels[:batch.label_start]
        rows = iter(probs.tolist())
        return [{} if i in rejected else dict(zip(labels, next(rows))) for i in range(len(events))]

    def _fused_topk(self, events: Sequence[Event]) -> list[list[str] | None]:
        """Each evaluated event's k best answers from the training batch of its records,
        before its step (one example per evaluated event, in order:
        ``Task.events_are_examples``), then the step."""
        firsts = _first_of_each_record(events)
        batch = self.learner.prepare([e.record for e in firsts], train=True)
        rejected = {firsts[i].position for i, _ in batch.rejected}
        kept = [e for e in events if e.position not in rejected]
        exclude = self._batch_exclusions(batch, kept) if any(e.key is not None for e in kept) else None
        tops = iter(self.learner.topk_batch(batch, self.k, exclude=exclude))  # one per example
        self._learned = (tuple(e.position for e in firsts), self.learner.learn_batch(batch))
        self.steps += 1
        out: list[list[str] | None] = []
        for e in events:
            top = [] if e.position in rejected else next(tops, None) if e.evaluate else None
            if e.evaluate and top is None:
                break
            out.append(top if top is None or isinstance(top, list) else top.tokens)
        if len(out) < len(events) or next(tops, None) is not None:
            raise StreamlearnError("replay: a record's events and its training examples differ (internal order error)")
        return out

    def _batch_exclusions(self, batch: Batch, events: Sequence[Event]) -> list[np.ndarray]:
        """Per evaluated event of a fused keyed batch, the candidate ids its key already
        had: those the index holds, and the batch's new items (``Task.fresh``, ids after
        the index's) the key had earlier in the batch."""
        fresh = self.learner.task.fresh(batch)
        n = len(self.learner.index)
        ids = {} if fresh is None else {t: n + j for j, t in enumerate(fresh.tokens)}
        had: dict[str, list[int]] = {}
        out = []
        for e in events:
            mine = had.setdefault(e.key, [])
            if e.evaluate:
                out.append(np.concatenate([self._had_ids(e), np.array(mine, dtype=np.int64)]) if mine else self._had_ids(e))
            if e.target in ids:
                mine.append(ids[e.target])
        return out

    def _topk(self, events: Sequence[Event]) -> list[list[str]]:
        """The k best candidates of every event, minus the items its key already had."""
        batch = self.learner.prepare([e.query for e in events], train=False)
        keyed = any(e.key is not None for e in events)
        exclude = [self._had_ids(e) for e in events] if keyed else None
        return [top.tokens for top in self.learner.topk_batch(batch, self.k, exclude=exclude)]

    def _had_ids(self, event: Event) -> np.ndarray:
        if event.key is None:
            return _NONE
        had = self._had.get(event.key)
        if had is None:
            had = self._had[event.key] = _KeyItems()
        return had.ids(event, self.learner.index)

    # ------------------------------------------------------------------ learn

    def learn(self, events: Sequence[Event]) -> dict[int, str]:
        """Learn the revealed events (one optimizer step); ``{position: reason}`` of the
        records the learner rejected (e.g. a label beyond model.max_labels)."""
        if not self.learning or not events:
            return {}
        firsts = _first_of_each_record(events)  # a record with several events is learned once
        report = self._take_learned(firsts)
        if report is None:
            report = self.learner.learn_many([e.record for e in firsts])
            self.steps += 1
        self.truncated += report.truncated
        return {firsts[i].position: str(err) for i, err in report.rejected}

    def _take_learned(self, events: Sequence[Event]) -> StepReport | None:
        learned, self._learned = self._learned, None
        if learned is not None and learned[0] != tuple(e.position for e in events):
            raise StreamlearnError("replay: a fused batch was not revealed as predicted (internal order error)")
        return None if learned is None else learned[1]


def _first_of_each_record(events: Sequence[Event]) -> list[Event]:
    """The first event of each record (events of one record share its position)."""
    out, last = [], None
    for e in events:
        if e.position != last:
            out.append(e)
            last = e.position
    return out


class _KeyItems:
    """The candidate ids of the items a next-item key had, resolved as its events come.

    A key's events are predicted in stream order, so each event's items are the previous
    event's plus new ones: only those are looked up. An item not in the index yet (in
    prequential mode, learned later in the same mini-batch) is no candidate of a query;
    a fused batch, which lists it (``Task.fresh``), excludes it itself
    (:meth:`ModelContestant._batch_exclusions`). It is retried when the index has grown.
    """

    __slots__ = ("_buf", "_n", "_resolved", "_pending", "_index_size")

    def __init__(self) -> None:
        self._buf = np.empty(16, dtype=np.int64)  # ids in [0, _n); doubles when full
        self._n = 0
        self._resolved = 0  # items of the key's list looked up so far
        self._pending: list[str] = []  # looked up, not in the index then
        self._index_size = 0

    def ids(self, event: Event, index: CandidateIndex) -> np.ndarray:
        """The candidate ids of the items ``event``'s key had (a view of the buffer: later
        appends write past it or into a new buffer, so it stays valid)."""
        new = event.excluded_items(self._resolved)
        self._resolved += len(new)
        grew = len(index) != self._index_size
        ask = self._pending + new if grew else new
        if ask:
            self._index_size = len(index)
            found = index.ids(ask)  # (len(ask),), -1: not a candidate
            missing = [t for t, i in zip(ask, found.tolist()) if i < 0] if (found < 0).any() else []
            self._pending = missing if grew else self._pending + missing
            self._append(found[found >= 0])
        return self._buf[:self._n]

    def _append(self, ids: np.ndarray) -> None:
        need = self._n + len(ids)
        if need > len(self._buf):
            buf = np.empty(max(need, 2 * len(self._buf)), dtype=np.int64)
            buf[:self._n] = self._buf[:self._n]
            self._buf = buf
        self._buf[self._n:need] = ids
        self._n = need
