"""Simple alternatives evaluated side by side with the model, on the same events.

Every baseline learns online, prequentially, in every replay mode (a frozen snapshot is
compared with baselines that learn as the stream goes), and sees exactly what the model
sees: the same tokens, the same history, the same excluded items, the same label delay.

Which baselines serve a task follows from what the task answers with
(``Task.answers``): labels (classify) or tokens (mlm, next-token, next-item).

=============  =============  ===================================================
name           answers        what it is
=============  =============  ===================================================
river-nb       labels         river MultinomialNB on the bag of words (counts)
river-logreg   labels         river TFIDF -> one-vs-rest LogisticRegression
vw             labels         Vowpal Wabbit ``--oaa`` logistic, when the
                              ``vowpalwabbit`` package is installed
popularity     labels,        labels: the label frequencies so far; tokens: the
               tokens         most frequent items so far
markov         tokens         first-order transitions from the previous item
                              (token), backfilled by popularity
ngram          tokens         next-token and next-item: an interpolated Kneser-Ney
                              trigram over the two previous tokens (items);
                              mlm: the two-sided n-gram of the masked token's
                              neighbours (:mod:`.counting`)
=============  =============  ===================================================

Every baseline predicts then learns one record at a time (the replay loop calls them
so). Top-k lists skip the event's excluded items; ties go to the more popular item, then
the item seen first.
"""
from __future__ import annotations

import re
from collections import Counter
from typing import Any, Sequence


from ..exceptions import StreamlearnError
from ..tasks import REGISTRY, task_class
from ..tasks.base import Event

__all__ = ["BASELINES", "Baseline", "build_baselines", "parse_baselines"]

BASELINES = ("river-nb", "river-logreg", "vw", "popularity", "markov", "ngram")
_SERVES = {"river-nb": ("labels",), "river-logreg": ("labels",), "vw": ("labels",),
           "popularity": ("labels", "tokens"), "markov": ("tokens",), "ngram": ("tokens",)}  # by Task.answers
VW_MAX_LABELS = 64  # --oaa needs the label count up front; each label costs one weight set


class Baseline:
    """``predict(events)``: classify -> ``{label: probability}`` per event; top-k tasks ->
    the ranked list. ``learn(events)``: the revealed events, in order. ``notes``: anything
    a reader of the report must know (e.g. labels a baseline could not learn)."""

    name = ""
    reads_tokens = False  # reads Event.tokens (a classify record's bag of words)

    def __init__(self) -> None:
        self.notes: list[str] = []

    def predict(self, events: Sequence[Event]) -> list:
        raise NotImplementedError

    def learn(self, events: Sequence[Event]) -> None:
        raise NotImplementedError


def parse_baselines(spec: str | None, task: str) -> list[str]:
    """``"river-nb,markov"`` -> names; ``"all"``: every baseline of the task; None/"": none."""
    if not spec:
        return []
    if spec.strip() == "all":
        return [name for name in BASELINES if _applies(name, task)]
    names = [n.strip() for n in spec.split(",") if n.strip()]
    unknown = [n for n in names if n not in BASELINES]
    if unknown:
        raise StreamlearnError(f"unknown baseline {unknown[0]!r} in --baselines; choose from "
                               f"{', '.join(BASELINES)} or 'all'")
    return list(dict.fromkeys(names))


def build_baselines(names: Sequence[str], task: str, k: int, seed: int = 0) -> tuple[list[Baseline], dict[str, str]]:
    """The baselines that apply, and ``{name: why it was skipped}`` for the others."""
    built, skipped = [], {}
    for name in names:
        if not _applies(name, task):
            served = [t for t in REGISTRY if _applies(name, t)]
            skipped[name] = f"{name} does not apply to task {task} (it serves {', '.join(served)})"
        elif name == "vw" and not vw_available():
            skipped[name] = "the vowpalwabbit package is not installed (pip install vowpalwabbit)"
        else:
            built.append(_make(name, task, k, seed))
    return built, skipped


def vw_available() -> bool:
    try:
        import vowpalwabbit  # noqa: F401
    except ImportError:
        return False
    return True


def _applies(name: str, task: str) -> bool:
    return task_class(task).answers in _SERVES[name]


