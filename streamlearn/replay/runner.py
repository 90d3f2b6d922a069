"""The replay loop: one pass over a source, every contestant on the same events.

Per mini-batch of arriving records (``learner.batch_size`` of them; a new classify model's
first batches take 1, 2, 4, ... records, :class:`~streamlearn.batching.Schedule`):

1. Build the events (the task's builder, ``Task.events``); a record that cannot be one is
   counted with its reason, never dropped silently.
2. The model(s) predict the arriving events as a batch, with the model as it was before
   the batch (it learns in mini-batch steps, as the worker trains).
3. Every baseline goes through the same events ONE RECORD AT A TIME, as river's
   ``progressive_val_score`` does: before predicting an event it learns every event whose
   label is due by then (``delay`` records earlier; with no delay, every event before it).
   So a baseline's figures never depend on the model's batch size.
4. Events whose label is due are revealed to the model in mini-batches: it learns them
   (prequential mode), and the metrics of every contestant are updated with the
   predictions made at arrival. A record the model rejects (e.g. a label beyond
   ``model.max_labels``) is scored for no one; a baseline that has learned it before the
   model's verdict keeps it (the verdict comes with the model's step).

Deterministic: the same records, config and seed give identical metrics (the learner is
seeded, baselines are deterministic, sources replay in a fixed order).
"""
from __future__ import annotations

import itertools
import time
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator, Sequence

from ..batching import Schedule
from ..exceptions import RecordError, StreamlearnError
from ..learner import Learner
from ..records import Record, reason_code
from .baselines import build_baselines
from ..tasks.base import Event
from .metrics import MetricSet
from .model import ModelContestant
from .sources import Item

__all__ = ["MODES", "ReplayOptions", "ReplayResult", "run_replay"]

MODES = ("prequential", "frozen")
_EXAMPLES = 5  # bad records quoted in the report


