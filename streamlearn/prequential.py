"""What a worker measures on a training batch before it learns it: the model's score and a
counting baseline's beside it, so "is it learning?" has an answer on the dashboard.

Prequential (predict, then learn) on every ``worker.eval_every``-th batch; the baseline
learns every batch. Each task picks its check once (:meth:`Task.prequential_check`):

- classify (:class:`LabelCheck`): accuracy. The model's correct labels (the same forward
  as the worker's ``prequential_accuracy``) against the Naive Bayes part alone (its
  counts are the model's own, so they survive a restart) or, with ``learner.nb_weight=0``,
  the majority label so far.
- token tasks (:class:`TokenCheck`): loss, in nats per answer and in the head's own
  output code (Superbloom's sum of m bucket cross-entropies, T-Free's summed BCE, the
  sampled head's cross-entropy over the step's answers and negatives), so model and
  baseline are in one unit. The baseline is popularity in that code: each bucket's
  (pattern row's, token's) frequency among the answers so far, add-one smoothed. Top-k
  recall would need a decode per answer, which costs more than the training step; the
  loss costs one forward.

Baseline counts other than the model's own live in the worker process: after a restart
popularity starts counting again.

>>> import numpy as np
>>> pop = HashedPopularity(m=1, size=4)
>>> pop.learn({"hashes": np.array([[2], [2], [1]])}, np.ones(3, np.float32))
>>> round(pop.loss({"hashes": np.array([[2]])}, np.ones(1, np.float32)), 4)  # -log((2 + 1) / (3 + 4))
0.8473
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

import numpy as np

if TYPE_CHECKING:
    from .batching import Batch
    from .device import Device
    from .heads import NaiveBayesHead
    from .model import HashedTransformer

__all__ = ["Check", "HashedPopularity", "LabelCheck", "PatternPopularity", "SampledPopularity", "Scores",
           "TokenCheck"]

ACCURACY = "accuracy"  # fraction of answers right: higher is better
LOSS = "loss"  # nats per answer: lower is better
_ALPHA = 1.0  # add-one smoothing of the popularity counts


@dataclass(frozen=True)
class Scores:
    """One training batch scored before it was learned: ``model`` and ``baseline`` are
    sums over its ``examples`` of ``metric`` (:data:`ACCURACY`: answers right;
    :data:`LOSS`: weighted nats), so batches add up and a window's value is sum / examples."""

    metric: str
    examples: int
    model: float
    baseline: float

    @property
    def hits(self) -> int | None:
        """The model's right answers, for an accuracy check (None for a loss)."""
        return int(self.model) if self.metric == ACCURACY else None


class Check:
    """A task's prequential check: :meth:`score` a training batch before the step,
    :meth:`learn` it after. ``baseline``: the baseline's name, as the dashboard shows it."""

    metric: ClassVar[str]
    baseline: str

    def score(self, model: "HashedTransformer", batch: "Batch", dev: "Device") -> Scores | None:
        """Scores of a training batch before it is learned (None: nothing to score).
        The learner runs it in inference mode."""
        raise NotImplementedError

    def learn(self, batch: "Batch") -> None:
        """Count a learned training batch into the baseline."""


# ---------------------------------------------------------------------------- classify

class LabelCheck(Check):
    """classify: the model's accuracy against the Naive Bayes part alone, or the majority
    label without that part."""

    metric = ACCURACY

    def __init__(self, task):
        self.task = task
        nb = task.nb
        self._nb: NaiveBayesHead | None = nb
        self._labels = None if nb is not None else np.zeros(task.cfg.model.max_labels)
        self.baseline = "naive bayes part" if nb is not None else "majority label"

    def score(self, model, batch, dev) -> Scores | None:
        hits = self.task.hits(model, batch, dev)
        if hits is None:
            return None
        return Scores(self.metric, batch.examples, float(hits), float(self.baseline_hits(batch)))

    def scores_of(self, outputs, batch: "Batch", baseline_hits: int) -> Scores | None:
        """:meth:`score` from the logits (examples, n_labels) the step's own forward gave
        before it (``Learner.learn_batch_scored``), and the baseline's hits counted
        before the step (:meth:`baseline_hits`); the same figures as :meth:`score`."""
        hits = self.task.hits_of(outputs, batch)
        if hits is None:
            return None
        return Scores(self.metric, batch.examples, float(hits), float(baseline_hits))

    def baseline_hits(self, batch: "Batch") -> int:
        """The baseline's right labels on a training batch, from its counts before the
        batch, over the labels known before it (as the model's: ``Classify.hits``)."""
        n = batch.label_start
        if not batch.examples or not n:
            return 0
        targets = batch.targets["labels"]  # (N,)
        if self._nb is not None:
            predicted = self._nb.scores(batch.nb_tokens, n).argmax(-1)  # (N,): counts before this batch
        else:
            predicted = np.full(len(targets), int(self._labels[:n].argmax()))
        return int((predicted == targets).sum())

    def learn(self, batch: "Batch") -> None:
        if self._labels is not None and batch.examples:  # the Naive Bayes part counts in learn_batch
            np.add.at(self._labels, batch.targets["labels"], 1.0)


