"""Records -> :class:`Batch`: parse, validate, tokenize, hash, corrupt. numpy only.

:class:`Preparer` is the half of the learner that a worker can run in its ingest
thread, ahead of training. It owns the state that must advance in stream order:

- the label table (a record's new label joins it when the record is prepared);
- next-item histories (each record's item is pushed after the record takes the items
  before it as its input, so two events of one key in one batch chain correctly);
- the training-batch counter that seeds mlm masking and Shuffle+Random.

It reads the model only for its pure numpy parts (``embedding.featurize`` and the
output hashers), never its weights.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, Iterable

import numpy as np

from .config import Config
from .exceptions import RecordError
from .embeddings.base import flatten_batch
from .hashing import canonical_id, derive_seed, tokenize
from .heads import NaiveBayesHead
from .model import HashedTransformer
from .objectives import MASK_TOKEN, Histories, LabelTable, mlm_mask, shuffle_random
from .records import Record, from_dict

__all__ = ["Batch", "Preparer", "QUERY_MASK"]

QUERY_MASK = "[MASK]"  # in a query's tokens or text: the position to fill (mlm)
_FIELDS = ("text", "tokens", "label", "key", "item", "ts", "weight")


@dataclasses.dataclass
class Batch:
    """A prepared batch: numpy arrays only, ready for :meth:`Learner.learn_batch` (or
    the prediction verbs when ``train`` is False).

    ``feats``: the embedding's features of the model inputs (N, T). ``slots`` (N, T):
    inputs replaced by the [MASK] vector. ``rows``/``cols`` (n,): positions read out
    (mlm). ``targets``: int64 labels (N,), hashed ids (n, m), or T-Free CSR rows.
    ``weight`` (n,): per-example weights. ``candidates``: tokens the candidate index
    learns after the step. ``rejected``: (index into the input records, error).
    """

    task: str
    train: bool
    seq: int
    records: int
    feats: dict[str, np.ndarray] | None = None
    slots: np.ndarray | None = None
    rows: np.ndarray | None = None
    cols: np.ndarray | None = None
    targets: dict[str, np.ndarray] = dataclasses.field(default_factory=dict)
    weight: np.ndarray | None = None
    n_labels: int = 0
    label_start: int = 0  # labels [label_start, n_labels) joined the label table in this batch
    nb_tokens: np.ndarray | None = None  # classify with learner.nb_weight > 0: (N, T) Naive Bayes token ids, -1 = padding
    candidates: list[str] = dataclasses.field(default_factory=list)
    sr_feats: dict[str, np.ndarray] | None = None
    sr_labels: np.ndarray | None = None
    rejected: list[tuple[int, RecordError]] = dataclasses.field(default_factory=list)
    truncated: int = 0

    @property
    def examples(self) -> int:
        """Training examples (mlm: masked positions; next-item: records with a history)."""
        return 0 if self.weight is None else len(self.weight)


class Preparer:
    """Turns records into batches for one model (see the module docstring)."""

    def __init__(self, cfg: Config, model: HashedTransformer, nb: NaiveBayesHead | None = None):
        self.cfg, self.task, self.model, self.nb = cfg, cfg.learner.task, model, nb
        self.label_table = LabelTable(cfg.model.max_labels)
        self.histories = Histories(cfg.learner.history)
        self.prepared = 0  # training batches prepared so far

    def train(self, records: Iterable) -> Batch:
        """A training batch; advances the label table, the histories and the batch
        counter, in record order. Invalid records land in ``Batch.rejected``."""
        records = list(records)
        batch = Batch(self.task, True, self.prepared, 0, label_start=len(self.label_table))
        accepted: list[tuple[Record, list[str]]] = []
        for i, obj in enumerate(records):
            try:
                rec = _as_record(obj)
                tokens = self._validate(rec)
            except RecordError as exc:
                batch.rejected.append((i, exc))
                continue
            accepted.append((rec, tokens))
        batch.records = len(accepted)
        batch.truncated = sum(len(t) > self.cfg.hashing.max_tokens for _, t in accepted if t)
        rng = np.random.default_rng(seed_of(self.cfg.learner.seed, f"batch/{batch.seq}"))
        getattr(self, f"_train_{self.task.replace('-', '_')}")(batch, accepted, rng)
        if batch.examples and self.model.sr_head is not None:
            self._add_shuffle_random(batch, [t for _, t in accepted if t], rng)
        self.prepared += 1
        return batch

    def _validate(self, rec: Record) -> list[str] | None:
        """The record's tokens for this task, or RecordError; labels join the table here."""
        if self.task == "next-item":
            if rec.key is None or rec.item is None:
                raise RecordError("missing-field: key and item (task next-item)")
            return None
        tokens = self._tokens(rec)
        if tokens is None:
            raise RecordError(f"missing-field: text or tokens (task {self.task})")
        if not tokens:
            raise RecordError("bad-value: the text has no tokens after tokenization")
        if self.task == "classify":
            if rec.label is None:
                raise RecordError("missing-field: label (task classify)")
            self.label_table.add(rec.label)
        return tokens

    def _tokens(self, rec: Record) -> list[str] | None:
        h = self.cfg.hashing
        if rec.tokens is not None:
            return [canonical_id(t) for t in rec.tokens]
        if rec.text is None:
            return None
        return tokenize(rec.text, h.ngrams, h.lowercase) if h.tokenizer == "words" else rec.text.split()

    def _featurize(self, token_lists: Sequence[Sequence[str]]) -> dict[str, np.ndarray]:
        return self.model.embedding.featurize(token_lists, self.cfg.hashing.max_tokens)

    def _nb_tokens(self, token_lists: Sequence[Sequence[str]], feats: dict[str, np.ndarray]) -> np.ndarray | None:
        """The Naive Bayes part's token ids (N, T), cut like the model's input; None when
        off. Hash embeddings' D1 (``feats["d1"]``, already one uniform hash per token) is
        reused when its range K is at least half the part's span (so at most twice its
        own collisions): hashing every token again cost the fetch thread 0.04 CPU-s per
        1,000 SMS records, more than the rest of its work."""
        if self.nb is None:
            return None
        if "d1" in feats and 2 * self.cfg.embedding.K >= self.nb.span:
            return self.nb.ids_of(feats["d1"], feats["mask"])
        flat, mask = flatten_batch(token_lists, self.cfg.hashing.max_tokens)
        return self.nb.token_ids(flat, mask, self.cfg.hashing.seed)

    def _cut(self, tokens: list[str]) -> list[str]:
        return tokens[: self.cfg.hashing.max_tokens]

    def _train_classify(self, batch: Batch, accepted: list, rng: np.random.Generator) -> None:
        if not accepted:
            return
        batch.feats = self._featurize([t for _, t in accepted])
        batch.nb_tokens = self._nb_tokens([t for _, t in accepted], batch.feats)
        batch.targets["labels"] = np.array([self.label_table.get(r.label) for r, _ in accepted], dtype=np.int64)
        batch.weight = np.array([r.weight for r, _ in accepted], dtype=np.float32)
        batch.n_labels = len(self.label_table)

    def _train_mlm(self, batch: Batch, accepted: list, rng: np.random.Generator) -> None:
        if not accepted:
            return
        lists = [self._cut(t) for _, t in accepted]
        masked = mlm_mask(lists, rng, p=self.cfg.learner.mask_prob)
        batch.feats = self._featurize(masked.token_lists)
        batch.slots = np.zeros(batch.feats["mask"].shape, dtype=bool)
        batch.slots[masked.rows[masked.slots], masked.cols[masked.slots]] = True
        batch.rows, batch.cols = masked.rows, masked.cols
        batch.targets = self._output_targets(masked.targets)
        weights = np.array([r.weight for r, _ in accepted], dtype=np.float32)
        batch.weight = weights[masked.rows]
        batch.candidates = [t for ts in lists for t in ts]

    def _train_next_item(self, batch: Batch, accepted: list, rng: np.random.Generator) -> None:
        inputs, targets, weights = [], [], []
        for rec, _ in accepted:  # stream order: each record sees the items before it
            item = canonical_id(rec.item)
            history = self.histories.get(rec.key)
            if history:
                inputs.append(list(history))
                targets.append(item)
                weights.append(rec.weight)
            self.histories.push(rec.key, item)
        batch.candidates = [canonical_id(r.item) for r, _ in accepted]
        if not inputs:
            return
        batch.feats = self._featurize(inputs)
        batch.targets = self._output_targets(targets)
        batch.weight = np.array(weights, dtype=np.float32)

    def _output_targets(self, tokens: list[str]) -> dict[str, np.ndarray]:
        if self.model.tfree_head is not None:
            ids, offsets = self.model.pattern_hasher(tokens)
            return {"ids": ids, "offsets": offsets}
        return {"hashes": self.model.space.hasher(tokens)}  # (n, m)

    def _add_shuffle_random(self, batch: Batch, lists: list[list[str]], rng: np.random.Generator) -> None:
        corrupted, labels = shuffle_random([self._cut(t) for t in lists], rng)
        batch.sr_feats = self._featurize(corrupted)
        batch.sr_labels = labels

    def query(self, records: Iterable) -> Batch:
        """A query batch; changes nothing. A bad query raises its RecordError."""
        records = list(records)
        batch = Batch(self.task, False, -1, len(records), n_labels=len(self.label_table))
        if self.task == "next-item":
            lists = [self._query_history(obj, i) for i, obj in enumerate(records)]
        else:
            lists = [self._query_tokens(obj, i) for i, obj in enumerate(records)]
        if self.task == "mlm":
            lists, batch.rows, batch.cols = _mask_queries(lists, self.cfg.hashing.max_tokens)
        batch.feats = self._query_featurize(lists)
        if self.task == "classify":
            batch.nb_tokens = self._nb_tokens(lists, batch.feats)
        if self.task == "mlm":
            batch.slots = np.zeros(batch.feats["mask"].shape, dtype=bool)
            for r, ts in enumerate(lists):
                batch.slots[r, [c for c, t in enumerate(ts) if t == MASK_TOKEN]] = True
        return batch

    def _query_featurize(self, lists: list[list[str]]) -> dict[str, np.ndarray]:
        # The plain reference grows its dictionary in featurize; a query must not.
        emb = self.model.embedding
        grow = getattr(emb, "grow", None)
        if grow is None:
            return self._featurize(lists)
        emb.grow = False
        try:
            return self._featurize(lists)
        finally:
            emb.grow = grow

    def _query_tokens(self, obj: Any, i: int) -> list[str]:
        fields = _fields(obj)
        text, tokens = fields.get("text"), fields.get("tokens")
        try:
            if tokens is not None:
                # list/tuple first: isinstance against the Sequence ABC costs ~13 us a query
                if not isinstance(tokens, (list, tuple)) and (isinstance(tokens, (str, bytes))
                                                              or not isinstance(tokens, Sequence)):
                    raise TypeError(f"tokens must be a list, got {type(tokens).__name__}")
                return self._cut([canonical_id(t) for t in tokens])
            if isinstance(text, str):
                return self._cut(self._query_text(text))
        except TypeError as exc:
            raise RecordError(f"wrong-type: query {i}: {exc}") from exc
        raise RecordError(f"missing-field: query {i} needs text (str) or tokens (task {self.task})")

    def _query_text(self, text: str) -> list[str]:
        if self.task != "mlm" or QUERY_MASK not in text:
            return self._tokens(Record(text=text))
        parts = [self._tokens(Record(text=p)) for p in text.split(QUERY_MASK)]
        out = parts[0]
        for p in parts[1:]:
            out = out + [QUERY_MASK] + p
        return out

    def _query_history(self, obj: Any, i: int) -> list[str]:
        fields = _fields(obj)
        if fields.get("tokens") is not None:
            return self._query_tokens(obj, i)[-self.cfg.learner.history:]
        key = fields.get("key")
        if isinstance(key, bool) or not isinstance(key, (str, int)):
            raise RecordError(f"missing-field: query {i} needs key (str or int) or tokens (task next-item)")
        return list(self.histories.get(canonical_id(key)))


