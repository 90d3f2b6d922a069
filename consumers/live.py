"""The worker's live history: the figures the dashboard draws (``streamlearn serve`` at
``/``), kept bounded in the state and committed with every checkpoint.

Every :data:`SAMPLE_S` of training or :data:`SAMPLE_RECORDS` records, whichever comes
first, and at each checkpoint, the figures since the last point become a new point: records consumed and learned, the stream position, lag per
partition, the prequential scores of the model and its counting baseline
(:mod:`streamlearn.prequential`), the training loss, checkpoint durations, dead letters
by reason, event-time lag. Counts are per point (a window), gauges are read at its end,
so two neighbours merge into one point exactly (:func:`merge`).

Bounded: past :data:`MAX_POINTS` points the older half is merged pairwise, so the history
spans the whole stream at a resolution that coarsens with age (the last minutes at full
resolution). A checkpoint writes only the points added or merged since the previous one
(kv :data:`~streamlearn.checkpoint.LIVE_NS`, through the codec), and a restarted worker
reads them back and goes on numbering; its first point is marked ``start``.

A point is committed with the checkpoint that follows it, so the dashboard is as fresh as
the last checkpoint (``worker.checkpoint_seconds``), and a checkpoint's own duration
appears in the point after it.

>>> h = LiveHistory([], gauges=lambda: Gauges(records=0, steps=0))
>>> for _ in range(3):
...     h.close()
>>> [n for n, _ in h.points], h.points[0][1]["start"]  # idle windows after the first make no point
([0], True)
"""
from __future__ import annotations

import dataclasses
import time
from collections import Counter
from typing import Any, Callable

from ..checkpoint import live_kv
from ..learner import StepReport
from ..prequential import Scores
from .handoff import Prepared

__all__ = ["Gauges", "LiveHistory", "MAX_POINTS", "SAMPLE_RECORDS", "SAMPLE_S", "merge"]

SAMPLE_S = 1.0  # seconds of training per point
SAMPLE_RECORDS = 1000  # or this many records, whichever comes first (a backlog is not one point)
MAX_POINTS = 1024  # past this the older half is merged pairwise: ~17 min at full resolution

_SUMS = ("dt", "consumed", "learned", "loss_sum", "loss_n", "skipped")  # per window: merged by adding


@dataclasses.dataclass(frozen=True)
class Gauges:
    """What the worker reads at a point's end: ``records`` (the stream position: records
    applied, all partitions, all runs), ``steps``, ``lag`` (partition -> records behind
    the end), ``event_lag_s`` (seconds since the newest event learned)."""

    records: int
    steps: int
    lag: dict[int, int] = dataclasses.field(default_factory=dict)
    event_lag_s: float | None = None


class _Window:
    """What happened since the last point."""

    def __init__(self) -> None:
        self.consumed = self.learned = self.loss_n = self.skipped = 0
        self.loss_sum = 0.0
        self.dead: Counter[str] = Counter()
        self.scores: Scores | None = None
        self.metric = self.baseline = None
        self.ckpt = {"n": 0, "sum": 0.0, "max": 0.0, "failed": 0, "rows": 0}

    @property
    def empty(self) -> bool:
        return not (self.consumed or self.ckpt["n"] or self.ckpt["failed"])

    def add_scores(self, scores: Scores) -> None:
        s = self.scores
        self.scores = scores if s is None else Scores(s.metric, s.examples + scores.examples,
                                                      s.model + scores.model, s.baseline + scores.baseline)

    def figures(self, t: float, dt: float, g: Gauges) -> dict[str, Any]:
        s = self.scores
        return {
            "t": t, "dt": dt, "records": g.records, "steps": g.steps, "consumed": self.consumed,
            "learned": self.learned, "loss_sum": self.loss_sum, "loss_n": self.loss_n, "skipped": self.skipped,
            "eval": None if s is None else {"metric": s.metric, "baseline": self.baseline, "n": s.examples,
                                            "model": s.model, "base": s.baseline},
            "lag": {str(p): n for p, n in sorted(g.lag.items())}, "event_lag": g.event_lag_s,
            "dead": dict(self.dead), "ckpt": dict(self.ckpt), "start": False,
        }


