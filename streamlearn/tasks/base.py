"""What every task offers (:class:`Task`), the base of the token-answering tasks
(:class:`TokenTask`), and the replay :class:`Event` a task builds for each record.

A task has three halves, all in its one module:

- ingest (numpy): its :class:`~streamlearn.batching.Preparer` subclass, ``task.prep``,
  which validates records, builds batches and keeps the stream-ordered state;
- model (torch): its head (:meth:`Task.make_head`), its loss, its readout of the
  encoder's states (:meth:`Task.outputs`), what it learns by counting after a step,
  and its answers (:meth:`Task.predict`, :meth:`Task.topk`);
- evaluation: the :class:`Event` replay asks every contestant about
  (:meth:`Task.events`); ``answers`` ("labels" or "tokens") tells replay which metrics
  and baselines apply.

Methods that run the model take ``(model, batch, dev)``: the learner chooses train or
eval mode, gradients or inference mode, and autocast around them.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Sequence

import numpy as np
import torch
from torch import nn

from ..batching import Batch, Preparer, seed_of
from ..config import Config
from ..counts.part import CountPart, count_order, count_seed
from ..counts.table import distinct
from ..decoding import CandidateIndex, Fresh, PatternIndex, TopK
from ..device import Device
from ..embeddings.base import add_sparse_grad
from ..exceptions import StreamlearnError
from ..featurize import Featurizer
from ..heads import output_head
from ..model import HashedTransformer
from ..outputs import OutputCode, output_code
from ..prequential import Check, TokenCheck
from ..records import Record

__all__ = ["ClosedForm", "CountLog", "Event", "Task", "TokenPreparer", "TokenTask"]


@dataclass(frozen=True)
class ClosedForm:
    """A step whose gradients a task computed in closed form (:meth:`Task.gradients`):
    the loss and the raw outputs of the forward it ran, before the step (None where
    they were not asked for), and the
    gradients, not yet on any ``.grad``: ``rows``, per row table (by its name in
    ``tables``), its unique ascending rows (U,) and their summed gradient rows (U, w);
    ``dense``, per dense parameter, the gradient of its first ``len(g)`` rows, the rows
    beyond holding zero weights and zero optimizer state that get no gradient (a label
    head's rows of labels not seen yet). The learner hands them straight to its
    optimizers, or writes them to ``.grad`` (:meth:`to_grad`) where a gradient hook
    reads them there."""

    loss: float
    outputs: torch.Tensor | None
    rows: dict[str, tuple[torch.Tensor, torch.Tensor]]
    dense: tuple[tuple[nn.Parameter, torch.Tensor], ...]
    tables: dict[str, nn.Parameter]

    def to_grad(self) -> None:
        """Add the gradients to the parameters' ``.grad`` as ``loss.backward()`` would:
        sparse and coalesced on the row tables, full-size (zero beyond the given rows)
        on the dense parameters."""
        for name, (rows, values) in self.rows.items():
            add_sparse_grad(self.tables[name], rows, values)
        for p, g in self.dense:
            full = torch.zeros_like(p)
            full[:len(g)] = g
            p.grad = full if p.grad is None else p.grad + full


@dataclass(eq=False)
class Event:
    """One record under evaluation in a replay, built when the record arrives (in stream
    order) so that every contestant is asked the same question.

    ``target``: the right answer (label, item or token); ``evaluate``: False when nothing
    can be asked yet (a next-item key's first event: learned, not scored); ``query``:
    what the model is asked (a Record, or a dict of tokens); ``tokens``: the record's
    tokens (bag-of-words baselines); ``prev``: the token or item before the answer (the
    Markov context); ``counts``/``transitions``: what counting baselines learn from it;
    ``key``: whose items are excluded from top-k lists (next-item), else None.
    """

    position: int
    record: Record
    target: Any
    evaluate: bool
    query: Any
    tokens: tuple[str, ...] = ()
    prev: str | None = None
    left: tuple[str, ...] = ()
    right: str | None = None
    counts: tuple[str, ...] = ()
    transitions: tuple[tuple[str, str], ...] = ()
    ngrams: tuple[tuple[str, str, str], ...] = ()
    key: str | None = None
    _seen: dict[str, int] | None = None  # the key's items -> their ordinal for the key
    _before: int = 0  # the key's events before this one
    _order: list[str] | None = None  # the key's distinct items, first seen first
    _n_seen: int = 0  # how many of them the key had when this event arrived
    preds: dict[str, Any] = field(default_factory=dict)

    def excluded(self, item: str) -> bool:
        """True if the answer list must skip ``item`` (the key already had it)."""
        return self._seen is not None and self._seen.get(item, self._before) < self._before

    @property
    def n_excluded(self) -> int:
        return self._n_seen

    def excluded_items(self, start: int = 0) -> list[str]:
        """The items :meth:`excluded` is True for, first seen first, from the ``start``-th
        on (a caller that resolved the first ``start`` already asks only for the rest)."""
        return self._order[start:self._n_seen] if self._order is not None else []


class Task:
    """One learning task (see the module docstring). Subclasses set the class
    attributes and implement the model half; ``Preparer`` is their ingest half."""

    name: ClassVar[str]
    answers: ClassVar[str]  # "labels" or "tokens"
    # Several workers can train one model of this task (scale-out): its stream-ordered
    # state merges between replicas (label tables; the token tasks' candidate index and
    # count part, replayed). next-item's per-key histories are not merged.
    replicable: ClassVar[bool] = False
    # A new model's first mini-batches take 1, 2, 4, ... records (batching.Schedule): classify,
    # whose empty label table answers none of a first whole batch. Not next-item: its first
    # tiny batches fill the row optimizers' accumulators with large gradients, and MovieLens
    # fell from 1.408x to 1.383x of Markov (seed 0).
    ramps_up: ClassVar[bool] = False
    # A replay's evaluated events of a record are its training examples, in order
    # (next-token: one per position; next-item: one per record whose key had an item
    # before), so a prequential replay predicts them from the training batch before
    # learning it (replay.model.ModelContestant) rather than from separate queries.
    events_are_examples: ClassVar[bool] = False
    # A replay's events read the first learner's stored state (next-item: each key's history
    # decides whether an event is scored and what it excludes), so a second learner's
    # training batch (replay --compare) would not match them: it is asked by queries.
    events_read_state: ClassVar[bool] = False
    # The token a query marks the position it asks about with (mlm's [MASK]): an
    # explanation never leaves it out. None: every query token is input.
    query_slot: ClassVar[str | None] = None
    target_field: ClassVar[str | None]  # the record field river's ``y`` fills (learn_one)
    Preparer: ClassVar[type[Preparer]]

    index: CandidateIndex | PatternIndex | None = None  # tokens the stream has shown (decoding)

    def __init__(self, cfg: Config, featurizer: Featurizer):
        self.cfg = cfg
        self.prep = self.new_preparer(featurizer)

    def new_preparer(self, featurizer: Featurizer) -> Preparer:
        return self.Preparer(self.cfg, featurizer)

    @staticmethod
    def catalogue_id(rec: Record) -> str | None:
        """The id a record adds to the catalogue the task's derived sizes follow
        (:mod:`streamlearn.sizing`; next-item: its item); None: the record names none."""
        return None

    # ------------------------------------------------------------------ model
    def make_head(self, d_model: int, embedding: nn.Module) -> nn.Module | None:
        """The task's head (the model owns it: its weights are the model's)."""
        raise NotImplementedError

    def before_step(self, model: HashedTransformer, batch: Batch) -> None:
        """Called for every training batch before its step (e.g. new labels' rows)."""

    def label_parameters(self, model: HashedTransformer) -> tuple[nn.Parameter, ...]:
        """Dense parameters whose row i belongs to label id i (a label head's weight and
        bias): a replica whose label ids change moves these rows (:mod:`streamlearn.sync`)."""
        return ()

    def loss(self, model: HashedTransformer, batch: Batch, dev: Device) -> torch.Tensor:
        """The training loss of a prepared training batch with examples."""
        raise NotImplementedError

    def has_closed_form(self, model: HashedTransformer, dev: Device) -> bool:
        """Whether :meth:`gradients` takes this model's steps (False: autograd does)."""
        return False

    def gradients(self, model: HashedTransformer, batch: Batch, dev: Device,
                  outputs: bool = True) -> ClosedForm | None:
        """The step of :meth:`loss` without autograd: the loss, the outputs (None unless
        ``outputs``: a step that predicts nothing skips what only the outputs need) and
        the loss's gradients (:class:`ClosedForm`; :meth:`ClosedForm.to_grad` puts them
        where ``loss(...).backward()`` would). None (the default) where the task or the
        model has no closed form: the learner runs autograd."""
        return None

    def outputs(self, model: HashedTransformer, batch: Batch, dev: Device) -> torch.Tensor:
        """Raw outputs of a prepared batch: label logits (N, n_labels), hashed logits
        (N, m, size) or T-Free logits (N, v)."""
        raise NotImplementedError

    def learned(self, batch: Batch) -> dict[str, np.ndarray]:
        """Called after every training batch's step: what the task keeps by counting
        (the candidate index, count tables); returns the count-table rows it changed."""
        return {}

    def count_tables(self) -> dict[str, torch.Tensor]:
        """Row tables learned by counting, not by gradient, by store name."""
        return {}

    def word_tables(self) -> frozenset[str]:
        """Those of :meth:`count_tables` whose float32 words hold bits (hashed keys,
        codes), not numbers: one may read as NaN (``inspect --verify`` knows)."""
        return frozenset()

    def rows_read(self, batch: Batch) -> dict[str, np.ndarray]:
        """Rows of :meth:`count_tables` a forward pass over ``batch`` reads."""
        return {}

    # Replicas (streamlearn.sync): state kept by counting that neither adds up nor
    # averages is merged by replaying what each replica counted since the last merge.
    def replayed_tables(self) -> frozenset[str]:
        """Count tables merged by :meth:`merge_logs`, never averaged or summed."""
        return frozenset()

    def keep_log(self, on: bool = True) -> None:
        """Start (or with ``on=False`` stop) keeping what :meth:`log` returns; call it
        while every replica is equal."""

    def log(self) -> Any:
        """What this replica counted since the last merge (picklable), for :meth:`merge_logs`."""
        return None

    def merge_logs(self, logs: Sequence[Any]) -> dict[str, np.ndarray]:
        """Take every replica's :meth:`log` (rank order, this one's among them); returns
        the count-table rows it changed."""
        return {}

    def whole_tables(self, model: HashedTransformer) -> frozenset[str]:
        """Row tables a query reads in full (a tied softmax output reads every row)."""
        return frozenset()

    def fresh(self, batch: Batch) -> Fresh | None:
        """Candidates a training batch brings that the candidate index does not hold yet,
        which its own predictions may name (next-item); None: none."""
        return None

    def hits(self, model: HashedTransformer, batch: Batch, dev: Device) -> int | None:
        """Correct answers on a training batch predicted before it is learned (the
        worker's cheap prequential check); None where the task has no such check."""
        return None

    def prequential_check(self) -> Check:
        """A new :class:`~streamlearn.prequential.Check`: the model's score on a training
        batch before it is learned and a counting baseline's (the worker's live figures)."""
        raise NotImplementedError

    # ------------------------------------------------------------------ answers
    def predict(self, model: HashedTransformer, batch: Batch, dev: Device) -> list:
        """``predict_many``'s answer per query record."""
        raise NotImplementedError

    def predict_proba(self, model: HashedTransformer, batch: Batch, dev: Device) -> list[dict]:
        """``{answer: probability}`` per query record."""
        raise StreamlearnError(
            f"predict_proba is defined for task classify, not {self.name}: use topk_many, "
            "whose scores are log-probabilities"
        )

    def probabilities(self, model: HashedTransformer, batch: Batch, dev: Device) -> np.ndarray:
        """Answer probabilities (N, answers) of a prepared batch, as an array."""
        raise StreamlearnError(f"predict_proba_batch is defined for task classify, not {self.name}")

    def known_probabilities(self, outputs: torch.Tensor | None, batch: Batch) -> np.ndarray:
        """From :meth:`outputs` of a training batch before its step: the answer
        probabilities over the answers known before the batch (prequential scoring)."""
        raise StreamlearnError(f"predict_learn_batch is defined for task classify, not {self.name}")

    def topk(self, model: HashedTransformer, batch: Batch, dev: Device, k: int, beam: int,
             exclude: Sequence[np.ndarray] | None = None) -> list[TopK]:
        """The k best answers per query record, best first, minus each record's
        ``exclude`` candidate ids."""
        raise NotImplementedError

    # ------------------------------------------------------------------ evaluation
    def events(self, seed: int, bags: bool = True) -> Callable[[int, Record], list[Event]]:
        """A replay's event builder: ``build(position, record) -> [Event, ...]`` in stream
        order (one event per answer the record asks for: one for most tasks, one per
        position for next-token; they share the record's position); RecordError for a
        record this task cannot use. ``bags``: a baseline reads ``Event.tokens`` as a
        bag of words (classify's; without one they are left empty)."""
        raise NotImplementedError


@dataclass(frozen=True)
class CountLog:
    """What a token task's replica counted since the last merge (:meth:`TokenTask.log`):
    the candidate index's new tokens, in order, and the count part's n-gram batches
    (M, n) of token hashes, in order."""

    new_tokens: list[str]
    grams: list[np.ndarray]

    @property
    def nbytes(self) -> int:
        """About what it weighs in transit."""
        return sum(t.nbytes for t in self.grams) + sum(len(t.encode()) for t in self.new_tokens)


class TokenPreparer(Preparer):
    """The ingest half of a token task: its training targets come from the output code."""

    def __init__(self, cfg: Config, featurizer: Featurizer, code: OutputCode):
        super().__init__(cfg, featurizer)
        self.code = code
        # the count part's token-hash seed; None: no count part (model.counts="none")
        self.count_seed = None if cfg.model.counts == "none" else count_seed(cfg.hashing.seed)
        self.count_order = count_order(cfg.model.counts)  # n of the n-grams it counts


class TokenTask(Task):
    """A task that answers with tokens over an output code (mlm, next-item, ...):
    Superbloom's hashed softmax or T-Free's head, decoded against the candidate index
    of the tokens the stream has shown."""

    answers = "tokens"

    def __init__(self, cfg: Config, featurizer: Featurizer):
        self.code: OutputCode = output_code(cfg, featurizer)
        super().__init__(cfg, featurizer)
        self.reset_index()
        # counted, not learned by gradient: its scores join the head's (heads.SampledHead)
        self.counter = None if cfg.model.counts == "none" else self.new_counter()
        # model.count_fit=joint: the step's loss is the joined softmax's, so it scores counts
        self.joint = self.counter is not None and cfg.model.count_fit == "joint"
        self._index_base: int | None = None  # replicas: the index's length at the last merge (keep_log)

    def new_counter(self):
        """The task's count part (``model.counts`` is set): the Kneser-Ney trigram part here,
        its counting compiled where ``learner.compiled`` is on."""
        return CountPart(self.cfg.model.count_slots, self.cfg.hashing.seed, self.cfg.model.recent,
                         order=count_order(self.cfg.model.counts), compiled=self.cfg.learner.compiled,
                         pairs=self.cfg.model.recent_pairs)

    def new_preparer(self, featurizer: Featurizer) -> "TokenPreparer":
        return self.Preparer(self.cfg, featurizer, self.code)

    def reset_index(self) -> None:
        """An empty candidate index (a restore replays the stored candidates into it)."""
        self.index = self.code.new_index()

    def make_head(self, d_model: int, embedding: nn.Module) -> nn.Module:
        width = embedding.row_tables()[self.code.table].shape[1] if self.code.table else d_model
        return output_head(d_model, self.code, width, separate=not self.joint)

    def readout(self, model: HashedTransformer, batch: Batch, feats: dict[str, torch.Tensor],
                dev: Device) -> torch.Tensor:
        """The states (n, d) the head reads: one per example."""
        raise NotImplementedError

    def _tied(self, model: HashedTransformer) -> torch.Tensor | None:
        return model.row_tables()[self.code.table] if self.code.table else None

    def score_counts(self, ctx: np.ndarray, cands: np.ndarray, n: int) -> np.ndarray:
        """The count part's scores (N, F, C) of candidates (C,) (token hashes) in the
        examples' contexts ``ctx`` (N, ...) (``batch.counts["ctx"]``), ``n`` candidates
        known; a task that hosts a count part implements it."""
        raise NotImplementedError

    def prediction_counts(self, batch: Batch, cands: np.ndarray, n: int) -> np.ndarray:
        """The count scores (N, F, C) a prediction of ``batch`` reads: the tables as they
        are (:meth:`score_counts`); next-token overrides it for training batches."""
        return self.score_counts(batch.counts["ctx"], cands, n)

    def logits(self, model: HashedTransformer, batch: Batch, dev: Device) -> torch.Tensor:
        states = self.readout(model, batch, dev.tensors(batch.feats), dev)
        inputs = dev.tensors(self.code.scoring_inputs(self.index))
        if self.counter is not None:
            cands = self.counter.candidates(self.index)
            inputs["counts"] = dev.tensor(self.prediction_counts(batch, cands, len(cands)))
        return model.head(states, self._tied(model), **inputs)

    def loss(self, model, batch, dev):
        """The head's loss on the batch's states (:meth:`step_targets`)."""
        states = self.readout(model, batch, dev.tensors(batch.feats), dev)
        targets = self.step_targets(batch)
        return model.head.fit_loss(states, dev.tensors(targets), dev.tensor(batch.weight), self._tied(model))

    def step_targets(self, batch: Batch) -> dict[str, np.ndarray]:
        """What the head's loss reads for a training batch; a sampled head's candidates
        are drawn from a generator seeded by the batch's sequence number (replays, and
        the worker's prequential check, repeat them)."""
        rng = np.random.default_rng(seed_of(self.cfg.learner.seed, f"negatives/{batch.seq}"))
        return self._step_targets(batch, rng)

    def _step_targets(self, batch: Batch, rng: np.random.Generator) -> dict[str, np.ndarray]:
        """The code's step targets: the network's own softmax (no count part, or a
        ``separate`` one, whose step reads no count score). With a ``joint`` count part,
        the choices are the distinct
        answers and negatives by token hash, ``negatives`` (k,) the drawn ones among them,
        and the count part's scores of each example's own answer (``own_counts`` (n, F))
        and of the negatives (``counts`` (n, F, k)): each example's softmax runs over its
        own answer and the drawn negatives only, as the research's objective. The batch's
        other answers are no negatives there: they come from the unigram distribution,
        not the uniform draw, and without a logQ correction they push frequent tokens
        down for every example. So the count part scores n (1 + k) cells, never the
        (n, answers + negatives) grid (profile: the grid's scoring was a sixth of a
        next-token step)."""
        if not self.joint:
            return self.code.step_targets(batch.targets, self.index, rng)
        cands = self.counter.candidates(self.index)  # (C,)
        K, n = self.code.negatives, len(cands)
        q, total = self.counter.proposal(cands) if n and K else (np.zeros(0), 0.0)
        ids = rng.choice(n, size=K, p=q) if n and K else np.empty(0, dtype=np.int64)
        answers = batch.counts["answer"]  # (n,)
        both = np.concatenate([answers, cands[ids]])
        keys, first, inverse = np.unique(both, return_index=True, return_inverse=True)
        inverse = inverse.reshape(-1)
        choices = np.concatenate([batch.targets["hashes"], self.index.hashes[ids]])[first]  # (c, m)
        negatives = distinct(inverse[len(answers):])  # (k,) sorted
        logq = np.log(K * self.counter.q_of(keys, total, n)) if n and K else np.zeros(len(keys))
        own, other = self.answer_and_negative_counts(batch.counts["ctx"], answers, keys[negatives], n)
        return {"choices": choices, "answer": inverse[:len(answers)], "negatives": negatives,
                "logq": logq.astype(np.float32), "counts": other, "own_counts": own}

    def answer_and_negative_counts(self, ctx: np.ndarray, answers: np.ndarray, negatives: np.ndarray,
                                   n: int) -> tuple[np.ndarray, np.ndarray]:
        """The count part's scores of each example's answer (N, F) and of the negatives
        (k,) (N, F, k), in two calls: the negatives' shared by every example, which the
        count part reads once per distinct context (next-token: a batch's examples share
        about half their previous tokens; measured 1.2 ms a step against 1.8 ms for one
        (N, 1 + k) grid)."""
        return self.score_counts(ctx, answers[:, None], n)[:, :, 0], self.score_counts(ctx, negatives, n)

    def outputs(self, model, batch, dev):
        return self.logits(model, batch, dev).float()

    def learned(self, batch: Batch) -> dict[str, np.ndarray]:
        """The candidate index learns the batch's tokens; the count part (if any) counts
        its n-grams, after the step: a step's count scores never include its own batch,
        as a prediction's never do."""
        if batch.candidates:
            self.index.add(batch.candidates)
        if self.counter is None or batch.counts is None:
            return {}
        return self.counter.learn(batch.counts["grams"])

    def count_tables(self) -> dict[str, torch.Tensor]:
        return {} if self.counter is None else self.counter.tables()

    def word_tables(self) -> frozenset[str]:
        return frozenset() if self.counter is None else self.counter.word_tables()

    def replayed_tables(self) -> frozenset[str]:
        return frozenset(self.count_tables())

    def keep_log(self, on: bool = True) -> None:
        """The candidate index's new tokens and the count part's trigram batches are
        logged from here (the count part's docstring says why counts are replayed)."""
        self._index_base = len(self.index) if on else None
        if self.counter is not None:
            self.counter.keep_log(on)

    def log(self) -> CountLog:
        base = self._index_base
        if base is None:
            raise StreamlearnError(f"task {self.name} keeps no log: call keep_log() when the replicas are equal")
        return CountLog(self.index.new_since(base), [] if self.counter is None else self.counter.log())

    def merge_logs(self, logs: Sequence[CountLog]) -> dict[str, np.ndarray]:
        """Every replica's new candidates join the index (rank order; its own are there
        already, so the index stays append-only: a replica's own tokens come before the
        others' of the same merge) and the count part replays every log."""
        for log in logs:
            self.index.add(log.new_tokens)
        self._index_base = len(self.index)
        return {} if self.counter is None else self.counter.merge([log.grams for log in logs])

    def whole_tables(self, model: HashedTransformer) -> frozenset[str]:
        """A tied head reads its input table in full, a sampled head its own tables, a
        count part its tables (hashed slots: which rows a query reads is known only once
        it probes)."""
        own = model.head.row_tables() if model.head is not None else {}
        return (frozenset(own) | frozenset(self.count_tables())
                | (frozenset({self.code.table}) if self.code.table else frozenset()))

    def prequential_check(self) -> TokenCheck:
        """The loss before the step against popularity in the output code."""
        return TokenCheck(self)

    def predict(self, model, batch, dev) -> list:
        """The best candidate token (None while the candidate index is empty)."""
        return [top.tokens[0] if top.tokens else None
                for top in self.topk(model, batch, dev, 1, self.cfg.learner.beam)]

    def decodable(self, model: HashedTransformer, batch: Batch, dev: Device) -> np.ndarray:
        """The scores the output code decodes, per query record: (N, m, size)
        log-probabilities (hashed), (N, v) logits (T-Free) or (N, candidates)
        log-probabilities (sampled)."""
        return model.head.decodable(self.outputs(model, batch, dev)).cpu().numpy()

    def topk(self, model, batch, dev, k, beam, exclude=None) -> list[TopK]:
        if not batch.records:
            return []
        return self.code.decode(self.decodable(model, batch, dev), self.index, k, beam, exclude)