# ---------------------------------------------------------------------------- token tasks

class TokenCheck(Check):
    """Token tasks: the model's loss before the step against popularity in the output
    code (``code.popularity()``)."""

    metric = LOSS

    def __init__(self, task):
        self.task = task
        self._popularity = task.code.popularity()
        self.baseline = "popularity"

    def score(self, model, batch, dev) -> Scores | None:
        n = batch.examples
        if not n:
            return None
        loss = float(self.task.loss(model, batch, dev))  # weighted mean over the n answers
        return Scores(self.metric, n, loss * n, self._popularity.loss(self.task.step_targets(batch), batch.weight) * n)

    def learn(self, batch: "Batch") -> None:
        if batch.examples:
            self._popularity.learn(batch.targets, batch.weight)


class HashedPopularity:
    """Bucket frequencies per hash slot of a :class:`~streamlearn.outputs.HashedCode`:
    an answer's loss is sum_j -log p_j(eta_j(answer)), the head's loss of a model that
    knows only how often each bucket was an answer."""

    def __init__(self, m: int, size: int):
        self.counts = np.zeros((m, size))  # (m, size)
        self.total = 0.0

    def loss(self, targets: dict[str, np.ndarray], weight: np.ndarray) -> float:
        """Weighted mean loss of answers ``targets["hashes"]`` (n, m)."""
        hashes = targets["hashes"]
        slots = np.arange(hashes.shape[1])
        p = (self.counts[slots, hashes] + _ALPHA) / (self.total + _ALPHA * self.counts.shape[1])  # (n, m)
        return float((-np.log(p).sum(1) * weight).sum() / len(hashes))

    def learn(self, targets: dict[str, np.ndarray], weight: np.ndarray) -> None:
        hashes = targets["hashes"]
        for j in range(hashes.shape[1]):
            np.add.at(self.counts[j], hashes[:, j], weight)
        self.total += float(weight.sum())


class SampledPopularity:
    """Token frequencies for a :class:`~streamlearn.outputs.SampledCode`: an answer's loss
    is the cross-entropy of the step's candidates (its answers and drawn negatives, as the
    sampled head's loss sees them) weighted by how often each was an answer."""

    def __init__(self) -> None:
        self.counts: dict[bytes, float] = {}  # a token's m hashes (its identity in the code) -> answers

    def loss(self, targets: dict[str, np.ndarray], weight: np.ndarray) -> float:
        """Weighted mean loss of ``targets["answer"]`` (n,) among ``targets["choices"]``
        (c, m); with ``targets["negatives"]`` (k,) (a count part's step: the drawn
        choices), example i's softmax is over its own answer and those, as the head's loss."""
        c = np.array([self.counts.get(row.tobytes(), 0.0) for row in targets["choices"]]) + _ALPHA  # (c,)
        answer = targets["answer"]
        if "negatives" in targets:
            drawn = np.zeros(len(c), dtype=bool)
            drawn[targets["negatives"]] = True
            total = c[drawn].sum() + np.where(drawn[answer], 0.0, c[answer])  # (n,)
        else:
            total = c.sum()
        ce = -np.log(c[answer] / total)  # (n,)
        return float((ce * weight).sum() / len(weight))

    def learn(self, targets: dict[str, np.ndarray], weight: np.ndarray) -> None:
        for row, w in zip(targets["hashes"], weight):
            key = row.tobytes()
            self.counts[key] = self.counts.get(key, 0.0) + float(w)


class PatternPopularity:
    """Row frequencies of a :class:`~streamlearn.outputs.PatternCode` (T-Free): an
    answer's loss is the summed BCE of every row's frequency against its pattern."""

    def __init__(self, rows: int):
        self.counts = np.zeros(rows)  # (v,) answers whose pattern holds the row
        self.total = 0.0

    def loss(self, targets: dict[str, np.ndarray], weight: np.ndarray) -> float:
        owner, ids = _distinct_cells(targets)
        p = (self.counts + _ALPHA) / (self.total + 2 * _ALPHA)  # (v,)
        off = np.log1p(-p)  # log(1 - p): every row not in the pattern
        gain = np.zeros(len(weight))
        np.add.at(gain, owner, np.log(p[ids]) - off[ids])
        return float((-(off.sum() + gain) * weight).sum() / len(weight))

    def learn(self, targets: dict[str, np.ndarray], weight: np.ndarray) -> None:
        owner, ids = _distinct_cells(targets)
        np.add.at(self.counts, ids, weight[owner])
        self.total += float(weight.sum())


def _distinct_cells(targets: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """(answer, row) pairs of CSR patterns, each once (the head's targets are multi-hot)."""
    ids, offsets = targets["ids"], targets["offsets"]
    owner = np.repeat(np.arange(len(offsets) - 1), np.diff(offsets))
    rows = int(ids.max()) + 1 if len(ids) else 1
    cells = np.unique(owner * rows + ids)
    return cells // rows, cells % rows
