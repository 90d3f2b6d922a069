"""Records -> :class:`Batch`: parse, validate, tokenize, hash, corrupt. numpy only, no torch.

:class:`Preparer` is the half of the learner that a worker can run in its ingest
thread, ahead of training. This module holds what every task shares: turning records
into validated :class:`~streamlearn.records.Record` objects, tokenizing them, counting
truncations, the training-batch counter that seeds masking and Shuffle+Random, and
HashFormers' Shuffle+Random corruption. Each task (:mod:`streamlearn.tasks`) subclasses
it with what its batches hold, and keeps there the state that must advance in stream
order (a classifier's label table, next-item histories).

A preparer reads the model never: it hashes with the embedding's featurizer
(:class:`~streamlearn.featurize.Featurizer`, numpy) and the task's output code
(:mod:`streamlearn.outputs`), so it can be pickled into another thread or process.
"""
from __future__ import annotations

import dataclasses
import itertools
import re
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Iterable

import numpy as np

from .config import Config
from .exceptions import RecordError
from .featurize import Featurizer
from .hashing import canonical_id, derive_seed, tokenize
from .objectives import Histories, LabelTable, shuffle_random
from .records import Record, from_dict, plain_int, token_list, valid_utf8

__all__ = ["Batch", "Preparer", "QUERY_MASK", "QUERY_MASK_ANY_CASE", "Schedule", "seed_of"]

QUERY_MASK = "[MASK]"  # in a query's tokens or text: the position to fill (mlm)
QUERY_MASK_ANY_CASE = re.compile(re.escape(QUERY_MASK), re.IGNORECASE)  # [mask] is asked as [MASK]
_FIELDS = ("text", "tokens", "label", "key", "item", "ts", "weight")


@dataclasses.dataclass
class Batch:
    """A prepared batch: numpy arrays only, ready for :meth:`Learner.learn_batch` (or
    the prediction verbs when ``train`` is False).

    ``feats``: the embedding's features of the model inputs (N, T). ``slots`` (N, T):
    inputs replaced by the [MASK] vector. ``rows``/``cols`` (n,): positions read out
    (mlm). ``targets``: int64 labels (N,), or an output code's targets of n answers.
    ``weight`` (n,): per-example weights. ``candidates``: tokens the candidate index
    learns after the step. ``rejected``: (index into the input records, error).
    """

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
    # next-item's training batches: (n,) each example's place among the accepted records (a
    # key's first record is none), in order; candidates[r] is record r's item
    example_records: np.ndarray | None = None
    # token tasks with a count part (model.counts): "grams" (M, n) the n-gram hashes it counts
    # after the step, "ctx" (n, ...) each example's context hashes (next-token: the n - 1 before
    # its answer; mlm: 6), "answer" (n,) its answer's;
    # next-item's transitions: "ctx" (n, 2) context keys, "every" (M, m) every record's item's code
    counts: dict[str, np.ndarray] | None = None
    sr_feats: dict[str, np.ndarray] | None = None
    sr_labels: np.ndarray | None = None
    rejected: list[tuple[int, RecordError]] = dataclasses.field(default_factory=list)
    truncated: int = 0

    @property
    def examples(self) -> int:
        """Training examples (mlm: masked positions; next-item: records with a history)."""
        return 0 if self.weight is None else len(self.weight)