class LiveHistory:
    """The bounded history of one state's figures (see the module docstring).

    ``points``: ``[(number, figures)]`` oldest first, as :func:`~streamlearn.checkpoint.read_live`
    returns them; ``gauges()`` reads the worker's gauges when a point closes.
    """

    def __init__(self, points: list[tuple[int, dict]], gauges: Callable[[], Gauges], max_points: int = MAX_POINTS):
        self.points = list(points)
        self.gauges, self.max_points = gauges, max_points
        self._next = self.points[-1][0] + 1 if self.points else 0
        self._stored = {n for n, _ in self.points}  # numbers the state holds (or the next commit carries)
        self._changed: set[int] = set()
        self._window = _Window()
        self._opened = time.monotonic()
        self._first = True

    # ---------------------------------------------------------------- events
    def learned(self, item: Prepared, report: StepReport, scores: Scores | None, baseline: str) -> None:
        """A learned batch: its records, dead letters, loss and (every ``eval_every``-th)
        the prequential scores of the model and of ``baseline``."""
        w = self._window
        w.consumed += item.records
        w.learned += report.learned
        w.dead.update(item.dead)
        if report.skipped:
            w.skipped += 1
        elif report.examples:
            w.loss_sum += report.loss
            w.loss_n += 1
        if scores is not None:
            w.add_scores(scores)
            w.baseline = baseline

    def checkpointed(self, seconds: float, ok: bool, rows: int) -> None:
        c = self._window.ckpt
        if not ok:
            c["failed"] += 1
            return
        c["n"] += 1
        c["sum"] += seconds
        c["max"] = max(c["max"], seconds)
        c["rows"] += rows

    def tick(self) -> None:
        """Close the window once :data:`SAMPLE_S` have passed or :data:`SAMPLE_RECORDS`
        records were consumed since the last point."""
        if self._window.consumed >= SAMPLE_RECORDS or time.monotonic() - self._opened >= SAMPLE_S:
            self.close()

    def close(self) -> None:
        """End the window now: it becomes a point (unless nothing happened in it: an idle
        worker adds none), then the history is thinned if over its bound."""
        now = time.monotonic()
        if self._window.empty and not self._first:
            self._opened = now
            return
        figures = self._window.figures(time.time(), now - self._opened, self.gauges())
        figures["start"] = self._first
        self.points.append((self._next, figures))
        self._changed.add(self._next)
        self._next += 1
        self._window, self._opened, self._first = _Window(), now, False
        if len(self.points) > self.max_points:
            self._thin()

    def _thin(self) -> None:
        """Merge the older half pairwise (each pair keeps the newer number)."""
        half = len(self.points) // 2 // 2 * 2
        old, merged = self.points[:half], []
        for (_, a), (n, b) in zip(old[0::2], old[1::2]):
            merged.append((n, merge(a, b)))
            self._changed.add(n)
        self.points = merged + self.points[half:]
        self._changed &= {n for n, _ in self.points}

    # ---------------------------------------------------------------- commits
    def take_kv(self) -> dict[str, dict[bytes, bytes | None]]:
        """The kv entries a commit writes: points added or merged since the last call,
        and deletions of the points merged away. They count as stored from now on (a
        failed commit's entries are carried into the next one by the Checkpointer)."""
        present = {n for n, _ in self.points}
        changes: dict[int, dict | None] = {n: f for n, f in self.points if n in self._changed}
        changes.update({n: None for n in self._stored - present})
        self._stored, self._changed = present, set()
        return live_kv(changes)


def merge(a: dict, b: dict) -> dict:
    """Two neighbouring points as one (``a`` the older): window counts add, gauges are
    the newer point's, checkpoint durations keep their count, sum and maximum."""
    out = dict(b)
    for key in _SUMS:
        out[key] = (a.get(key) or 0) + (b.get(key) or 0)
    out["dead"] = dict(Counter(a.get("dead") or {}) + Counter(b.get("dead") or {}))
    out["ckpt"] = _merge_ckpt(a.get("ckpt") or {}, b.get("ckpt") or {})
    out["eval"] = _merge_eval(a.get("eval"), b.get("eval"))
    out["start"] = bool(a.get("start") or b.get("start"))
    return out


def _merge_ckpt(a: dict, b: dict) -> dict:
    out = {k: (a.get(k) or 0) + (b.get(k) or 0) for k in ("n", "sum", "failed", "rows")}
    out["max"] = max(a.get("max") or 0.0, b.get("max") or 0.0)
    return out


def _merge_eval(a: dict | None, b: dict | None) -> dict | None:
    if a is None or b is None or a.get("metric") != b.get("metric"):
        return b if b is not None else a
    return {**b, **{k: a[k] + b[k] for k in ("n", "model", "base")}}
