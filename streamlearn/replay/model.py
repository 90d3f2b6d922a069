"""The model as a replay contestant: a :class:`~streamlearn.learner.Learner` behind the
same two verbs as the baselines (``predict`` the arriving events, ``learn`` the revealed).

Prequential evaluation works per mini-batch: every record is predicted before it is
learned; within a mini-batch, all records are predicted with the model as it was before
that batch's optimizer step (one step per mini-batch, as the worker trains).
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from ..exceptions import StreamlearnError
from ..learner import Learner
from .events import Event

__all__ = ["ModelContestant"]


class ModelContestant:
    """``learning=False`` is frozen replay: predictions only, the learner never changes.

    ``fused`` (classify, prequential, no label delay): each arriving mini-batch is prepared
    once as a training batch, scored with ``predict_proba_batch`` and then learned, instead
    of tokenizing and hashing it twice.
    """

    def __init__(self, name: str, learner: Learner, learning: bool, k: int, fused: bool):
        self.name, self.learner, self.learning, self.k = name, learner, learning, k
        self.task = learner.task
        self.fused = fused and learning and self.task == "classify"
        self.steps = 0
        self.notes: list[str] = []
        self._prepared: tuple[tuple[int, ...], Any] | None = None

    # ------------------------------------------------------------------ predict

    def predict(self, events: Sequence[Event]) -> list:
        if not events:
            return []
        if self.task == "classify":
            return self._fused_proba(events) if self.fused else self._proba(events)
        return self._topk(events)

    def _proba(self, events: Sequence[Event]) -> list[dict]:
        return self.learner.predict_proba_many([e.record for e in events])

    def _fused_proba(self, events: Sequence[Event]) -> list[dict]:
        known = len(self.learner.labels)  # labels learned before this batch
        batch = self.learner.prepare([e.record for e in events], train=True)
        self._prepared = (tuple(e.position for e in events), batch)
        rejected = {i for i, _ in batch.rejected}
        # Preparing added this batch's new labels to the table; a prediction made before
        # learning must not know them: keep the labels known before, renormalised (the
        # softmax over their logits alone).
        probs = self.learner.predict_proba_batch(batch)[:, :known]  # (accepted, known)
        probs = probs / np.maximum(probs.sum(axis=1, keepdims=True), 1e-30)
        labels = self.learner.labels[:known]
        rows = iter(probs.tolist())
        return [{} if i in rejected else dict(zip(labels, next(rows))) for i in range(len(events))]

    def _topk(self, events: Sequence[Event]) -> list[list[str]]:
        """The k best answers, minus each event's excluded items. Excluding needs the list
        past them, so next-item decodes ``k + excluded`` answers exhaustively (beam = the
        hashed output size): a beam-limited list could stop short of k after exclusion."""
        extra = max(e.n_excluded for e in events)
        beam = self.learner.cfg.learner.beam
        if extra:
            beam = max(beam, int(getattr(self.learner.index, "size", beam)))
        tops = self.learner.topk_many([e.query for e in events], k=self.k + extra, beam=beam)
        return [[t for t in top.tokens if not e.excluded(t)][: self.k] for e, top in zip(events, tops)]

    # ------------------------------------------------------------------ learn

    def learn(self, events: Sequence[Event]) -> dict[int, str]:
        """Learn the revealed events (one optimizer step); ``{position: reason}`` of the
        records the learner rejected (e.g. a label beyond model.max_labels)."""
        if not self.learning or not events:
            return {}
        report = self.learner.learn_batch(self._take_prepared(events))
        self.steps += 1
        return {events[i].position: str(err) for i, err in report.rejected}

    def _take_prepared(self, events: Sequence[Event]) -> Any:
        prepared, self._prepared = self._prepared, None
        if prepared is None:
            return self.learner.prepare([e.record for e in events], train=True)
        if prepared[0] != tuple(e.position for e in events):
            raise StreamlearnError("replay: a fused batch was not learned as predicted (internal order error)")
        return prepared[1]

