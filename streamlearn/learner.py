"""The :class:`Learner`: records in, one optimizer step per mini-batch, predictions out.

It owns the model (:class:`~streamlearn.model.HashedTransformer`), its optimizers (a
row-wise sparse optimizer for the embedding tables, AdamW for the dense weights), the
device, the label table, the next-item histories and the candidate index used to decode
top-k answers. Workers, replay and the service call nothing else on a model.

A training step is split so a worker can overlap ingest with training:

1. :meth:`Learner.prepare` (numpy only, no torch; :mod:`streamlearn.batching`): parse,
   validate and tokenize the records, hash them (``featurize``), apply the objective's
   corruption, and advance the state that must follow stream order: new labels join the
   label table and next-item histories take each record's item, in record order (a
   record's input is the key's items before it). Invalid records are not dropped:
   they are listed in ``Batch.rejected`` with their :class:`RecordError` (the message
   starts with a reason code: ``missing-field``, ``bad-value``, ``label-capacity``...).
2. :meth:`Learner.learn_batch`: one forward/backward and ONE optimizer step over the
   whole batch; reports the loss and the rows of each table that changed. A classifier
   with ``learner.nb_weight > 0`` also has a Naive Bayes part
   (:class:`~streamlearn.heads.NaiveBayesHead`): hashed (token, label) counts whose
   NB score (log-count ratios), times nb_weight, is added to the label logits; the step's loss sees
   that sum (the model learns what the counts get wrong), then the batch is counted.

``learn_many(records)`` is ``learn_batch(prepare(records))``: one mini-batch step, so
its batch size is the caller's. ``learn_one`` (river) is a step on a batch of one.
Batches must be learned in the order they were prepared, and a checkpoint may only be
taken when every prepared training batch has been learned (both are checked).

Seeded: the same config and the same records in the same batches give bit-identical
parameters (the masking RNG and dropout are seeded from ``learner.seed`` and the batch
number), also across a checkpoint/restore.
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Mapping
from typing import Any, Callable, Iterable

import numpy as np
import torch
import torch.nn.functional as F
from river import base as river_base

from .config import Config
from .decoding import CandidateIndex, PatternIndex, TopK, beam_topk_many, tfree_topk
from .exceptions import ConfigError, RecordError, StreamlearnError
from . import learner_state as persist
from .batching import QUERY_MASK, Batch, Preparer, seed_of
from .heads import NaiveBayesHead, multi_hot
from .model import HashedTransformer
from .objectives import Histories, LabelCapacityError, LabelTable
from .optim import RowOptimizer, dense_optimizer

__all__ = ["Batch", "LabelCapacityError", "Learner", "QUERY_MASK", "StepReport"]


@dataclasses.dataclass(frozen=True)
class StepReport:
    """What one :meth:`Learner.learn_batch` did. ``rows``: per row table, the sorted ids
    this step changed (its optimizer state tables ``"<table>.<state>"`` changed at the
    same ids). ``examples``: training examples; ``records``: records accepted."""

    loss: float
    examples: int
    records: int
    rejected: list[tuple[int, RecordError]]
    rows: dict[str, np.ndarray]
    step: int
    truncated: int


class Learner(river_base.Classifier):
    """Online learner over a hashed transformer (see the module docstring).

    >>> learner = Learner(Config().override("embedding.K=1000", "embedding.B=100", "model.layers=0"))
    >>> report = learner.learn_many([{"text": "free prize now", "label": "spam"},
    ...                              {"text": "meeting at noon", "label": "ham"}])
    >>> report.examples, sorted(learner.labels)
    (2, ['ham', 'spam'])
    >>> learner.predict_one({"text": "free prize"}) in ("spam", "ham")
    True
    """

    def __init__(self, cfg: Config | None = None):
        self.cfg = cfg if cfg is not None else Config()
        c = self.cfg
        self.task = c.learner.task
        self.device = pick_device(c.learner.device)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed_of(c.learner.seed, "dense-init"))
            self.model = HashedTransformer(c).to(self.device)
        self.row_optim = RowOptimizer(self.model.row_tables(), c.optim)
        self.dense_optim = dense_optimizer(list(self.model.dense_parameters().values()), c.optim)
        self.nb = _naive_bayes(c)
        self.prep = Preparer(c, self.model, self.nb)
        self.index = self._new_index()
        self.steps = 0  # optimizer steps taken
        self._applied = 0  # training batches learned
        self._dirty: dict[str, list[np.ndarray]] = {}
        self._index_mark = 0  # candidates already in a checkpoint
        # Called as gradient_hook(learner) after backward, before the optimizers step: the
        # gradients sit on the dense parameters and (sparse) on the row tables. Distributed
        # training all-reduces them here (consumers/distributed.py).
        self.gradient_hook: Callable[["Learner"], None] | None = None

    # ------------------------------------------------------------------ river verbs

    @property
    def _multiclass(self) -> bool:
        return True

    @property
    def label_table(self) -> LabelTable:
        return self.prep.label_table

    @property
    def histories(self) -> Histories:
        return self.prep.histories

    @property
    def labels(self) -> list:
        """Labels seen so far, in order of first appearance (a label's id is its position)."""
        return list(self.label_table.labels)

    def learn_one(self, x: Mapping, y: Any = None, w: float | None = None) -> None:
        """river: one step on a batch of one. ``y`` is the label (classify) or the item
        (next-item); ``w`` the sample weight. A rejected record raises its RecordError."""
        record = dict(x)
        if y is not None:
            record["item" if self.task == "next-item" else "label"] = y
        if w is not None:
            record["weight"] = w
        report = self.learn_many([record])
        if report.rejected:
            raise report.rejected[0][1]

    def predict_proba_one(self, x: Mapping, **kwargs: Any) -> dict:
        return self.predict_proba_many([x])[0]

    def predict_one(self, x: Mapping, **kwargs: Any) -> Any:
        return self.predict_many([x])[0]

    # ------------------------------------------------------------------ batch verbs

    def learn_many(self, records: Iterable) -> StepReport:
        """ONE mini-batch optimizer step over ``records`` (dicts or Record objects)."""
        return self.learn_batch(self.prepare(records))

    def predict_many(self, records: Iterable) -> list:
        """classify: the most probable label (None before any label); mlm/next-item: the
        best candidate token (None while the candidate index is empty)."""
        if self.task == "classify":
            return [max(p, key=p.get) if p else None for p in self.predict_proba_many(records)]
        return [top.tokens[0] if top.tokens else None for top in self.topk_many(records, k=1)]

    def predict_proba_many(self, records: Iterable) -> list[dict]:
        """classify: ``{label: probability}`` over the labels seen so far ({} before any)."""
        if self.task != "classify":
            raise StreamlearnError(
                f"predict_proba is defined for task classify, not {self.task}: use topk_many, "
                "whose scores are log-probabilities"
            )
        batch = self.prepare(records, train=False)
        if not batch.n_labels or not batch.records:
            return [{} for _ in range(batch.records)]
        probs = self.predict_proba_batch(batch)  # (N, n_labels)
        labels = self.label_table.labels[:batch.n_labels]
        return [dict(zip(labels, row.tolist())) for row in probs]

    def predict_proba_batch(self, batch: Batch) -> np.ndarray:
        """classify: label probabilities (N, n_labels) of an already prepared batch, a
        query batch or a training batch before :meth:`learn_batch` (prequential
        evaluation without tokenizing and hashing the records again)."""
        if self.task != "classify":
            raise StreamlearnError(f"predict_proba_batch is defined for task classify, not {self.task}")
        if not batch.n_labels or batch.feats is None:
            return np.zeros((batch.examples if batch.train else batch.records, batch.n_labels), np.float32)
        return self._infer(batch).softmax(-1).cpu().numpy()

    def topk_many(self, records: Iterable, k: int = 10, beam: int | None = None) -> list[TopK]:
        """The k best answers per record, best first, with scores (log-probabilities).

        mlm: at the first ``[MASK]`` of the record's tokens or text (one is appended when
        there is none: "complete this set"); next-item: after the key's history (or after
        the record's ``tokens``, if given). Candidates are the tokens the stream has shown;
        ``TopK.exact`` is Superbloom's certificate (always True for T-Free and classify).
        """
        batch = self.prepare(records, train=False)
        if not batch.records:
            return []
        if self.task == "classify":
            return self._label_topk(batch, k)
        out = self._infer(batch).float()
        if self.model.tfree_head is not None:
            return [tfree_topk(row, self.index, k) for row in out.cpu().numpy()]
        logp = F.log_softmax(out, dim=-1).cpu().numpy()  # (N, m, size)
        return beam_topk_many(logp, self.index, k, beam or self.cfg.learner.beam)

    def _label_topk(self, batch: Batch, k: int) -> list[TopK]:
        if not batch.n_labels:
            return [TopK([], np.empty(0), True, 0) for _ in range(batch.records)]
        logp = F.log_softmax(self._infer(batch).float(), -1).cpu()  # (N, n_labels)
        top = logp.topk(min(k, batch.n_labels), dim=-1)
        labels = self.label_table.labels
        return [TopK([labels[i] for i in ids.tolist()], s.numpy().astype(np.float64), True, batch.n_labels)
                for s, ids in zip(top.values, top.indices)]

    # ------------------------------------------------------------------ prepare

    def prepare(self, records: Iterable, train: bool = True) -> Batch:
        """Parse, validate, tokenize and hash ``records`` (see the module docstring).

        ``train=True`` advances stream-ordered state (label table, histories, the batch
        counter that seeds masking). ``train=False`` prepares a query batch and changes
        nothing; a bad query raises its RecordError (queries are not dead-lettered).
        """
        return self.prep.train(records) if train else self.prep.query(records)

    # ------------------------------------------------------------------ learn

    def learn_batch(self, batch: Batch) -> StepReport:
        """ONE optimizer step over a prepared training batch (none if it holds no
        example, e.g. only first events of next-item keys)."""
        if not batch.train:
            raise StreamlearnError("learn_batch needs a batch from prepare(records, train=True)")
        if batch.seq != self._applied:
            raise StreamlearnError(
                f"batch {batch.seq} learned out of order (expected batch {self._applied}): "
                "learn batches in the order prepare() made them"
            )
        loss, changed = 0.0, {}
        if batch.n_labels > batch.label_start:
            self.start_label_rows(range(batch.label_start, batch.n_labels))
        if batch.examples:
            loss, changed = self._step(batch)
            if self.nb is not None:
                changed["nb.counts"] = self._count(batch)
        self._applied += 1
        if batch.candidates:
            self.index.add(batch.candidates)
        return StepReport(loss, batch.examples, batch.records, batch.rejected, changed, self.steps, batch.truncated)

    def start_label_rows(self, ids: Iterable[int], labels: Iterable | None = None) -> None:
        """Give the label head rows ``ids`` their starting vectors, a function of
        ``learner.seed`` and the label alone (:class:`~streamlearn.heads.LabelHead`).
        ``labels``: the label of each id (default: this learner's label table's).
        :meth:`learn_batch` calls it for the labels a batch brought; call it for a label
        added any other way (e.g. a distributed label merge) so every replica starts that
        label alike."""
        ids = list(ids)
        labels = [self.label_table.labels[i] for i in ids] if labels is None else list(labels)
        scale = 1.0 if self.cfg.model.layers == 0 else 0.1  # unit-size pooled states behind a LayerNorm
        self.model.label_head.start_rows(ids, labels, seed_of(self.cfg.learner.seed, "label-head"), scale)

    def value_tables(self) -> dict[str, torch.Tensor]:
        """The row tables a forward pass reads, by store name: the embedding's and, with
        the Naive Bayes part, ``"nb.counts"`` (not the row optimizer's state tables)."""
        tables = dict(self.model.row_tables())
        if self.nb is not None:
            tables["nb.counts"] = self.nb.counts
        return tables

    def rows_read(self, batch: Batch) -> dict[str, np.ndarray]:
        """Per row table, the rows a forward pass over ``batch`` reads: the embedding's
        (``rows_touched``) and, with the Naive Bayes part, those of ``"nb.counts"``. A
        reader that loads rows lazily from a checkpoint must have these current."""
        rows = dict(self.model.embedding.rows_touched(batch.feats)) if batch.feats is not None else {}
        if self.nb is not None and batch.nb_tokens is not None and batch.n_labels:
            rows["nb.counts"] = self.nb.rows_read(batch.nb_tokens, batch.n_labels)
        return rows

    def _count(self, b: Batch) -> np.ndarray:
        """The Naive Bayes part counts the batch (after the step: the step's loss used
        the counts from before it, as its prediction did); returns the changed rows."""
        rows = self.nb.learn(b.nb_tokens, b.targets["labels"], b.weight)
        self.mark_dirty({"nb.counts": rows})
        return rows

    def _label_logits(self, b: Batch, feats: dict[str, torch.Tensor]) -> torch.Tensor:
        """The model's label logits (N, n_labels), plus ``learner.nb_weight`` times the
        Naive Bayes scores when that part is on (no gradient reaches the counts)."""
        logits = self.model.classify(feats, b.n_labels).float()
        if self.nb is None:
            return logits
        nb = torch.from_numpy(self.nb.scores(b.nb_tokens, b.n_labels))
        return logits + self.cfg.learner.nb_weight * nb.to(logits.device)

    def _step(self, batch: Batch) -> tuple[float, dict[str, np.ndarray]]:
        if not self.model.training:
            self.model.train()
        with self._dropout_rng(batch.seq), self._autocast():
            loss = self._loss(batch)
        loss.backward()
        if self.gradient_hook is not None:
            self.gradient_hook(self)
        return float(loss.detach()), self.apply_gradients()

    def apply_gradients(self) -> dict[str, np.ndarray]:
        """The optimizer half of a step: both optimizers apply the gradients that sit on
        the parameters (AdamW on the dense ones, the row rule on the touched rows), clear
        them, count the step and record the changed rows; returns them per table. A
        distributed rank without a batch of its own takes the group's step with it."""
        self.dense_optim.step()
        self.dense_optim.zero_grad(set_to_none=True)
        changed = self.row_optim.step()
        self.row_optim.zero_grad()
        self.steps += 1
        return self._record_dirty(changed)

    def _loss(self, b: Batch) -> torch.Tensor:
        feats = self._tensors(b.feats)
        weight = self._tensor(b.weight)
        if self.task == "classify":
            logits = self._label_logits(b, feats)  # (N, n_labels)
            ce = F.cross_entropy(logits, self._tensor(b.targets["labels"]), reduction="none")
            loss = (ce * weight).sum() / len(ce)
        else:
            x = self._readout(b, feats)  # (n, d)
            loss = self.model.output_loss(self.model.output(x), self._targets(b), weight)
        if b.sr_feats is not None:
            loss = loss + self.cfg.learner.shuffle_random * self._sr_loss(b)
        return loss

    def _readout(self, b: Batch, feats: dict[str, torch.Tensor]) -> torch.Tensor:
        """The states the output head reads: masked positions (mlm) or the pooled history."""
        if self.task == "mlm":
            return self.model.read_slots(feats, self._tensor(b.slots), self._tensor(b.rows), self._tensor(b.cols))
        return self.model.pool(self.model.encode(feats), feats["mask"])

    def _targets(self, b: Batch) -> torch.Tensor:
        if "hashes" in b.targets:
            return self._tensor(b.targets["hashes"])
        return multi_hot(self._tensor(b.targets["ids"]), self._tensor(b.targets["offsets"]), self.model.tfree_head.v)

    def _sr_loss(self, b: Batch) -> torch.Tensor:
        feats = self._tensors(b.sr_feats)
        h = self.model.encode(feats)  # (N, T, d)
        logits = self.model.sr_head(h[feats["mask"]])  # (M, 3)
        return F.cross_entropy(logits.float(), self._tensor(b.sr_labels))

    def outputs(self, batch: Batch) -> torch.Tensor:
        """The model's raw outputs for a prepared query batch: label logits (N, n_labels),
        hashed-output logits (N, m, size) or T-Free logits (N, v). For callers that decode
        a whole batch themselves (e.g. replay's batched exhaustive top-k)."""
        return self._infer(batch)

    @torch.inference_mode()
    def _infer(self, b: Batch) -> torch.Tensor:
        """Query outputs: label logits (N, n_labels), hashed logits (N, m, size) or
        T-Free logits (N, v)."""
        if self.model.training:  # eval() walks every module: measurable per query
            self.model.eval()
        feats = self._tensors(b.feats)
        with self._autocast():
            if self.task == "classify":
                return self._label_logits(b, feats)
            return self.model.output(self._readout(b, feats)).float()

    # ------------------------------------------------------------------ device

    def _dropout_rng(self, seq: int):
        """Dropout draws from a generator seeded by the batch number (then the global
        RNG is put back), so a restored learner drops the same units."""
        if self.cfg.model.dropout == 0:
            return contextlib.nullcontext()
        return _seeded_rng(self.device, seed_of(self.cfg.learner.seed, f"dropout/{seq}"))

    def _autocast(self):
        enabled = self.device.type == "cuda"
        return torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=enabled)

    def _tensor(self, a: np.ndarray) -> torch.Tensor:
        t = torch.from_numpy(np.ascontiguousarray(a))
        if self.device.type == "cuda":
            return t.pin_memory().to(self.device, non_blocking=True)
        return t

    def _tensors(self, feats: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
        return {name: self._tensor(a) for name, a in feats.items()}

    def _new_index(self) -> CandidateIndex | PatternIndex | None:
        if self.task == "classify":
            return None
        if self.model.tfree_head is not None:
            return PatternIndex(self.model.tfree_head.v, self.model.pattern_hasher)
        space = self.model.space
        return CandidateIndex(space.m, space.size, space.hasher)

    # ------------------------------------------------------------------ dirty rows

    def _record_dirty(self, changed: dict[str, torch.Tensor]) -> dict[str, np.ndarray]:
        out = {}
        for name, idx in changed.items():
            ids = idx.cpu().numpy()
            out[name] = ids
            for state in (name, *(f"{name}.{s}" for s in self.row_optim.state_names)):
                self._dirty.setdefault(state, []).append(ids)
        return out

    def mark_dirty(self, rows: Mapping[str, np.ndarray]) -> None:
        """Record rows changed outside :meth:`learn_batch` (e.g. replaced by a distributed
        average), keyed like :meth:`take_dirty`'s result, so the next checkpoint stores them."""
        for name, ids in rows.items():
            self._dirty.setdefault(name, []).append(np.asarray(ids, dtype=np.int64))

    def take_dirty(self) -> dict[str, np.ndarray]:
        """Sorted unique row ids changed per table (and per ``"<table>.<state>"``) since
        the last call; clears them."""
        dirty = {name: np.unique(np.concatenate(parts)) for name, parts in self._dirty.items()}
        self._dirty = {}
        return dirty

    # ------------------------------------------------------------------ persistence

    def checkpoint_parts(self, full: bool = False):
        """``(table_specs, rows, blobs, kv)`` for a store commit; see :mod:`streamlearn.learner_state`.

        Incremental (``full=False``): rows changed, history keys changed and candidates
        added since the previous call, which this call consumes; if the commit then
        fails, make the next checkpoint ``full=True``.
        """
        if self.prep.prepared != self._applied:
            raise StreamlearnError(
                f"{self.prep.prepared - self._applied} prepared batch(es) not learned yet: learn them "
                "before checkpointing, or the checkpoint would hold labels/histories of unapplied records"
            )
        return persist.checkpoint_parts(self, full)

    @classmethod
    def restore(cls, store, cfg: Config | None = None) -> "Learner":
        """A learner identical to the one checkpointed into ``store`` (its config unless
        ``cfg`` is given)."""
        learner = cls(cfg if cfg is not None else persist.stored_config(store))
        learner.load_from(store)
        return learner

    def load_from(self, store) -> None:
        """Overwrite this learner's state with the store's last checkpoint."""
        persist.load_into(self, store)


# ---------------------------------------------------------------------------- helpers

def intra_op_threads(cfg: Config) -> int:
    """torch intra-op threads for a process that trains or replays a learner:
    ``worker.torch_threads``, or one less than the CPUs this process may use. On a busy
    machine, oversubscribed OpenMP threads spin and can slow small steps down tens of
    times (measured here: a replay at 2 threads on a loaded 2-core box ran 70x slower)."""
    if cfg.worker.torch_threads > 0:
        return cfg.worker.torch_threads
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, cpus - 1)


def pick_device(name: str) -> torch.device:
    """"auto" -> CUDA when available, else CPU; otherwise the named device."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError as exc:
        raise ConfigError(f"learner.device={name!r} is not a device: use auto, cpu or cuda[:N]") from exc
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError("learner.device asks for CUDA but none is available: set learner.device=auto or cpu")
    return device


@contextlib.contextmanager
def _seeded_rng(device: torch.device, seed: int):
    # Seeds only this device's default generator: torch.manual_seed would also queue a
    # seed for every CUDA device, which records a stack trace on each call.
    cuda = device.type == "cuda"
    with torch.random.fork_rng(devices=[device] if cuda else []):
        gen = torch.cuda.default_generators[device.index or 0] if cuda else torch.default_generator
        gen.manual_seed(seed)
        yield




def _naive_bayes(cfg: Config) -> NaiveBayesHead | None:
    """The Naive Bayes part of a classifier (``learner.nb_weight > 0``), else None."""
    lc = cfg.learner
    if lc.task != "classify" or lc.nb_weight == 0:
        return None
    return NaiveBayesHead(lc.nb_cells, cfg.model.max_labels, lc.nb_alpha)