class Preparer:
    """Turns records into batches for one task (see the module docstring).

    Subclasses (one per task) implement :meth:`validate`, :meth:`fill_train` and
    :meth:`fill_query`; ``label_table`` and ``histories`` are the stream-ordered state a
    task keeps (None where it keeps none), which checkpoints store.
    """

    task = ""
    label_table: LabelTable | None = None
    histories: Histories | None = None

    def __init__(self, cfg: Config, featurizer: Featurizer):
        self.cfg, self.featurizer = cfg, featurizer
        self.prepared = 0  # training batches prepared so far

    # ------------------------------------------------------------------ the two verbs

    def train(self, records: Iterable) -> Batch:
        """A training batch; advances the task's stream-ordered state and the batch
        counter, in record order. Invalid records land in ``Batch.rejected``; ``records``
        that are not a list of records (one record, a string) raise RecordError."""
        records = record_list(records)
        batch = Batch(True, self.prepared, 0)
        accepted: list[tuple[Record, list[str] | None]] = []
        for i, obj in enumerate(records):
            try:
                rec = _as_record(obj)
                self._one_json_key(rec.label)
                tokens = self.validate(rec)
            except RecordError as exc:
                batch.rejected.append((i, exc))
                continue
            accepted.append((rec, tokens))
        batch.records = len(accepted)
        batch.truncated = sum(len(t) > self.cfg.hashing.max_tokens for _, t in accepted if t)
        rng = _BatchRng(self.cfg.learner.seed, batch.seq)
        self.fill_train(batch, accepted, rng)
        if batch.examples and self.cfg.learner.shuffle_random > 0:
            self._add_shuffle_random(batch, [t for _, t in accepted if t], rng)
        self.prepared += 1
        return batch

    def query(self, records: Iterable, empty_tokens: bool = False) -> Batch:
        """A query batch; changes nothing. A bad query raises its RecordError: a query
        without input (blank text, ``"tokens": []``: the model would answer it from
        nothing, a classifier's label prior) is ``bad-value``, a lone surrogate
        ``invalid-utf8``. ``empty_tokens``: an explicit ``"tokens": []`` is a question
        (top-k: next-token's first token, next-item's new key), as the service takes it."""
        records = record_list(records)
        empty_tokens = empty_tokens or self.cfg.learner.task in _PREFIX_TASKS
        for i, obj in enumerate(records):
            check_query(obj, i, empty_tokens)
        batch = Batch(False, -1, len(records))
        self.fill_query(batch, records)
        return batch

    def _one_json_key(self, label: Any) -> None:
        """RecordError when ``label`` and a label of the table would be one key in a JSON
        answer (3 and "3": the service's /v1/predict would drop one's probability)."""
        if self.label_table is None or label is None or isinstance(label, bool):
            return
        twin: Any = None
        if isinstance(label, int):
            twin = str(label)
        else:
            try:
                twin = int(label) if str(int(label)) == label else None
            except ValueError:
                return
        if twin is not None and self.label_table.get(twin) is not None:
            raise RecordError(f"bad-value: label {label!r} and the label {twin!r} would be one label in JSON answers "
                              "(the service's): send every label with one spelling, str or int")

    def replace_histories(self, pairs: Iterable[tuple[str, Sequence[str]]]) -> None:
        """A task that keeps per-key histories: they become ``pairs`` of (key, items,
        oldest first), none changed since (a checkpoint is read)."""
        histories = Histories(self.cfg.learner.history)
        for key, items in pairs:
            histories.load(key, items)
        self.histories = histories

    # ------------------------------------------------------------------ a task's part

    def validate(self, rec: Record) -> list[str] | None:
        """The record's tokens for this task, or RecordError."""
        raise NotImplementedError

    def fill_train(self, batch: Batch, accepted: list[tuple[Record, list[str] | None]],
                   rng: np.random.Generator) -> None:
        """Fill a training batch from the accepted records and their tokens, in order."""
        raise NotImplementedError

    def fill_query(self, batch: Batch, records: list) -> None:
        """Fill a query batch (``batch.records`` = len(records)); RecordError if bad."""
        raise NotImplementedError

    def query_columns(self, batch: Batch, i: int, n: int) -> tuple[int, list[int | None]]:
        """Where query ``i``'s ``n`` tokens (:meth:`query_tokens`) sit in the features of
        the query batch :meth:`fill_query` filled: its row, and per token its column
        (None: a token the model does not read)."""
        return i, list(range(n))

    # ------------------------------------------------------------------ shared helpers

    def tokens(self, rec: Record) -> list[str] | None:
        """The record's tokens: ``tokens`` as given (canonical ids), or ``text`` through
        the configured tokenizer; None when it has neither."""
        h = self.cfg.hashing
        if rec.tokens is not None:
            return [canonical_id(t) for t in rec.tokens]
        if rec.text is None:
            return None
        if h.tokenizer != "words":
            return rec.text.split()
        return tokenize(rec.text, h.ngrams, h.lowercase, h.shapes, h.scripts)

    def text_tokens(self, rec: Record) -> list[str]:
        """:meth:`tokens`, required and non-empty (RecordError otherwise)."""
        tokens = self.tokens(rec)
        if tokens is None:
            raise RecordError(f"missing-field: text or tokens (task {self.task})")
        if not tokens:
            raise RecordError("bad-value: the text has no tokens after tokenization")
        return tokens

    def featurize(self, token_lists: Sequence[Sequence[str]], grow: bool = True) -> dict[str, np.ndarray]:
        """The featurizer's arrays of ``token_lists``, cut to ``hashing.max_tokens``;
        queries pass ``grow=False`` (a dictionary scheme must not admit their tokens)."""
        return self.featurizer.featurize(token_lists, self.cfg.hashing.max_tokens, grow=grow)

    def cut(self, tokens: list[str]) -> list[str]:
        return tokens[: self.cfg.hashing.max_tokens]

    def query_cut(self, tokens: list[str]) -> list[str]:
        """A query's tokens cut to ``hashing.max_tokens``: its first ones here, as a record
        is read; a task whose answer follows from a query's end (next-token, next-item) or
        from its [MASK] (mlm) keeps those."""
        return self.cut(tokens)

    def query_tokens(self, obj: Any, i: int) -> list[str]:
        """Query ``i``'s tokens (``tokens``, or ``text`` tokenized), cut (:meth:`query_cut`);
        RecordError."""
        fields = fields_of(obj)
        text, tokens = fields.get("text"), fields.get("tokens")
        try:
            if tokens is not None:
                # list/tuple first: isinstance against the Sequence ABC costs ~13 us a query
                if not isinstance(tokens, (list, tuple)) and (isinstance(tokens, (str, bytes))
                                                              or not isinstance(tokens, Sequence)):
                    raise TypeError(f"tokens must be a list, got {type(tokens).__name__}")
                return self.query_cut(self.query_list([canonical_id(plain_int(t)) for t in tokens]))
            if isinstance(text, str):
                tokens = self.query_text(text)
                if not tokens:
                    raise RecordError(f"bad-value: query {i}: the text has no tokens after tokenization")
                return self.query_cut(tokens)
        except TypeError as exc:
            raise RecordError(f"wrong-type: query {i}: {exc}") from exc
        raise RecordError(f"missing-field: query {i} needs text (str) or tokens (task {self.task})")

    def query_list(self, tokens: list[str]) -> list[str]:
        """A query's explicit ``tokens`` as the model reads them (a task may read markers
        such as [MASK] in them)."""
        return tokens

    def query_text(self, text: str) -> list[str]:
        """A query's text tokenized (a task may keep markers such as [MASK])."""
        return self.tokens(Record(text=text))

    def _add_shuffle_random(self, batch: Batch, lists: list[list[str]], rng: np.random.Generator) -> None:
        corrupted, labels = shuffle_random([self.cut(t) for t in lists], rng)
        batch.sr_feats = self.featurize(corrupted)
        batch.sr_labels = labels


