"""The :class:`Learner`: records in, one optimizer step per mini-batch, predictions out.

It owns the model (:class:`~streamlearn.model.HashedTransformer`), its optimizers (a
row-wise sparse optimizer for the embedding tables, AdamW for the dense weights), the
device and the task (:mod:`streamlearn.tasks`: classify, mlm, next-item), which owns
what differs between tasks: the ingest half, the head, the loss, the readout, the
decoding, and the state that follows the stream (the label table, next-item histories,
the candidate index used to decode top-k answers). Workers, replay and the service
call nothing else on a model.

A training step is split so a worker can overlap ingest with training:

1. :meth:`Learner.prepare` (the task's :class:`~streamlearn.batching.Preparer`: numpy
   only, no torch): parse,
   validate and tokenize the records, hash them (``featurize``), apply the objective's
   corruption, and advance the state that must follow stream order: new labels join the
   label table and next-item histories take each record's item, in record order (a
   record's input is the key's items before it). Invalid records are not dropped:
   they are listed in ``Batch.rejected`` with their :class:`RecordError` (the message
   starts with a reason code: ``missing-field``, ``bad-value``, ``label-capacity``...).
2. :meth:`Learner.learn_batch`: one forward/backward and ONE optimizer step over the
   whole batch; reports the loss and the rows of each table that changed; then the
   task keeps what it learns by counting (the candidate index; a classifier's Naive
   Bayes counts, :mod:`streamlearn.tasks.classify`).

``learn_many(records)`` is ``learn_batch(prepare(records))``: one mini-batch step, so
its batch size is the caller's. ``learn_one`` (river) is a step on a batch of one.
Batches must be learned in the order they were prepared, and a checkpoint may only be
taken when every prepared training batch has been learned (both are checked).
``learn_many`` is a step or nothing: an exception before its step is taken (Ctrl-C
while its records are prepared, an error in the step) drops its batch
(:meth:`Learner.discard_prepared`), and Ctrl-C during the step is delivered when the
step ends; one thread at a time (a second caller is refused).

Seeded: the same config and the same records in the same batches give bit-identical
parameters (the masking RNG and dropout are seeded from ``learner.seed`` and the batch
number), also across a checkpoint/restore.
"""
from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import os
import signal
import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Callable, Iterable, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from river import base as river_base

from .batching import QUERY_MASK, Batch, Schedule, exclusions, fields_of, record_list, seed_of
from .compiled_loading import WhenLoaded
from .config import Config
from .decoding import TopK, check_beam, check_k
from .device import Device, adopt_threads
from .embeddings import build_embedding
from .exceptions import ConfigError, RecordError, StreamlearnError
from .explain import Explanation, Plan, explainer
from .featurize import input_rows
from .model import HashedTransformer
from .objectives import Histories, LabelCapacityError, LabelTable
from .optim import RowOptimizer, dense_optimizer
from .prequential import Check, Scores
from .records import from_features
from .sizing import OUT_B_MIN, Sizing, derived_keys
from .sync import Replica
from .tasks import build_task
from .tasks.base import ClosedForm

if TYPE_CHECKING:
    from .compiled import CompiledClassifyStep

__all__ = ["Batch", "LabelCapacityError", "Learner", "QUERY_MASK", "StepReport"]

log = logging.getLogger(__name__)

class DirtyRows:
    """The rows changed per table since the last :meth:`take`: one bit per row, so the
    memory is the tables' row counts in bits whatever the stream's length. (Lists of the
    ids each step changed grew by about 850 MB per 100k text records in a replay, which
    never checkpoints and so never emptied them.) ``follows``: state table -> the table
    whose changed rows are its changed rows too (a row optimizer's state changes with
    its table's rows): marked once, reported under both names."""

    def __init__(self, rows: Mapping[str, int], follows: Mapping[str, str] | None = None):
        self._rows = dict(rows)  # table name -> rows
        self._follows = dict(follows or {})
        self._bits: dict[str, np.ndarray] = {}

    def mark(self, name: str, ids: np.ndarray) -> None:
        bits = self._bits.get(name)
        if bits is None:
            bits = self._bits[name] = np.zeros(self._rows[name], dtype=bool)
        bits[ids] = True

    def take(self) -> dict[str, np.ndarray]:
        """Sorted unique row ids per table that changed, then all clear."""
        out = {}
        for name, bits in self._bits.items():
            ids = np.flatnonzero(bits)
            if len(ids):
                out[name] = ids
                bits[ids] = False
        for state, table in self._follows.items():
            if table in out:
                out[state] = np.union1d(out[state], out[table]) if state in out else out[table].copy()
        return out


# Gradients beyond this magnitude skip the step: squared (Adagrad's and Adam's second
# moments) they would come near float32's limit of 3.4e38.
MAX_GRADIENT = 1e15


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
    skipped: bool = False  # the step was not applied: its loss or a gradient was not finite

    @property
    def learned(self) -> int:
        """Records the model learned from: the accepted ones, none where the step was skipped."""
        return 0 if self.skipped else self.records

    def __repr__(self) -> str:
        # counts, not the arrays: a loop of learn_many at the REPL echoes one per step
        rows = {name: len(ids) for name, ids in self.rows.items()}
        return (f"StepReport(step={self.step}, loss={self.loss:.4g}, examples={self.examples}, "
                f"records={self.records}, rejected={len(self.rejected)}, rows={rows}, truncated={self.truncated}"
                + (", skipped=True)" if self.skipped else ")"))