def _make(name: str, task: str, k: int, seed: int) -> Baseline:
    from . import counting  # it builds on Baseline: imported once this module is loaded

    if name == "river-nb":
        return RiverNB()
    if name == "river-logreg":
        return RiverLogReg()
    if name == "vw":
        return VowpalWabbit(seed)
    if name == "popularity":
        return LabelFrequency() if task_class(task).answers == "labels" else counting.Popularity(k)
    return counting.Markov(k) if name == "markov" else counting.NGram(k)


# ---------------------------------------------------------------------------- classify

class _River(Baseline):
    """A river classifier fed one event at a time (river has no batch verbs without pandas)."""

    reads_tokens = True

    def __init__(self, model: Any):
        super().__init__()
        self.model = model

    def _x(self, event: Event) -> Any:
        raise NotImplementedError

    def predict(self, events: Sequence[Event]) -> list:
        return [dict(self.model.predict_proba_one(self._x(e))) for e in events]

    def learn(self, events: Sequence[Event]) -> None:
        for e in events:
            self.model.learn_one(self._x(e), e.target)


class RiverNB(_River):
    name = "river-nb"

    def __init__(self) -> None:
        from river import naive_bayes

        super().__init__(naive_bayes.MultinomialNB(alpha=1.0))

    def _x(self, event: Event) -> dict[str, int]:
        return Counter(event.tokens)  # the bag of words


class RiverLogReg(_River):
    name = "river-logreg"

    def __init__(self) -> None:
        from river import compose, feature_extraction, linear_model, multiclass, optim

        tfidf = feature_extraction.TFIDF(lowercase=False, tokenizer=str.split)
        # SGD(0.5): the default 0.01 barely moves on unit-norm TF-IDF vectors in one pass.
        logreg = linear_model.LogisticRegression(optimizer=optim.SGD(0.5))
        super().__init__(compose.Pipeline(tfidf, multiclass.OneVsRestClassifier(logreg)))

    def _x(self, event: Event) -> str:
        return " ".join(t.replace(" ", "_") for t in event.tokens)


_VW_SPECIAL = re.compile(r"[\s|:]")


class VowpalWabbit(Baseline):
    """``--oaa`` over the first :data:`VW_MAX_LABELS` labels; probabilities renormalised over
    the labels seen so far. Later labels are predicted never and counted in ``notes``."""

    name = "vw"
    reads_tokens = True

    def __init__(self, seed: int = 0):
        super().__init__()
        import vowpalwabbit

        self.ws = vowpalwabbit.Workspace(f"--oaa {VW_MAX_LABELS} --probabilities --loss_function logistic "
                                         f"-b 18 --random_seed {seed} --quiet")
        self.labels: dict[Any, int] = {}
        self.unlearnable = 0

    @staticmethod
    def _features(event: Event) -> str:
        return "| " + " ".join(_VW_SPECIAL.sub("_", t) for t in event.tokens)

    def predict(self, events: Sequence[Event]) -> list:
        if not self.labels:
            return [{} for _ in events]
        out = []
        for e in events:
            probs = self.ws.predict(self._features(e))
            seen = {label: float(probs[i - 1]) for label, i in self.labels.items()}
            total = sum(seen.values()) or 1.0
            out.append({label: p / total for label, p in seen.items()})
        return out

    def learn(self, events: Sequence[Event]) -> None:
        for e in events:
            label = self.labels.get(e.target)
            if label is None:
                if len(self.labels) == VW_MAX_LABELS:
                    self.unlearnable += 1
                    continue
                label = self.labels[e.target] = len(self.labels) + 1
            self.ws.learn(f"{label} {self._features(e)}")
        if self.unlearnable:
            self.notes = [f"{self.unlearnable} record(s) had a label beyond the first {VW_MAX_LABELS} "
                          "(--oaa capacity) and were not learned"]


class LabelFrequency(Baseline):
    """Predicts the label distribution seen so far (the majority label as its argmax)."""

    name = "popularity"

    def __init__(self) -> None:
        super().__init__()
        self.counts: dict[Any, int] = {}

    def predict(self, events: Sequence[Event]) -> list:
        total = sum(self.counts.values())
        proba = {label: n / total for label, n in self.counts.items()} if total else {}
        return [proba for _ in events]

    def learn(self, events: Sequence[Event]) -> None:
        for e in events:
            self.counts[e.target] = self.counts.get(e.target, 0) + 1