class _BatchRng:
    """A training batch's ``np.random.Generator`` (seeded by ``learner.seed`` and the
    batch number), built on first use: most batches draw nothing (classify), and
    building one cost about 20 us, a few percent of a one-record step."""

    def __init__(self, seed: int, seq: int):
        self._seed, self._seq = seed, seq
        self._gen: np.random.Generator | None = None

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):  # not set yet (a copy being built): no generator's attribute
            raise AttributeError(name)
        if self._gen is None:
            self._gen = np.random.default_rng(seed_of(self._seed, f"batch/{self._seq}"))
        return getattr(self._gen, name)


@dataclasses.dataclass(frozen=True)
class Schedule:
    """How many records each of a model's mini-batches takes, by its step number (0: the
    first batch it ever learns). With ``ramp`` (a task whose ``ramps_up``: classify) 1,
    2, 4, ... up to ``batch_size``, then ``batch_size``: a new model learns its first
    records sooner, as a per-record learner does; with whole batches from the start, a
    model that knows no label yet could answer none of its first ``batch_size`` records.
    From step ``double_after`` on (``learner.double_batch_after``; 0: never) a step takes
    twice ``batch_size``: a warm model loses nothing per record to the larger batch and
    learns more records a second (next-token; docs/choosing-a-configuration.md). The
    worker, replay and the benchmarks batch a stream so (:attr:`Learner.schedule
    <streamlearn.learner.Learner.schedule>`); a model restored from its checkpoint goes on
    from its own step count.

    >>> [Schedule(8).size(s) for s in range(6)]
    [1, 2, 4, 8, 8, 8]
    >>> Schedule(6).size(2), Schedule(6).size(3), Schedule(1).size(0), Schedule(8, ramp=False).size(0)
    (4, 6, 1, 8)
    >>> [Schedule(8, ramp=False, double_after=2).size(s) for s in range(4)]
    [8, 8, 16, 16]
    """

    batch_size: int
    ramp: bool = True
    double_after: int = 0

    def size(self, step: int) -> int:
        """Records in mini-batch number ``step``."""
        if self.double_after and step >= self.double_after:
            return 2 * self.batch_size
        if not self.ramp or step >= self.batch_size.bit_length():
            return self.batch_size
        return min(self.batch_size, 1 << step)

    def sizes(self, step: int = 0) -> Iterator[int]:
        """The sizes of mini-batch ``step`` and every one after it (endless)."""
        return map(self.size, itertools.count(step))

    def spans(self, n: int, step: int = 0) -> Iterator[tuple[int, int]]:
        """(start, stop) of each mini-batch of ``n`` records for a model that has taken
        ``step`` steps, in order.

        >>> [b - a for a, b in Schedule(8).spans(20)]
        [1, 2, 4, 8, 5]
        >>> [b - a for a, b in Schedule(8, ramp=False, double_after=2).spans(40)]
        [8, 8, 16, 8]
        """
        start = 0
        for size in self.sizes(step):
            if start >= n:
                return
            yield start, min(n, start + size)
            start += size

    def batches(self, items: Iterable, step: int = 0) -> Iterator[list]:
        """``items`` (any iterable: a list, or records as they arrive) cut into the
        mini-batches of a model that has taken ``step`` steps, in order; the last one may
        be short.

        >>> [len(b) for b in Schedule(8).batches(range(20))]
        [1, 2, 4, 8, 5]
        >>> list(Schedule(2, ramp=False).batches(range(4)))
        [[0, 1], [2, 3]]
        """
        arriving = iter(items)
        for size in self.sizes(step):
            chunk = list(itertools.islice(arriving, size))
            if chunk:
                yield chunk
            if len(chunk) < size:
                return