def seed_of(seed: int, purpose: str) -> int:
    """A non-negative 63-bit seed for one purpose, derived from ``learner.seed``."""
    return derive_seed(seed, purpose) & (2**63 - 1)


def _fields(obj: Any) -> Mapping:
    """A record's fields from a Mapping or from an object's attributes (e.g. a Record)."""
    if isinstance(obj, Mapping):
        return obj
    if isinstance(obj, (str, bytes)) or not any(hasattr(obj, name) for name in _FIELDS):
        raise RecordError(f"wrong-type: a record must be a dict or a Record, got {type(obj).__name__}")
    return {name: getattr(obj, name, None) for name in _FIELDS}


def _as_record(obj: Any) -> Record:
    """A validated Record from a Record, a Mapping, or an object with record attributes."""
    if isinstance(obj, Record):
        return obj
    return from_dict({k: v for k, v in _fields(obj).items() if k in _FIELDS})


def _mask_queries(lists: list[list[str]], max_len: int) -> tuple[list[list[str]], np.ndarray, np.ndarray]:
    """Each query's [MASK]s become the model's mask slot; a query without one gets one
    appended. Returns the lists and the (row, col) read out: each query's first mask."""
    out, cols = [], []
    for tokens in lists:
        if QUERY_MASK not in tokens:
            tokens = tokens[: max_len - 1] + [QUERY_MASK]
        tokens = [MASK_TOKEN if t == QUERY_MASK else t for t in tokens]
        out.append(tokens)
        cols.append(tokens.index(MASK_TOKEN))
    return out, np.arange(len(out), dtype=np.int64), np.array(cols, dtype=np.int64)