@dataclass(frozen=True)
class ReplayOptions:
    """``mode``: prequential (predict, then learn) or frozen (predict only). ``k``: list
    length of top-k metrics. ``window``: rolling metrics' window, in evaluated events.
    ``delay``: records between a record's arrival and its label (river's ``delay``).
    ``every``: rolling metrics are sampled for the plot every ``every`` evaluated events
    (None: window // 10). ``limit``: stop after this many records read."""

    mode: str = "prequential"
    k: int = 10
    window: int = 1000
    delay: int = 0
    baselines: tuple[str, ...] = ()
    seed: int = 0
    limit: int | None = None
    every: int | None = None

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise StreamlearnError(f"--mode {self.mode!r}: choose one of {', '.join(MODES)}")
        for name, low in (("k", 1), ("window", 1), ("delay", 0)):
            value = getattr(self, name)
            if not isinstance(value, int) or value < low:
                raise StreamlearnError(f"--{name} must be an integer >= {low}, got {value!r}")
        if self.limit is not None and self.limit < 0:
            raise StreamlearnError(f"--limit must be >= 0, got {self.limit}")

    @property
    def sample_every(self) -> int:
        return self.every or max(1, self.window // 10)


@dataclass
class Contestant:
    """A predictor with its metrics and its rolling-metric series."""

    name: str
    impl: Any  # ModelContestant or Baseline
    metrics: MetricSet
    seconds: float = 0.0
    series: dict[str, list[float]] = field(default_factory=dict)

    @property
    def is_model(self) -> bool:
        return isinstance(self.impl, ModelContestant)


@dataclass
class ReplayResult:
    """What one replay measured (``report.build_report`` turns it into the JSON report)."""

    task: str
    options: ReplayOptions
    contestants: list[Contestant]
    skipped: dict[str, str]
    records: int = 0
    evaluated: int = 0
    not_evaluated: int = 0
    bad: Counter = field(default_factory=Counter)
    rejected: Counter = field(default_factory=Counter)
    examples: list[dict] = field(default_factory=list)
    positions: list[int] = field(default_factory=list)  # x of the sampled series
    wall_s: float = 0.0

    @property
    def models(self) -> list[Contestant]:
        return [c for c in self.contestants if c.is_model]

    @property
    def baselines(self) -> list[Contestant]:
        return [c for c in self.contestants if not c.is_model]


def run_replay(items: Iterable[Item], learners: dict[str, Learner], options: ReplayOptions,
               progress: Any = None) -> ReplayResult:
    """Replay ``items`` through ``learners`` (name -> learner; the first one's config
    builds the events) and the baselines of ``options``; ``progress``: a tqdm-like bar."""
    if not learners:
        raise StreamlearnError("replay needs a model: --state DIR, --compare A B, or a config to start from scratch")
    first = next(iter(learners.values()))
    task, k = first.task, options.k
    learning = options.mode == "prequential"
    # fused: each model predicts from its training batch; not for two models whose stored
    # states the events would have to follow both (Task.events_read_state)
    fused = options.delay == 0 and (len(learners) == 1 or not task.events_read_state)
    contestants = [Contestant(name, ModelContestant(name, lr, learning, k, fused), _metrics(task.answers, options))
                   for name, lr in learners.items()]
    baselines, skipped = build_baselines(options.baselines, task.name, k, options.seed)
    contestants += [Contestant(b.name, b, _metrics(task.answers, options)) for b in baselines]
    result = ReplayResult(task.name, options, contestants, skipped)
    for c in contestants:
        c.series = {name: [] for name in c.metrics.names}
    bags = any(b.reads_tokens for b in baselines)  # else classify's events need no tokens
    loop = _Loop(result, task.events(options.seed, bags), _schedule(first, learning), progress, first.steps)
    started = time.perf_counter()
    loop.run(items)
    result.wall_s = time.perf_counter() - started
    return result


FROZEN_BATCH = 256  # records a frozen classify model predicts per call


def _schedule(learner: Learner, learning: bool) -> Schedule:
    """The learner's own mini-batches when it learns. A frozen classifier's answers do not
    depend on how the records are grouped, so it predicts FROZEN_BATCH records a call: at
    the learner's 8 a call's fixed costs (preparing, the forward's set-up) made frozen
    replay slower than prequential, whose step is one compiled call. The token tasks keep
    their batches: each record of theirs holds many events, each scored over every
    candidate."""
    if learning or learner.task.answers != "labels":
        return learner.schedule
    return Schedule(max(FROZEN_BATCH, learner.schedule.batch_size), ramp=False)


def _metrics(answers: str, options: ReplayOptions) -> MetricSet:
    return MetricSet(answers, options.k, options.window)


class _Loop:
    def __init__(self, result: ReplayResult, build: Callable[[int, Record], list[Event]], schedule: Schedule,
                 progress: Any, steps: int = 0):
        self.r, self.build, self.schedule, self.progress = result, build, schedule, progress
        self.steps = steps  # the first model's steps so far: its next batch's size (Schedule.size)
        self.pending: deque[Event] = deque()  # arrived, label not yet revealed to the model
        self.unlearned: deque[Event] = deque()  # arrived, not yet learned by the baselines
        self.rejected: set[int] = set()  # positions the model rejected (nobody learns them after)
        self.position = 0
        self._since_sample = 0

    def run(self, items: Iterable[Item]) -> None:
        for chunk in self._chunks(itertools.islice(items, self.r.options.limit)):
            arrived = self._arrive(chunk)
            self._predict(arrived)
            self._baselines_record_by_record(arrived)
            self.pending.extend(arrived)
            self._reveal_due(self.position - self.r.options.delay)
            if self.progress is not None:
                self.progress.update(len(chunk))
                self._show()
        self._reveal_due(None)  # labels still in flight at the end of the range arrive now
        self._sample(self.position, force=True)

    def _chunks(self, items: Iterator[Item]) -> Iterator[list[Item]]:
        """The mini-batches as they arrive. With no label delay each is revealed (and
        learned) before the next is cut, so each takes the schedule's size at the steps
        the model has taken: a batch of only bad records takes none, and the next keeps
        its size (double_batch_after and the 1, 2, 4, ... ramp count the model's steps; was:
        the chunk's index, and a fused batch then failed its check, "internal order error")."""
        if self.r.options.delay:
            yield from self.schedule.batches(items, self.steps)
            return
        while chunk := list(itertools.islice(items, self.schedule.size(self.steps))):
            yield chunk

    # ---- 1. arrival
    def _arrive(self, chunk: Sequence[Item]) -> list[Event]:
        events = []
        for item in chunk:
            self.position += 1
            self.r.records += 1
            if item.error is not None:
                self._bad(item.origin, item.error)
                continue
            try:
                events.extend(self.build(self.position, item.record))
            except RecordError as exc:
                self._bad(item.origin, str(exc))
        return events

    def _bad(self, origin: str, reason: str) -> None:
        self.r.bad[reason_code(reason)] += 1
        if len(self.r.examples) < _EXAMPLES:
            self.r.examples.append({"position": self.position, "where": origin, "reason": reason})

    # ---- 2. the models' predictions at arrival, per mini-batch
    def _predict(self, arrived: list[Event]) -> None:
        """Every arrived event goes to the models (a fused batch learns them all); the
        evaluated ones get their predictions."""
        for c in self.r.models:
            started = time.perf_counter()
            preds = c.impl.predict(arrived)
            c.seconds += time.perf_counter() - started
            for e, p in zip(arrived, preds):
                if e.evaluate:
                    e.preds[c.name] = p

    # ---- 3. the baselines, one record at a time
    def _baselines_record_by_record(self, arrived: list[Event]) -> None:
        delay = self.r.options.delay
        for e in arrived:
            self._baselines_learn(e.position - delay - 1)
            if e.evaluate:
                for c in self.r.baselines:
                    started = time.perf_counter()
                    e.preds[c.name] = c.impl.predict([e])[0]
                    c.seconds += time.perf_counter() - started
            self.unlearned.append(e)

    def _baselines_learn(self, upto: int | None) -> None:
        """The baselines learn every arrived event up to position ``upto`` (None: all), in
        order, one at a time."""
        while self.unlearned and (upto is None or self.unlearned[0].position <= upto):
            e = self.unlearned.popleft()
            if e.position in self.rejected:
                continue
            for c in self.r.baselines:
                started = time.perf_counter()
                c.impl.learn([e])
                c.seconds += time.perf_counter() - started

    # ---- 4. labels revealed to the model: learn, score
    def _reveal_due(self, upto: int | None) -> None:
        """One optimizer step per mini-batch of records (:class:`Schedule`), as arrived.
        Counted in records, not events: a next-token record brings an event per position,
        and split across mini-batches it would be learned once per piece. With no delay
        each chunk (:meth:`_chunks`) is one, as the fused model learned it when predicting."""
        due: list[Event] = []
        records = 0
        while self.pending and (upto is None or self.pending[0].position <= upto):
            new_record = not due or self.pending[0].position != due[-1].position
            if new_record and records == self.schedule.size(self.steps):
                self._reveal(due)
                due, records = [], 0
            records += new_record
            due.append(self.pending.popleft())
        if due:
            self._reveal(due)

    def _reveal(self, due: list[Event]) -> None:
        self.steps += 1
        rejected: dict[int, str] = {}
        for c in self.r.models:
            started = time.perf_counter()
            got = c.impl.learn(due)
            c.seconds += time.perf_counter() - started
            rejected = rejected or got  # the first model's verdict decides what is scored
        for reason in rejected.values():
            self.r.rejected[reason_code(reason)] += 1
        self.rejected.update(rejected)
        kept = [e for e in due if e.position not in rejected]
        for e in kept:
            if not e.evaluate:
                self.r.not_evaluated += 1
                continue
            self.r.evaluated += 1
            for c in self.r.contestants:
                c.metrics.update(e.target, e.preds[c.name])
            self._since_sample += 1
            self._sample(e.position)

    def _sample(self, position: int, force: bool = False) -> None:
        """Record every contestant's rolling metrics at stream ``position`` (the plot's x)."""
        every = self.r.options.sample_every
        if self._since_sample < every and not (force and self._since_sample):
            return
        self._since_sample = 0
        # A record holds several events (next-token, mlm): a second sample at its position
        # replaces the first (was: two points at one x, e.g. [..., 299, 300, 300])
        again = bool(self.r.positions) and self.r.positions[-1] == position
        if not again:
            self.r.positions.append(position)
        for c in self.r.contestants:
            for name, value in c.metrics.rolling().items():
                if again:
                    c.series[name][-1] = value
                else:
                    c.series[name].append(value)

    def _show(self) -> None:
        model = self.r.models[0]
        name = model.metrics.names[0]
        value = model.metrics.rolling()[name]
        self.progress.set_postfix({name: "n/a" if value is None else f"{value:.3f}", "bad": sum(self.r.bad.values())},
                                  refresh=False)