def seed_of(seed: int, purpose: str) -> int:
    """A non-negative 63-bit seed for one purpose, derived from ``learner.seed``."""
    return derive_seed(seed, purpose) & (2**63 - 1)


def fields_of(obj: Any) -> Mapping:
    """A record's fields from a Mapping or from an object's attributes (e.g. a Record)."""
    if isinstance(obj, Mapping):
        return obj
    if isinstance(obj, (str, bytes)) or not any(hasattr(obj, name) for name in _FIELDS):
        raise RecordError(f"wrong-type: a record must be a dict or a Record, got {type(obj).__name__}")
    return {name: getattr(obj, name, None) for name in _FIELDS}


def record_list(records: Iterable) -> list:
    """``records`` as a list; RecordError for one record, a string or a non-iterable
    passed where a list of records is meant (a dict's keys would be read as records)."""
    if isinstance(records, (Mapping, str, bytes, Record)):
        raise RecordError(f"wrong-type: pass a list of records, got {type(records).__name__}"
                          + (" (one record: [record])" if isinstance(records, (Mapping, Record)) else ""))
    try:
        return list(records)
    except TypeError as exc:
        raise RecordError(f"wrong-type: pass a list of records, got {type(records).__name__}") from exc


# Tasks whose query is a prefix or a history: an empty one is a question (next-token's first
# token, a new key's first item), whichever verb asks it
_PREFIX_TASKS = frozenset({"next-token", "next-item"})


def check_query(obj: Any, i: int, empty_tokens: bool = False) -> None:
    """RecordError unless query ``i`` has input: text that is not blank, or tokens (an
    empty list only with ``empty_tokens``, or beside a next-item ``key``), every string
    valid UTF-8. Types are the tasks' to check (:meth:`Preparer.query_tokens`)."""
    fields = fields_of(obj)
    text, tokens, key = fields.get("text"), fields.get("tokens"), fields.get("key")
    if isinstance(key, str):
        valid_utf8(f"query {i}: key", key)
    if fields.get("exclude") is not None:
        exclusions(fields["exclude"], i)
    if tokens is not None:
        if isinstance(tokens, (list, tuple)):
            if not tokens and not empty_tokens and key is None:
                raise RecordError(f"bad-value: query {i}: tokens is empty: give at least one token (an empty list "
                                  "is a question for top-k only: next-token's first token, next-item's new key)")
            for j, token in enumerate(tokens):
                if isinstance(token, str):
                    valid_utf8(f"query {i}: tokens[{j}]", token)
        return
    if isinstance(text, str):
        if not text or text.isspace():
            raise RecordError(f"bad-value: query {i}: text is empty or only whitespace: send at least one word"
                              + (' (top-k of a first token or a new key: "tokens": [])' if empty_tokens else ""))
        valid_utf8(f"query {i}: text", text)


def exclusions(exclude: Any, i: int) -> list[str]:
    """A top-k query's ``exclude``: the tokens (str) or ids (int) its list must leave out,
    canonical; RecordError unless it is a list of them."""
    return [canonical_id(t) for t in token_list(f"query {i}: exclude", exclude, empty=True)]


def _as_record(obj: Any) -> Record:
    """A validated Record from a Record, a Mapping, or an object with record attributes."""
    if isinstance(obj, Record):
        return obj
    return from_dict({k: v for k, v in fields_of(obj).items() if k in _FIELDS})
