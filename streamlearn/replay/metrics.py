"""Replay metrics: river's classification metrics, and river-style top-k metrics.

Every metric is kept twice: over the whole replay and over a rolling window of the last
``window`` evaluated events (river's ``utils.Rolling``, which reverts the oldest update), so
a report can say both "how good overall" and "how good lately" (the plotted curve).

Classification: :class:`river.metrics.Accuracy`, :class:`river.metrics.MacroF1` and the log
loss, computed by :class:`river.metrics.CrossEntropy` (equal to river's ``LogLoss`` when
there are two labels, and defined for any number of them, which a stream never announces).

Top-k tasks (next-item, mlm): :class:`RecallAtK` and :class:`MRR` below, written like
river's metrics (``update`` / ``revert`` / ``get``) since river has none. Each event has
one true item, so recall@k is the hit rate of the true item in the k-list.

>>> r, m = RecallAtK(k=2), MRR(k=2)
>>> for truth, ranked in [("a", ["b", "a", "c"]), ("c", ["a", "b"]), ("x", ["x"])]:
...     r.update(truth, ranked); m.update(truth, ranked)
>>> round(r.get(), 3), round(m.get(), 3)  # hits: 2 of 3; reciprocal ranks 1/2, 0, 1
(0.667, 0.5)
"""
from __future__ import annotations

import math
from typing import Any, Iterable, Sequence

from river import metrics as river_metrics
from river import utils as river_utils
from river.metrics.base import Metric

__all__ = ["MRR", "MetricSet", "RecallAtK", "classify_metrics", "metric_names", "topk_metrics"]

_PROB_FLOOR = 1e-15  # river's CrossEntropy clips at this probability too


class _TopKMetric(Metric):
    """The mean of a per-event score of a ranked list (best first) that depends only on the
    true item's rank in the first ``k``: kept as the weight of events at each rank, so a
    revert (a rolling window's oldest event) takes back exactly what its update added
    (was: river's running mean, whose reverts drifted, a window of misses reading 5e-18)."""

    def __init__(self, k: int = 10):
        if not isinstance(k, int) or k < 1:
            raise ValueError(f"k must be an integer >= 1, got {k!r}")
        super().__init__()
        self.k = k
        self._at = [0.0] * (k + 1)  # the weight of events whose true item ranked r (0: not in the first k)
        self._n = 0.0

    @property
    def bigger_is_better(self) -> bool:
        return True

    def works_with(self, model: Any) -> bool:
        return True

    def update(self, y_true: Any, y_pred: Sequence[Any], w: float = 1.0) -> None:
        self._at[self._rank(y_true, y_pred) or 0] += w
        self._n += w

    def revert(self, y_true: Any, y_pred: Sequence[Any], w: float = 1.0) -> None:
        self._at[self._rank(y_true, y_pred) or 0] -= w
        self._n -= w

    def get(self) -> float:
        if self._n <= 0:
            return 0.0
        return sum(self._score(rank) * weight for rank, weight in enumerate(self._at) if rank) / self._n

    def _rank(self, y_true: Any, y_pred: Sequence[Any]) -> int | None:
        """1-based rank of ``y_true`` in the first k of ``y_pred``, or None."""
        for rank, item in enumerate(list(y_pred)[: self.k], 1):
            if item == y_true:
                return rank
        return None


class RecallAtK(_TopKMetric):
    """Share of events whose true item is among the first ``k`` of the ranked list."""

    _fmt = ".6f"

    @staticmethod
    def _score(rank: int) -> float:
        return 1.0


class MRR(_TopKMetric):
    """Mean reciprocal rank of the true item within the first ``k`` (0 when absent): MRR@k."""

    _fmt = ".6f"

    @staticmethod
    def _score(rank: int) -> float:
        return 1.0 / rank


class _CrossEntropy(river_metrics.CrossEntropy):
    """river's CrossEntropy, but a label missing from ``y_pred`` has probability 0.

    river sums only over the labels present in ``y_pred``, so an empty prediction (a model
    that has not seen the true label yet) would cost nothing; here it costs -log(1e-15).
    """

    def update(self, y_true, y_pred, w=1.0):
        super().update(y_true, _with_truth(y_true, y_pred), w)

    def revert(self, y_true, y_pred, w=1.0):
        super().revert(y_true, _with_truth(y_true, y_pred), w)