def _grad_values(p: torch.nn.Parameter) -> torch.Tensor:
    """A parameter's gradient values: dense, or a sparse gradient's rows. A sparse one is
    coalesced in place (the row optimizer needs it coalesced: sorting once is enough)."""
    if not p.grad.is_sparse:
        return p.grad
    if not p.grad.is_coalesced():
        p.grad = p.grad.coalesce()
    return p.grad.values()


@contextlib.contextmanager
def _interrupt_after():
    """Ctrl-C (SIGINT) during the block is raised when the block ends, in the main thread
    (the only one Python delivers it to); a second Ctrl-C is raised at once (a step that
    hangs can still be stopped). Elsewhere, or under a handler Python did not install, the
    block runs as it is."""
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGINT) is None:
        yield
        return
    held: list = []

    def hold(signum, frame) -> None:
        if held:  # a second Ctrl-C: the step may hang (a dead peer); stop now, as without the hold
            signal.signal(signal.SIGINT, previous)
            held.clear()
            if callable(previous):
                previous(signum, frame)
            else:
                raise KeyboardInterrupt
            return
        held.append(frame)

    previous = signal.signal(signal.SIGINT, hold)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if held and callable(previous):
            previous(signal.SIGINT, held[0])
        elif held and previous == signal.SIG_DFL:
            os.kill(os.getpid(), signal.SIGINT)


def _safe(g: torch.Tensor) -> bool:
    """Whether every value of a closed-form gradient is finite and within
    :data:`MAX_GRADIENT` in magnitude: its largest and smallest value in numpy (NaN
    propagates through both), two reductions without a temporary, a few microseconds
    where torch's dispatch was most of the check's cost."""
    a = g.detach().cpu().numpy()
    return not a.size or bool(-MAX_GRADIENT < a.min() and a.max() < MAX_GRADIENT)