def _with_truth(y_true: Any, proba: dict) -> dict:
    if y_true in proba:
        return proba
    return {**proba, y_true: 0.0}


class _Argmax:
    """A label metric updated with a probability dict: it scores the argmax label."""

    metric_cls: type = river_metrics.Accuracy

    def __init__(self) -> None:
        self.metric = self.metric_cls()

    def update(self, y_true: Any, proba: dict) -> None:
        self.metric.update(y_true, argmax(proba))

    def revert(self, y_true: Any, proba: dict) -> None:
        self.metric.revert(y_true, argmax(proba))

    def get(self) -> float:
        return self.metric.get()


class _Accuracy(_Argmax):
    metric_cls = river_metrics.Accuracy


class _LabelMacroF1(river_metrics.MacroF1):
    """river's MacroF1 over the labels that occur (as truth or prediction) in the current
    counts. A missing prediction (None: no label known yet) still counts against its
    record's label, but is no class of its own: river would average in a phantom "None"
    class with F1 0 (a binary stream would read 2/3 of its real macro F1)."""

    def get(self) -> float:
        cm = self.cm
        # Sorted: cm.classes is a set, whose order (string hashing) changes from one
        # process to the next, and so would the last digit of the sum.
        classes = sorted((c for c in cm.classes if c is not None and (cm.sum_row[c] or cm.sum_col[c])), key=repr)
        if not classes:
            return 0.0
        return sum(self._f1(c) for c in classes) / len(classes)

    def _f1(self, c: Any) -> float:
        cm = self.cm
        hit = cm[c][c]
        p = hit / cm.sum_col[c] if cm.sum_col[c] else 0.0
        r = hit / cm.sum_row[c] if cm.sum_row[c] else 0.0
        return 2 * p * r / (p + r) if p + r else 0.0


class _MacroF1(_Argmax):
    metric_cls = _LabelMacroF1


def argmax(proba: dict) -> Any:
    """The most probable label (the first one on ties, in the dict's order), None if empty."""
    return max(proba, key=proba.get) if proba else None


Spec = tuple[type, dict[str, Any]]  # a metric class and its constructor arguments


def classify_metrics() -> dict[str, Spec]:
    """Report name -> metric updated with (label, {label: probability})."""
    return {"accuracy": (_Accuracy, {}), "macro_f1": (_MacroF1, {}), "log_loss": (_CrossEntropy, {})}


def topk_metrics(k: int) -> dict[str, Spec]:
    """Report name -> metric updated with (item, ranked list)."""
    return {f"recall@{k}": (RecallAtK, {"k": k}), "mrr": (MRR, {"k": k})}


def _specs(answers: str, k: int) -> dict:
    """The metrics of a task that answers with ``answers`` ("labels" or "tokens")."""
    return classify_metrics() if answers == "labels" else topk_metrics(k)


def metric_names(answers: str, k: int) -> list[str]:
    return list(_specs(answers, k))


class MetricSet:
    """The metrics of one contestant (the model or a baseline): overall and rolling.

    ``update(y_true, y_pred)``: classify takes ``{label: probability}``, top-k tasks take
    the ranked list. ``overall()`` / ``rolling()``: ``{name: value}``, NaN-free; every
    value is None while nothing has been scored (an empty range or a file of bad records
    has no accuracy, which 0.0 would claim).
    """

    def __init__(self, answers: str, k: int, window: int):
        specs = _specs(answers, k)
        self.names = list(specs)
        self.window = window
        self._overall = {name: cls(**kw) for name, (cls, kw) in specs.items()}
        self._rolling = {name: river_utils.Rolling(cls, window_size=window, **kw) for name, (cls, kw) in specs.items()}
        self.count = 0

    def update(self, y_true: Any, y_pred: Any) -> None:
        self.count += 1
        for name in self.names:
            self._overall[name].update(y_true, y_pred)
            self._rolling[name].update(y_true, y_pred)

    def update_many(self, pairs: Iterable[tuple[Any, Any]]) -> None:
        for y_true, y_pred in pairs:
            self.update(y_true, y_pred)

    def overall(self) -> dict[str, float | None]:
        return {name: None if not self.count else _finite(m.get()) for name, m in self._overall.items()}

    def rolling(self) -> dict[str, float | None]:
        return {name: None if not self.count else _finite(m.get()) for name, m in self._rolling.items()}


def _finite(value: float) -> float:
    value = float(value)
    return value if math.isfinite(value) else 0.0