class Learner(river_base.Classifier):
    """Online learner over a hashed transformer (see the module docstring).

    ``task`` is the :class:`~streamlearn.tasks.base.Task` of ``learner.task`` (its name:
    ``task.name``); ``prep`` its ingest half; ``featurizer`` the embedding's numpy half.

    >>> learner = Learner(Config().override("embedding.K=1000", "embedding.B=100", "model.layers=0"))
    >>> report = learner.learn_many([{"text": "free prize now", "label": "spam"},
    ...                              {"text": "meeting at noon", "label": "ham"}])
    >>> report.examples, sorted(learner.labels)
    (2, ['ham', 'spam'])
    >>> learner.predict_one({"text": "free prize"}) in ("spam", "ham")
    True
    """

    # How the derived sizes of this model were chosen (streamlearn.sizing; stored with its
    # checkpoints); None: every size was given, or fell back to the documented value.
    sizing: Sizing | None = None

    def __init__(self, cfg: Config | None = None):
        """``cfg``: the model. A size it leaves to the stream (``model.out_B=0``, next-item's
        default) that nobody derived (the worker and replay do; :func:`~streamlearn.sizing.sized_config`
        for a sample) is :data:`~streamlearn.sizing.OUT_B_MIN` here."""
        if cfg is not None and not isinstance(cfg, Config):
            raise ConfigError(f"Learner takes a Config (None: the defaults), got {type(cfg).__name__}: read a TOML "
                              "file with streamlearn.load_config(path), or Config().override('section.key=value', ...)")
        cfg = cfg if cfg is not None else Config()
        if derived_keys(cfg):
            cfg = cfg.override(f"model.out_B={OUT_B_MIN}")
            log.info("model.out_B=0 and no stream to size it from: using %d (streamlearn.sizing.sized_config "
                     "sizes a config from a sample of records)", OUT_B_MIN)
        self.cfg = cfg
        c = self.cfg
        self.dev = Device.pick(c.learner.device)
        adopt_threads(c)  # torch's intra-op threads, unless the program chose a count (device.adopt_threads)
        self.featurizer, embedding = build_embedding(c.embedding, c.hashing.seed)
        self.task = build_task(c, self.featurizer)
        with torch.random.fork_rng(devices=[]):  # the model is built on the CPU: its generator alone, put back
            torch.default_generator.manual_seed(seed_of(c.learner.seed, "dense-init"))
            model = HashedTransformer(c, embedding, lambda: self.task.make_head(c.model.d_model, embedding))
        self.model = model.to(self.dev.torch)
        head_rows = frozenset(self.model.head.row_tables()) if self.model.head is not None else frozenset()
        self.row_optim = RowOptimizer(self.model.row_tables(), c.optim, outputs=head_rows)
        self.dense_optim = dense_optimizer(list(self.model.dense_parameters().values()), c.optim)
        # the step as one compiled call, where it applies (streamlearn.compiled)
        self._compiled: WhenLoaded[CompiledClassifyStep] | None = None
        if c.learner.compiled and self.task.has_closed_form(self.model, self.dev):
            self._compiled = WhenLoaded(self._bind_compiled)
        self.steps = 0  # optimizer steps taken
        self.skipped_steps = 0  # steps not applied: their loss or a gradient was not finite
        self._applied = 0  # training batches learned
        self._labels_learned = 0  # classify: labels the learned batches brought (the rest: prepared batches')
        self._learning = threading.Lock()  # learn_many's one caller (a Learner is not thread-safe)
        self._dirty = DirtyRows({name: t.shape[0] for name, t in self.row_tables().items()},
                                {f"{name}.{s}": name for name in self.row_optim.tables for s in self.row_optim.state_names})
        self._index_mark = 0  # candidates already in a checkpoint
        self._named = list(self.model.named_parameters())  # walked once: parameters never change identity
        # Called as gradient_hook(learner) after backward, before the optimizers step: the
        # gradients sit on the dense parameters and (sparse) on the row tables. Distributed
        # training all-reduces them here (consumers/allreduce.py, through self.replica).
        self.gradient_hook: Callable[["Learner"], None] | None = None

    # ------------------------------------------------------------------ parts

    @property
    def prep(self):
        """The task's ingest half (:class:`~streamlearn.batching.Preparer`): numpy only."""
        return self.task.prep

    def _bind_compiled(self) -> CompiledClassifyStep | None:
        from .compiled import CompiledClassifyStep  # imports numba: only for a learner that runs it

        step = CompiledClassifyStep.bind(self, MAX_GRADIENT)
        if step is not None:
            self.task.compiled_logits = step.logits  # queries and predictions too
        return step

    @property
    def runs_compiled(self) -> bool:
        """Whether its steps run as one compiled call (:mod:`streamlearn.compiled`: classify
        at depth 0 on the CPU with ``learner.compiled``), not as torch's ops; a worker's
        learner runs torch's until the kernels are loaded (:mod:`streamlearn.compiled_loading`)."""
        return self._compiled is not None and self._compiled() is not None

    @property
    def device(self) -> torch.device:
        return self.dev.torch

    @property
    def schedule(self) -> Schedule:
        """How many records each of this learner's mini-batches takes, by step number
        (``learner.batch_size``, the task's ramp, ``learner.double_batch_after``): the
        worker, replay and the benchmarks cut a stream by it, from :attr:`steps` on."""
        lc = self.cfg.learner
        return Schedule(lc.batch_size, self.task.ramps_up, lc.double_batch_after)

    @property
    def index(self):
        """The candidate index of a token-answering task (None for classify)."""
        return self.task.index

    @property
    def label_table(self) -> LabelTable | None:
        return self.prep.label_table

    @property
    def replica(self) -> Replica:
        """This learner as one replica of a group training one model
        (:mod:`streamlearn.sync`): what replicas exchange, read and written as buffers a
        transport moves (dense values and gradients, touched rows, labels, counts)."""
        return Replica(self)

    @property
    def histories(self) -> Histories | None:
        return self.prep.histories

    @property
    def labels(self) -> list:
        """Labels seen so far, in order of first appearance (a label's id is its position)."""
        return list(self.label_table.labels) if self.label_table is not None else []

    # ------------------------------------------------------------------ river verbs

    @property
    def _multiclass(self) -> bool:
        return True

    def learn_one(self, x: Mapping, y: Any = None, w: float | None = None) -> None:
        """river: one step on a batch of one. ``x`` is a record (``{"text": ...}``,
        ``{"tokens": [...]}``, ...) or river's bag of words ``{token: count}``; ``y`` is the
        record's answer field (the label for classify, the item for next-item); ``w`` the
        sample weight. A rejected record raises its RecordError."""
        record = self._from_features(x)
        if y is not None:
            if self.task.target_field is None:
                raise StreamlearnError(f"task {self.task.name} learns from the record's tokens: pass y=None")
            record[self.task.target_field] = y
        if w is not None:
            record["weight"] = w
        report = self.learn_many([record])
        if report.rejected:
            raise report.rejected[0][1]

    def predict_proba_one(self, x: Mapping, **kwargs: Any) -> dict:
        return self.predict_proba_many([self._from_features(x)])[0]

    def predict_one(self, x: Mapping, **kwargs: Any) -> Any:
        return self.predict_many([self._from_features(x)])[0]

    def _from_features(self, x: Mapping) -> dict:
        """river's ``x`` as a record (:func:`~streamlearn.records.from_features`): counts
        taken up to what the model reads, ``{"key": n, "item": m}`` a next-item record only
        for a learner that keeps key histories (else the words "key" and "item")."""
        return from_features(x, self.cfg.hashing.max_tokens + 1, keyed=self.histories is not None)

    # ------------------------------------------------------------------ batch verbs

    def learn_many(self, records: Iterable) -> StepReport:
        """ONE mini-batch optimizer step over ``records`` (dicts or Record objects).

        A step or nothing: if anything interrupts it before the step is taken (Ctrl-C
        while the records are prepared, an exception in the step), its batch is dropped
        as :meth:`discard_prepared` drops one, and the learner goes on. Ctrl-C during the
        step (main thread) is held until the step ends, then raised: a step cut half-way
        would leave rows changed that no checkpoint knows of. A Learner is not
        thread-safe: a call while another thread's is running raises StreamlearnError."""
        if not self._learning.acquire(blocking=False):
            raise StreamlearnError(
                "a Learner is not thread-safe: learn_many is running in another thread; call it from one "
                "thread at a time (a lock around your calls), or give each thread its own Learner")
        try:
            self._refuse_pending("learn_many")
            applied, labels = self._applied, len(self.labels)
            try:
                batch = self.prepare(records)
                with _interrupt_after():
                    return self.learn_batch(batch)
            except BaseException:
                if self._applied == applied:  # its step not taken: drop what its prepare did
                    self._drop_prepared(labels)
                raise
        finally:
            self._learning.release()

    def discard_prepared(self) -> int:
        """Drop the training batches :meth:`prepare` made that were not learned (a
        ``prepare`` never followed by :meth:`learn_batch`); returns how many. They count
        as learned with nothing learned (the batch counter moves past them), and labels
        they alone brought leave the label table. What stays: next-item histories keep
        their records' items, and a dictionary embedding scheme (``embedding.scheme``
        with a vocabulary) keeps the ids it gave their new tokens (unlearned rows)."""
        pending = self.pending
        if pending:
            self._drop_prepared(self._labels_learned)
        return pending

    def _drop_prepared(self, labels: int) -> None:
        """Every prepared batch counts as learned; the label table keeps its first
        ``labels``; gradients a failed step left are cleared."""
        self._applied = self.prep.prepared
        if self.label_table is not None and len(self.label_table) > labels:
            self.replace_labels(self.labels[:labels])
        self.dense_optim.zero_grad(set_to_none=True)
        self.row_optim.zero_grad()

    def _refuse_pending(self, verb: str) -> None:
        if self.pending:
            raise StreamlearnError(
                f"{verb}: {self.pending} training batch(es) from prepare() are not learned yet (batch {self._applied} "
                "is next): learn them in order with learn_batch(batch), or drop them with "
                "learner.discard_prepared()")

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        del state["_learning"]  # a lock cannot be pickled or deep-copied; a copy gets its own
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._learning = threading.Lock()

    def predict_many(self, records: Iterable) -> list:
        """classify: the most probable label (None before any label); token tasks: the
        best candidate token (None while the candidate index is empty)."""
        batch = self.prepare(records, train=False)
        with self._inference():
            return self.task.predict(self.model, batch, self.dev)

    def predict_proba_many(self, records: Iterable) -> list[dict]:
        """classify: ``{label: probability}`` over the labels seen so far ({} before any)."""
        batch = self.prepare(records, train=False)
        with self._inference():
            return self.task.predict_proba(self.model, batch, self.dev)

    def topk_many(self, records: Iterable, k: int = 10, beam: int | None = None,
                  exclude: Sequence[np.ndarray] | None = None) -> list[TopK]:
        """The k best answers per record, best first, with scores (log-probabilities).

        mlm: at the first ``[MASK]`` of the record's tokens or text (one is appended when
        there is none: "complete this set"); next-item: after the key's history (or after
        the record's ``tokens``, if given). Candidates are the tokens the stream has shown;
        a record's ``exclude`` (tokens or item ids) and ``exclude`` here (per record,
        candidate ids, ``index.ids(tokens)``) are left out of its list.
        ``TopK.exact`` is Superbloom's certificate (always True for T-Free and classify).
        ``beam`` (the hashed head's search width): ``learner.beam``, or k if larger; a
        beam given below k can list fewer than k answers.
        """
        check_k(k), check_beam(beam)  # before the records are prepared
        records = record_list(records)
        batch = self.prep.query(records, empty_tokens=True)
        return self.topk_batch(batch, k, beam, self.query_exclusions(records, exclude))

    def query_exclusions(self, records: list, exclude: Sequence[np.ndarray] | None = None) -> list[np.ndarray] | None:
        """Per query record, the candidate ids its list leaves out: its ``exclude`` field's
        tokens (:func:`~streamlearn.batching.exclusions`; checked by ``prep.query``) and
        ``exclude``'s ids; None where there are none."""
        asked = [fields_of(r).get("exclude") for r in records]
        if all(e is None for e in asked):
            return exclude
        ids = [self.index.ids(exclusions(e, i)) if e is not None else np.empty(0, dtype=np.int64)
               for i, e in enumerate(asked)]
        return ids if exclude is None else [np.concatenate([a, np.asarray(b, dtype=np.int64)]) for a, b in zip(ids, exclude)]

    def topk_batch(self, batch: Batch, k: int = 10, beam: int | None = None,
                   exclude: Sequence[np.ndarray] | None = None) -> list[TopK]:
        """:meth:`topk_many` of an already prepared query batch, or of a training batch
        before :meth:`learn_batch` (a prequential replay's: a list per example; next-item's
        also name the items the batch's earlier records brought, and ``exclude`` may hold
        their ids after the index's, ``Task.fresh``). DecodingError unless ``k`` is an int
        >= 1 and ``beam`` one or None."""
        # the default beam goes at least k deep: a beam search narrower than k lists fewer than
        # k answers where more candidates exist; a beam given is taken as given
        k, beam = check_k(k), check_beam(beam)
        beam = max(self.cfg.learner.beam, k) if beam is None else beam
        with self._inference():
            return self.task.topk(self.model, batch, self.dev, k, beam, exclude)

    def predict_proba_batch(self, batch: Batch) -> np.ndarray:
        """classify: label probabilities (N, n_labels) of an already prepared batch, a
        query batch or a training batch before :meth:`learn_batch` (prequential
        evaluation without tokenizing and hashing the records again)."""
        with self._inference():
            return self.task.probabilities(self.model, batch, self.dev)

    def prequential_hits(self, batch: Batch) -> int | None:
        """Correct answers on a training batch predicted before learning it (the
        worker's cheap prequential check); None where the task has none or the batch
        holds no example."""
        with self._inference():
            return self.task.hits(self.model, batch, self.dev)

    def prequential(self, batch: Batch, check: Check) -> Scores | None:
        """``check``'s scores (:meth:`Task.prequential_check`) of a training batch before
        :meth:`learn_batch`: the model's and a counting baseline's (the worker's live figures)."""
        with self._inference():
            return check.score(self.model, batch, self.dev)

    def learn_batch_scored(self, batch: Batch, check: Check) -> tuple[Scores | None, StepReport]:
        """:meth:`prequential` then :meth:`learn_batch` on one training batch (the worker's
        evaluated batches). classify scores the logits the step's own forward gave
        (:meth:`predict_learn_batch`'s), so where the step is closed-form (depth 0 on the
        CPU) one forward serves both: the worker's separate evaluation forward was 15% of
        its wall time (bench/worker.py, SMS, every 10th batch). Other tasks score first,
        in inference mode."""
        if self.task.answers != "labels":
            scores = self.prequential(batch, check)
            return scores, self.learn_batch(batch)
        baseline = check.baseline_hits(batch)  # before the step counts the batch
        report, outputs = self._learn(batch, predict=True)
        return check.scores_of(outputs, batch, baseline), report

    def explain_many(self, records: Iterable, outputs: Sequence | None = None, k: int = 5) -> list[Explanation]:
        """Per record, why the model answers as it does (:mod:`streamlearn.explain`): each
        token's contribution to ``outputs[i]`` (a label, or a token; None: the best
        answer), the top ``k`` answers (an int >= 1), each token's importance weights."""
        check_k(k)  # before the records are prepared
        return self.explain_batch(self.explain_plan(records, outputs), k)

    def explain_plan(self, records: Iterable, outputs: Sequence | None = None) -> Plan:
        """:meth:`explain_many`'s preparation (numpy): its ``batch`` lists the rows the
        explanation reads (:meth:`rows_read`). RecordError for a bad query."""
        return explainer(self).plan(records, outputs)

    def explain_batch(self, plan: Plan, k: int = 5) -> list[Explanation]:
        """:meth:`explain_many` of a prepared :class:`~streamlearn.explain.Plan`."""
        k = check_k(k)
        with self._inference():
            return explainer(self).run(plan, k)

    def outputs(self, batch: Batch) -> torch.Tensor:
        """The model's raw outputs for a prepared query batch: label logits (N, n_labels),
        hashed-output logits (N, m, size) or T-Free logits (N, v)."""
        with self._inference():
            return self.task.outputs(self.model, batch, self.dev)

    @contextlib.contextmanager
    def _inference(self):
        """Eval mode (only when needed: eval() walks every module, measurable per query),
        no autograd. Float32 on every device: only training autocasts to bf16 on CUDA, so
        answers, explanations and the live checks on a GPU are the CPU's to float rounding
        (bf16 moved leave-one-out contributions by up to 0.007 in 0.1 on an H100), and a
        snapshot answers alike wherever it is served."""
        if self.model.training:
            self.model.eval()
        with torch.inference_mode():
            yield

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
        return self._learn(batch, predict=False)[0]

    def predict_learn_batch(self, batch: Batch) -> tuple[np.ndarray, StepReport]:
        """classify, prequentially: the label probabilities (examples, label_start) the
        model gave each example of a training batch before learning it, over the labels
        known before the batch (one the batch brings cannot be predicted before it is
        learned), and :meth:`learn_batch`'s step. Where the step is closed-form (depth 0
        on the CPU) its own forward is the prediction: one forward for both; otherwise
        a forward in inference mode runs first."""
        if self.task.answers != "labels":  # refused before anything is learned
            raise StreamlearnError(f"predict_learn_batch is defined for task classify, not {self.task.name}")
        report, outputs = self._learn(batch, predict=True)
        return self.task.known_probabilities(outputs, batch), report

    def _learn(self, batch: Batch, predict: bool) -> tuple[StepReport, torch.Tensor | None]:
        if not batch.train:
            raise StreamlearnError("learn_batch needs a batch from prepare(records, train=True)")
        if batch.seq != self._applied:
            raise StreamlearnError(
                f"batch {batch.seq} learned out of order (expected batch {self._applied}): "
                "learn batches in the order prepare() made them (learner.discard_prepared() drops "
                "the ones not learned)"
            )
        loss, changed, skipped, outputs = 0.0, {}, False, None
        self.task.before_step(self.model, batch)
        if batch.examples:
            loss, changed, skipped, outputs = self._step(batch, predict)
        # The step is taken: the batch is learned from here on, whatever the counting does
        # (learn_many drops only a batch whose step was not taken; was: an error in the
        # counting dropped the labels the step had just trained)
        self._applied += 1
        self._labels_learned = max(batch.label_start, batch.n_labels)
        counted = {} if skipped else self.task.learned(batch)
        if counted:
            changed.update(counted)
            self.mark_dirty(counted)
        report = StepReport(loss, batch.examples, batch.records, batch.rejected, changed, self.steps, batch.truncated,
                            skipped)
        return report, outputs

    def start_label_rows(self, ids: Iterable[int], labels: Iterable | None = None) -> None:
        """classify: give the label head rows ``ids`` their starting vectors, a function
        of ``learner.seed`` and the label alone (:class:`~streamlearn.heads.LabelHead`).
        ``labels``: the label of each id (default: this learner's label table's).
        :meth:`learn_batch` does it for the labels a batch brought; call it for a label
        added any other way (e.g. a distributed label merge) so every replica starts that
        label alike."""
        self.task.start_label_rows(self.model, ids, labels)

    def value_tables(self) -> dict[str, torch.Tensor]:
        """The row tables a forward pass reads, by store name: the embedding's and the
        task's count tables (e.g. ``"nb.counts"``; not the row optimizer's state tables)."""
        return {**self.model.row_tables(), **self.task.count_tables()}

    def row_tables(self) -> dict[str, torch.Tensor]:
        """Every row table of the learner, by store name: :meth:`value_tables` and the row
        optimizer's state tables (``"E.sum"``; ``"E.exp_avg"``, ``"E.exp_avg_sq"``), the
        tables a checkpoint stores and replicas average."""
        return {**self.value_tables(), **self.row_optim.state_tables()}

    def rows_read(self, batch: Batch) -> dict[str, np.ndarray]:
        """Per row table, the rows a forward pass over ``batch`` reads: the embedding's
        and the task's count tables'. A reader that loads rows lazily from a checkpoint
        must have these current."""
        rows = input_rows(self.featurizer, batch.feats) if batch.feats is not None else {}
        rows.update(self.task.rows_read(batch))
        return rows

    def _step(self, batch: Batch, predict: bool) -> tuple[float, dict[str, np.ndarray], bool, torch.Tensor | None]:
        """Forward, backward and the optimizers' step; ``(loss, changed rows, skipped,
        outputs)``, ``outputs`` being the task's raw outputs before the step (with
        ``predict``; else None).

        The task's closed form (:meth:`Task.gradients <streamlearn.tasks.base.Task.gradients>`)
        replaces autograd where it has one (classify at depth 0 on the CPU; not with
        Shuffle+Random, whose loss has none); the gradient hook and the optimizers see
        the same ``.grad`` either way.

        A step whose loss or any gradient is not finite, or so large that its square
        would overflow the optimizers' float32 accumulators, is skipped: the gradients
        are dropped and nothing is updated (a NaN or inf once written into the tables or
        the Adagrad sums poisons every later prediction that reads them). Skipped steps
        are counted (``skipped_steps``) and logged."""
        compiled = self._compiled() if self._compiled is not None else None
        if compiled is not None and batch.sr_feats is None and self.gradient_hook is None:
            return self._compiled_step(compiled, batch, predict)
        closed = None
        if batch.sr_feats is None:
            with torch.no_grad():
                closed = self.task.gradients(self.model, batch, self.dev, outputs=predict)
        if closed is not None:
            value, outputs = closed.loss, closed.outputs
        else:
            outputs = self._outputs_before(batch) if predict else None
            value, loss = self._forward(batch)
        what = f"training batch {batch.seq}"
        if not math.isfinite(value) and self.gradient_hook is None:
            self._skip(f"{what}: its loss ({value})")  # alone: no backward needed
            return value, {}, True, outputs
        if closed is not None and self.gradient_hook is None:
            changed = self._apply_closed(closed, what)
            return value, changed or {}, changed is None, outputs
        if closed is None:
            loss.backward()
        else:
            closed.to_grad()
        if self.gradient_hook is not None:
            self.gradient_hook(self)  # every rank enters the exchange, even with a bad loss
        changed = self.apply_gradients(what)
        return value, changed or {}, changed is None, outputs

    def _compiled_step(self, compiled: CompiledClassifyStep, batch: Batch,
                       predict: bool) -> tuple[float, dict[str, np.ndarray], bool, torch.Tensor | None]:
        """:meth:`_step` as one compiled call (:class:`~streamlearn.compiled.CompiledClassifyStep`):
        the same closed form, safety check and updates as torch's ops, in place."""
        loss, logits, changed, bad = compiled(batch)
        outputs = torch.from_numpy(self.task.add_counts(logits, batch)) if predict else None
        if changed is None:
            self._skip(f"training batch {batch.seq}: {bad}")
            return loss, {}, True, outputs
        self.steps += 1
        return loss, self._record_dirty(changed), False, outputs

    def _apply_closed(self, closed: ClosedForm, what: str) -> dict[str, np.ndarray] | None:
        """:meth:`apply_gradients` of a closed-form step's gradients as they come
        (:class:`~streamlearn.tasks.base.ClosedForm`), without writing them to ``.grad``
        first: no sparse tensors to build and read back, a numpy safety check
        (:func:`_safe`), and AdamW over the label head's rows in use only. The same
        updates as the ``.grad`` path (tests/test_learner.py); None: skipped.

        Profile (py-spy, SMS, batch 8): building, coalescing and reading back the sparse
        gradients and one check per parameter were about a tenth of a step, AdamW over
        all ``model.max_labels`` rows of the label head about 5%."""
        grads = [g for _, g in closed.rows.values()] + [g for _, g in closed.dense]
        if not all(_safe(g) for g in grads):
            names = [*closed.rows, *(n for p, _ in closed.dense for n, q in self._named if q is p)]
            bad = next(n for n, g in zip(names, grads) if not _safe(g))
            self._skip(f"{what}: the gradient of {bad}")
            return None
        self.dense_optim.step_rows(closed.dense)
        changed = self.row_optim.apply(closed.rows)
        self.steps += 1
        return self._record_dirty(changed)

    def _outputs_before(self, batch: Batch) -> torch.Tensor:
        with self._inference():
            return self.task.outputs(self.model, batch, self.dev)

    def _forward(self, batch: Batch) -> tuple[float, torch.Tensor]:
        """The autograd forward of a step: the loss as a float and as a graph."""
        if not self.model.training:
            self.model.train()
        with self._dropout_rng(batch.seq), self.dev.autocast():
            loss = self.task.loss(self.model, batch, self.dev)
            if batch.sr_feats is not None:
                loss = loss + self.cfg.learner.shuffle_random * self._sr_loss(batch)
        return float(loss.detach()), loss

    def _unsafe_gradient(self) -> str | None:
        """The name of a parameter whose gradient is not finite or beyond
        :data:`MAX_GRADIENT` in magnitude (None: every gradient is safe). One foreach
        call and one device sync for the lot, and the exact peaks only where its test
        cannot clear them."""
        named = [(n, _grad_values(p)) for n, p in self._named if p.grad is not None]
        if not named:
            return None
        # First every gradient's L2 norm in one foreach call: a norm is at least the largest
        # magnitude, so norms all below the limit prove every gradient safe (NaN and inf
        # fail the test). 135-155 us against 290-410 us for the peaks below (next-token,
        # 1 layer, 23 gradients, one thread): a step's check was 4.6% of learn_many (py-spy).
        norms = torch._foreach_norm([g.detach() for _, g in named], 2, dtype=torch.float32)
        if bool((torch.stack(norms) < MAX_GRADIENT).all()):
            return None
        # the exact peaks name the offender; abs().amax(): torch.linalg.vector_norm(g, inf)
        # measured 13x slower on the CPU
        peaks = torch.stack([g.detach().abs().amax().float() if g.numel() else g.new_zeros((), dtype=torch.float32)
                             for _, g in named])
        safe = peaks < MAX_GRADIENT  # False for NaN too
        if bool(safe.all()):
            return None
        return named[int((~safe).nonzero()[0])][0]

    def _skip(self, what: str) -> None:
        self.dense_optim.zero_grad(set_to_none=True)
        self.row_optim.zero_grad()
        self.skipped_steps += 1
        log.warning("skipped the step of %s is not finite or too large; nothing was updated "
                    "(%d steps skipped so far)", what, self.skipped_steps)

    def apply_gradients(self, what: str = "the group's step") -> dict[str, np.ndarray] | None:
        """The optimizer half of a step: both optimizers apply the gradients that sit on
        the parameters (AdamW on the dense ones, the row rule on the touched rows), clear
        them, count the step and record the changed rows; returns them per table. A
        distributed rank without a batch of its own takes the group's step with it.

        Gradients that are not finite, or beyond :data:`MAX_GRADIENT` in magnitude, are
        dropped instead and nothing changes: returns None (see :meth:`_step`); ranks
        that exchanged their gradients see the same values and all skip alike."""
        bad = self._unsafe_gradient()
        if bad is not None:
            self._skip(f"{what}: the gradient of {bad}")
            return None
        self.dense_optim.step()
        self.dense_optim.zero_grad(set_to_none=True)
        changed = self.row_optim.step()
        self.row_optim.zero_grad()
        self.steps += 1
        return self._record_dirty(changed)

    def _sr_loss(self, b: Batch) -> torch.Tensor:
        """HashFormers' Shuffle+Random: classify each token as intact, shuffled or random."""
        feats = self.dev.tensors(b.sr_feats)
        h = self.model.encode(feats)  # (N, T, d)
        logits = self.model.sr_head(h[feats["mask"]])  # (M, 3)
        return F.cross_entropy(logits.float(), self.dev.tensor(b.sr_labels))

    def _dropout_rng(self, seq: int):
        """Dropout draws from a generator seeded by the batch number (then the global
        RNG is put back), so a restored learner drops the same units."""
        if self.cfg.model.dropout == 0:
            return contextlib.nullcontext()
        return self.dev.seeded(seed_of(self.cfg.learner.seed, f"dropout/{seq}"))

    # ------------------------------------------------------------------ dirty rows

    def _record_dirty(self, changed: Mapping[str, torch.Tensor | np.ndarray]) -> dict[str, np.ndarray]:
        out = {}
        for name, idx in changed.items():
            out[name] = ids = idx.cpu().numpy() if isinstance(idx, torch.Tensor) else idx
            self._dirty.mark(name, ids)  # its optimizer state tables follow (DirtyRows)
        return out

    def mark_dirty(self, rows: Mapping[str, np.ndarray]) -> None:
        """Record rows changed outside :meth:`learn_batch` (e.g. replaced by a distributed
        average), keyed like :meth:`take_dirty`'s result, so the next checkpoint stores them."""
        for name, ids in rows.items():
            self._dirty.mark(name, np.asarray(ids, dtype=np.int64))

    def take_dirty(self) -> dict[str, np.ndarray]:
        """Sorted unique row ids changed per table (and per ``"<table>.<state>"``) since
        the last call; clears them."""
        return self._dirty.take()

    # ------------------------------------------------------------------ persistence
    # What the checkpoint codec (:mod:`streamlearn.checkpoint`) reads and writes; nothing
    # else calls these.

    @property
    def applied(self) -> int:
        """Training batches learned so far (every one :meth:`prepare` made, once learned)."""
        return self._applied

    @property
    def pending(self) -> int:
        """Training batches :meth:`prepare` made that are not learned yet."""
        return self.prep.prepared - self._applied

    def resume(self, steps: int, prepared: int, applied: int) -> None:
        """Continue from a checkpoint's counters (optimizer steps, training batches
        prepared and learned). The changed-row lists are dropped: every row now equals
        the checkpoint's."""
        self.steps, self.prep.prepared, self._applied = steps, prepared, applied
        self._dirty.take()

    def initial_rows(self) -> dict[str, torch.Tensor]:
        """:meth:`row_tables` as a new learner of this config starts them, as CPU copies:
        the embedding's seeded init (rebuilt bit for bit), zeros for the optimizer state
        and count tables."""
        fresh = build_embedding(self.cfg.embedding, self.cfg.hashing.seed)[1].row_tables()  # a throwaway module
        return {name: fresh[name].detach() if name in fresh else torch.zeros(t.shape, dtype=t.dtype)
                for name, t in self.row_tables().items()}

    def dense_state(self) -> dict[str, torch.Tensor]:
        """The model's weights outside the row tables (transformer, head...), a state dict."""
        rows = {id(p) for p in self.model.row_tables().values()}
        skip = {n for n, p in self.model.named_parameters() if id(p) in rows}
        return {k: v for k, v in self.model.state_dict().items() if k not in skip}

    def load_dense_state(self, state: Mapping[str, torch.Tensor]) -> None:
        """Overwrite the weights of :meth:`dense_state` with ``state``, which has its keys
        and shapes (the caller checks them)."""
        self.model.load_state_dict(state, strict=False)

    def optimizer_state(self) -> tuple[dict, dict]:
        """``(dense, rows)``: AdamW's state dict and the row optimizer's scalars (its rule
        and step count; its per-row state is in :meth:`row_tables`)."""
        return self.dense_optim.state_dict(), self.row_optim.state_dict()

    def load_optimizer_state(self, dense: dict, rows: dict) -> None:
        """Resume both optimizers from :meth:`optimizer_state`'s two parts. AdamW raises
        ValueError for a state dict of other parameter groups."""
        self.dense_optim.load_state_dict(dense)
        self.row_optim.load_state_dict(rows)

    def replace_labels(self, labels: Sequence) -> None:
        """classify: the label table holds ``labels`` from now on, in this order (a
        label's id is its position); the label head rows must already match. They all count
        as learned: :meth:`discard_prepared` keeps them (call it with no batch prepared,
        as a worker's label merge and a checkpoint read do)."""
        self.label_table.replace(list(labels))
        self._labels_learned = len(self.label_table)

    def take_histories(self, full: bool = False) -> dict[str, tuple[str, ...]]:
        """next-item: the key histories changed since the last call (every one with
        ``full``); they count as checkpointed from now on."""
        changed = self.histories.take_dirty()
        return dict(self.histories.items()) if full else changed

    def replace_histories(self, pairs: Iterable[tuple[str, Sequence[str]]]) -> None:
        """next-item: the key histories become ``pairs`` of (key, items, oldest first),
        none changed since a checkpoint."""
        self.prep.replace_histories(pairs)

    @property
    def candidates_mark(self) -> int:
        """How many candidates (decoding index tokens) are in a checkpoint: written to
        one by :meth:`take_new_candidates` or read from one by :meth:`extend_candidates`."""
        return self._index_mark

    def take_new_candidates(self, full: bool = False) -> tuple[int, list[str]]:
        """``(first, tokens)``: the candidates not in a checkpoint yet (every one with
        ``full``) and the sequence number of the first; they count as checkpointed from
        now on."""
        first = 0 if full else self._index_mark
        fresh = self.index.new_since(first)
        self._index_mark = first + len(fresh)
        return first, fresh

    def extend_candidates(self, tokens: Sequence[str]) -> None:
        """Append candidates read from a checkpoint, in their order; they count as
        checkpointed. A token already present raises DecodingError."""
        self.index.extend(tokens)
        self._index_mark = self.index.mark

    def reset_candidates(self) -> None:
        """An empty candidate index, none checkpointed (before reading them again)."""
        self.task.reset_index()
        self._index_mark = 0
