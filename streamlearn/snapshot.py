"""Query the live model while a worker keeps training: :class:`Snapshot`.

A snapshot answers ``predict``, ``predict_proba``, ``topk`` and ``embed`` from the
latest checkpoint of a state directory, and moves to newer checkpoints without a
restart. Every answer says which checkpoint produced it (:class:`Answer` ``.step``).

How it stays fresh without reloading tables (see docs/serving.md for measurements).
A full reload of the default model reads 1.1M rows (E: B=100K, P: K=1M) and takes
seconds, longer than a checkpoint interval may be; so only small things are reloaded
per checkpoint and embedding rows are read lazily, per query, from the store:

1. Each query opens ONE short LMDB read transaction (``store.snapshot()``) and reads
   the manifest in it (about 25 us).
2. If the store committed since the last query, the snapshot *advances* inside that
   transaction (:func:`streamlearn.checkpoint.read_lazy` reads the checkpoint): dense
   weights, label table, the candidates added since (decoding), and of the few tables a
   head reads in full (a tied output head reads every row of ``E``) the rows the commits
   since wrote, as the store's change log names them (``Store.changed_rows``); those rows
   also become stale where they were read lazily. Where the log does not reach back, the
   tables are read whole and every lazily read row becomes stale.
3. The query is featurized; for each row table it reads, the rows it touches that are
   stale (not yet read at this checkpoint) are read from the store (``read_rows``,
   one lookup per row) into the in-memory table. A row is read at most once per
   checkpoint, so between checkpoints queries read nothing.
4. The transaction ends; the forward pass runs on the in-memory model.

Before step 1 a query checks (one ``stat``) that the state directory still holds the
data file the snapshot opened: a directory reset or replaced since (another process's
``open_store(..., reset=True)``, a state deleted and saved again) is reopened by a
snapshot that opened it (:meth:`Snapshot.open`), and raises :class:`SnapshotError` for
one given its store; a deleted one raises. (LMDB would go on answering from the old file.)

All of one query's state (manifest, dense weights, rows) comes from one transaction,
so an answer is computed from exactly the checkpoint it names. A row never stored
keeps its seeded init (stored rows are never deleted, so the in-memory table can hold
a row's init until the store has it). Queries are serialized by a lock: the in-memory
tables are shared. Readers never block the writer (LMDB MVCC; transactions stay short).

Usage (see docs/serving.md)::

    with Snapshot.open("state/") as snap:
        answer = snap.predict([{"text": "free prize now"}])
        answer.step, answer.values  # (1200, ['spam'])
"""
from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Mapping
from typing import Any, Callable, Iterable, NamedTuple, Sequence

import numpy as np
import torch

from .batching import check_query, record_list
from .checkpoint import LazyCheckpoint, has_checkpoint, read_lazy
from .config import Config
from .decoding import check_beam, check_k
from .exceptions import NoCheckpointError, RecordError, StreamlearnError
from .hashing import canonical_id
from .learner import Learner
from .state import Manifest, NotAStoreError, StateError, Store, open_store

__all__ = [
    "Answer", "NoCheckpointError", "Snapshot", "SnapshotError", "TaskMismatchError", "TokenVectors",
    "open_ready_store", "wait_for_checkpoint",
]


log = logging.getLogger(__name__)


class SnapshotError(StreamlearnError):
    """The snapshot cannot answer; the message says what to change."""


class TaskMismatchError(SnapshotError):
    """The query does not fit the model's task (e.g. top-k of a classifier)."""


@dataclasses.dataclass(frozen=True)
class Answer:
    """One answer per query record, all from checkpoint ``step`` (committed at
    ``committed_at``, unix seconds)."""

    step: int
    committed_at: float | None
    values: list


class TokenVectors(NamedTuple):
    """A record's tokens (after tokenization and truncation) and their input
    embeddings ``vectors`` (len(tokens), e)."""

    tokens: list[str]
    vectors: np.ndarray


@dataclasses.dataclass
class _Version:
    """Which checkpoint the in-memory model holds: ``commits`` counts store commits
    (it identifies a checkpoint even if a writer reuses a step number)."""

    commits: int = -1
    step: int = 0
    committed_at: float | None = None
    number: int = 0  # advances so far: a lazily read row is current iff read at this number


class Snapshot:
    """The latest checkpoint of a store, kept current (see the module docstring).

    ``Snapshot.open(state_dir)`` is the usual way in; ``Snapshot(store)`` wraps a store
    you opened (any backend; it stays yours to close). ``device`` overrides the stored
    ``learner.device``.
    """

    def __init__(self, store: Store, device: str | None = None, owns_store: bool = False):
        self._store = store
        self._owns_store = owns_store
        self._device = device
        self._lock = threading.Lock()
        self._version = _Version()
        _require_checkpoint(store)
        self._reader: LazyCheckpoint = read_lazy(store, device)  # builds the model outside any transaction
        self._adopt()
        self.refresh()

    @classmethod
    def open(cls, state_dir: str, wait: float = 0.0, device: str | None = None) -> "Snapshot":
        """Open ``state_dir`` read-only. ``wait`` seconds: how long to wait for the
        directory to become a state and for its first checkpoint (a worker just
        started); 0 raises at once. A missing directory or one that is not a streamlearn
        state raises :class:`~streamlearn.state.NotAStoreError`, one without a checkpoint
        :class:`NoCheckpointError`."""
        store = open_ready_store(state_dir, wait)
        try:
            return cls(store, device=device, owns_store=True)
        except BaseException:
            store.close()
            raise

    # ------------------------------------------------------------------ state

    @property
    def config(self) -> Config:
        """The config the model was trained with (stored in the checkpoint)."""
        return self._learner.cfg

    @property
    def task(self) -> str:
        """The model's task name (``learner.task``)."""
        return self._learner.task.name

    @property
    def embedding_dim(self) -> int:
        """Width e of the vectors :meth:`embed` returns."""
        return self._learner.model.embedding.out_dim

    @property
    def step(self) -> int:
        """Step of the checkpoint the last answer came from."""
        return self._version.step

    @property
    def committed_at(self) -> float | None:
        return self._version.committed_at

    def manifest(self) -> Manifest:
        """The store's current manifest (a fresh read; may be ahead of :attr:`step`)."""
        return self._store.manifest()

    def behind(self) -> bool:
        """Whether the store committed since the checkpoint answers come from, or its
        directory was reset or replaced, so the next query advances (or reopens) first.
        One ``stat`` and one manifest read; does not wait for a running query."""
        return self._store.file_change() is not None or self._store.manifest().commits != self._version.commits

    def refresh(self) -> int:
        """Move to the latest checkpoint if the store has a newer one; returns the step."""
        return self._answer([], lambda records, _: []).step

    # ------------------------------------------------------------------ verbs

    def predict(self, records: Iterable) -> Answer:
        """classify: each record's most probable label (None before any label)."""
        self.need_labels("predict")
        answer = self._answer(records, self._probs, prepare=self._query_batch)
        labels = [max(p, key=p.get) if p else None for p in answer.values]
        return dataclasses.replace(answer, values=labels)

    def predict_proba(self, records: Iterable) -> Answer:
        """classify: ``{label: probability}`` per record over the labels seen so far."""
        self.need_labels("predict_proba")
        return self._answer(records, self._probs, prepare=self._query_batch)

    def need_labels(self, verb: str) -> None:
        """TaskMismatchError unless the model answers labels (``verb``: what was asked)."""
        if self._learner.task.answers != "labels":
            raise TaskMismatchError(
                f"{verb} answers labels, from a classify model; this model's task is {self.task}: ask it "
                "for its top-k tokens (POST /v1/topk, Snapshot.topk)"
            )

    def topk(self, records: Iterable, k: int = 10, beam: int | None = None) -> Answer:
        """mlm / next-token / next-item: :class:`~streamlearn.decoding.TopK` per record
        (tokens, scores as log-probabilities, ``exact`` certificate). mlm fills the first
        ``[MASK]`` of ``text`` or ``tokens`` (appended when absent); next-token continues
        the prefix ``text`` or ``tokens`` (empty: a record's first token); next-item
        continues ``tokens`` or the stored history of ``key``. A record's ``exclude`` (a
        list of tokens or item ids, e.g. what a user already had) leaves them out of its
        list, which still holds k answers where the candidates allow."""
        if self._learner.task.answers == "labels":
            raise TaskMismatchError(
                "the model's task is classify: top-k decodes tokens for tasks mlm, next-token and next-item; "
                "use predict / predict_proba (POST /v1/predict) for labels"
            )
        k, beam = check_k(k), check_beam(beam)  # before a query waits for the lock
        return self._answer(records, lambda rs, batch: self._learner.topk_batch(
            batch, k=k, beam=beam, exclude=self._learner.query_exclusions(rs)), prepare=self._topk_batch)

    def embed(self, records: Iterable) -> Answer:
        """:class:`TokenVectors` per record (``text`` or ``tokens``): each token's input
        embedding (the embedding scheme's output, width e; no encoder)."""
        return self._answer(records, self._embed, prepare=self._embed_feats)

    def explain(self, records: Iterable, outputs: Sequence | None = None, k: int = 5) -> Answer:
        """:class:`~streamlearn.explain.Explanation` per record (``text`` or ``tokens``;
        next-item also ``key``): each token's contribution to ``outputs[i]`` (a label or a
        token; None: the best answer), the top ``k`` answers and each token's importance
        weights (:meth:`Learner.explain_many <streamlearn.learner.Learner.explain_many>`)."""
        k = check_k(k)
        return self._answer(records, lambda rs, plan: self._learner.explain_batch(plan, k),
                            prepare=lambda rs: self._explain_plan(rs, outputs))

    def _explain_plan(self, records: list, outputs: Sequence | None) -> tuple[dict[str, np.ndarray], Any]:
        plan = self._learner.explain_plan(records, outputs)
        return self._learner.rows_read(plan.batch), plan

    # ------------------------------------------------------------------ query path

    def _answer(self, records: Iterable, run: Callable[[list, Any], list],
                prepare: Callable[[list], tuple[dict, Any]] | None = None) -> Answer:
        """Steps 1-4 of the module docstring, under the lock. ``prepare(records)`` gives
        the rows the answer reads (per table) and a context handed to ``run``."""
        records = record_list(records)  # one record passed alone: RecordError, not its keys as records
        with self._lock:
            self._follow_directory()
            with self._store.snapshot():  # 1. one short read transaction
                manifest = self._store.manifest()
                if manifest.commits != self._version.commits:
                    self._advance(manifest)  # 2.
                records = self._resolve(records)
                context = None
                if records:
                    rows, context = (prepare or self._query_rows)(records)
                    self._fetch_rows(rows)  # 3.
            version = self._version
            values = run(records, context) if records else []  # 4. forward, outside the transaction
        return Answer(version.step, version.committed_at, values)

    def _query_rows(self, records: list) -> tuple[dict[str, np.ndarray], None]:
        return self._learner.rows_read(self._learner.prepare(records, train=False)), None

    def _topk_batch(self, records: list) -> tuple[dict[str, np.ndarray], Any]:
        batch = self._learner.prep.query(records, empty_tokens=True)  # "tokens": []: a first token, a new key
        return self._learner.rows_read(batch), batch

    def _query_batch(self, records: list) -> tuple[dict[str, np.ndarray], Any]:
        batch = self._learner.prepare(records, train=False)
        return self._learner.rows_read(batch), batch

    def _probs(self, records: list, batch: Any) -> list[dict]:
        """Label probabilities of a prepared query batch (prepared once, for the row
        reads and the forward pass)."""
        probs = self._learner.predict_proba_batch(batch)  # (N, n_labels)
        labels = self._learner.label_table.labels[:batch.n_labels]
        return [dict(zip(labels, row.tolist())) for row in probs]

    def _fetch_rows(self, rows: dict[str, np.ndarray]) -> None:
        """Read the rows an answer reads, those not yet read at this checkpoint, into the
        model (embedding rows; with the Naive Bayes part, its count rows too)."""
        for name, ids in rows.items():
            seen = self._row_version.get(name)
            if seen is None or not len(ids):
                continue  # a table read whole, or one the store has not declared
            stale = ids[seen[ids] != self._version.number]
            if len(stale):
                values, found = self._reader.read_rows(name, stale)  # (n, width), (n,)
                _write_rows(self._tables[name], stale[found], values[found])
                seen[stale] = self._version.number

    def _resolve(self, records: list) -> list:
        """A query by ``key`` (next-item) becomes a query on the key's stored history."""
        if self._learner.histories is None:
            return records
        return [self._history_query(r) if _is_key_query(r) else r for r in records]

    def _history_query(self, record: Mapping) -> dict:
        key = canonical_id(record["key"])
        query = {"tokens": self._reader.history(key), "key": key}
        if record.get("exclude") is not None:
            query["exclude"] = record["exclude"]
        return query

    def _embed_feats(self, records: list) -> tuple[dict[str, np.ndarray], tuple]:
        lists = [self._record_tokens(r, i) for i, r in enumerate(records)]
        featurizer = self._learner.featurizer
        feats = featurizer.featurize(lists, self.config.hashing.max_tokens, grow=False)
        return featurizer.rows_touched(feats), (lists, feats)

    @torch.inference_mode()
    def _embed(self, records: list, context: tuple) -> list[TokenVectors]:
        lists, feats = context
        tensors = self._learner.dev.tensors(feats)  # pinned, non-blocking on CUDA, as every query batch
        out = self._learner.model.embedding(tensors).float().cpu().numpy()  # (N, T, e)
        return [TokenVectors(tokens, out[i, :len(tokens)]) for i, tokens in enumerate(lists)]

    def _record_tokens(self, record: Any, i: int) -> list[str]:
        if not isinstance(record, Mapping):
            raise RecordError(f"wrong-type: query {i}: a record must be a dict, got {type(record).__name__}")
        check_query(record, i)  # blank text, no tokens, a lone surrogate
        return self._learner.prep.query_tokens(record, i)

    # ------------------------------------------------------------------ a replaced directory

    def _follow_directory(self) -> None:
        """A directory reset or replaced since it was opened: reopen it (a snapshot that
        opened its store) or raise SnapshotError; a deleted one raises."""
        moved = self._store.file_change()
        if moved is None:
            return
        path = self._store.path
        if moved == "deleted":
            raise SnapshotError(f"the state directory {path} (its data.mdb) is gone: deleted, or being reset by a "
                                "worker; query again once a model is saved there (or restore it)")
        if not self._owns_store:
            raise SnapshotError(f"the state directory {path} was reset or replaced after its store was opened (another "
                                "data.mdb): open a new store, or use Snapshot.open, which reopens it")
        # LMDB allows one environment per file in a process, and py-lmdb knows a file by
        # its lock.mdb too (a data.mdb restored alone keeps it): the old store goes first
        self._store.close()
        try:
            store = open_ready_store(path)
        except StateError as exc:
            raise SnapshotError(f"the state directory {path} was reset or replaced, and could not be opened again "
                                f"here ({exc}); another store or snapshot of it in this process may hold its old "
                                "files: close those, or restart the process") from exc
        try:
            reader = read_lazy(store, self._device)
        except BaseException:
            store.close()
            raise
        log.info("the state directory %s was reset or replaced: reopened it", path)
        self._store, self._reader = store, reader
        self._adopt()

    # ------------------------------------------------------------------ advancing

    @property
    def _learner(self) -> Learner:
        return self._reader.learner

    def _advance(self, manifest: Manifest) -> None:
        """Step 2 of the module docstring, inside the caller's read transaction: read what
        changed (:meth:`LazyCheckpoint.advance`), then the rows the commits since wrote,
        as the store's change log names them: the whole tables' are read, the lazily read
        ones become stale. Where the log does not reach back (a new model, a rewritten
        store, more than ``CHANGE_LOG`` commits since), every whole table is read again
        and every lazily read row becomes stale."""
        rewound = manifest.commits < self._version.commits  # a rewritten store
        if self._reader.advance(rebuild=rewound):
            self._adopt()  # a new model: another config in the directory, or a rewritten store
        lazy = {n: v for n, v in self._lazy_versions.items() if n in manifest.tables}
        known = frozenset(manifest.tables)
        changed = None
        if self._version.commits >= 0 and known == self._known:  # a table declared since: read everything
            changed = self._store.changed_rows(self._version.commits, manifest.commits)
        self._known = known
        for name in self._whole:
            if name in manifest.tables and changed is None:
                _load_whole(self._reader, name, self._tables[name])
            elif name in manifest.tables and name in changed:
                _load_rows(self._reader, name, self._tables[name], changed[name])
        v = self._version
        number = v.number + 1 if changed is None else v.number
        if changed is None:
            self._row_version = lazy
        else:
            for name, seen in self._row_version.items():
                seen[changed.get(name, _NO_IDS)] = -1  # read again when a query touches it
        self._version = _Version(manifest.commits, manifest.step, manifest.committed_at, number)

    def _adopt(self) -> None:
        """Track the rows of the reader's (new) learner: none read yet."""
        learner = self._learner
        self._tables = learner.value_tables()  # the Naive Bayes counts too: read lazily like embedding rows
        self._whole = learner.task.whole_tables(learner.model)
        self._lazy_versions = {
            n: np.full(t.shape[0], -1, dtype=np.int64) for n, t in self._tables.items() if n not in self._whole
        }
        self._known: frozenset[str] = frozenset()  # the store's tables at the last advance
        self._version = dataclasses.replace(self._version, commits=-1)

    # ------------------------------------------------------------------ lifecycle

    def close(self) -> None:
        """Release the store if this snapshot opened it (idempotent)."""
        if self._owns_store:
            self._store.close()
            self._owns_store = False

    def __enter__(self) -> "Snapshot":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<Snapshot {self._store.path} task={self.task} step={self.step}>"


# ---------------------------------------------------------------------------- helpers

@torch.no_grad()
def _write_rows(table: torch.Tensor, ids: np.ndarray, values: np.ndarray) -> None:
    if len(ids):
        index = torch.from_numpy(ids).to(table.device)
        table.index_copy_(0, index, torch.from_numpy(values).to(table.device, table.dtype))


_NO_IDS = np.empty(0, dtype=np.int64)


@torch.no_grad()
def _load_rows(reader: LazyCheckpoint, name: str, table: torch.Tensor, ids: np.ndarray, chunk: int = 65536) -> None:
    """Stored rows ``ids`` of ``name`` into ``table`` (every id was written: the change log's)."""
    for start in range(0, len(ids), chunk):
        part = ids[start:start + chunk]
        values, found = reader.read_rows(name, part)  # (n, width), (n,)
        _write_rows(table, part[found], values[found])


@torch.no_grad()
def _load_whole(reader: LazyCheckpoint, name: str, table: torch.Tensor, chunk: int = 65536) -> None:
    """Every stored row of ``name`` into ``table``. Rows never stored keep the in-memory
    value, which is their init (they were never overwritten). ``read_rows`` over all ids
    (in chunks) is about 2.5x faster here than ``load_table``'s cursor scan."""
    for start in range(0, table.shape[0], chunk):
        ids = np.arange(start, min(start + chunk, table.shape[0]), dtype=np.int64)
        values, found = reader.read_rows(name, ids)  # (n, width), (n,)
        _write_rows(table, ids[found], values[found])


def _is_key_query(record: Any) -> bool:
    return isinstance(record, Mapping) and record.get("tokens") is None and "key" in record \
        and not isinstance(record["key"], bool) and isinstance(record["key"], (str, int))


def _no_checkpoint(store: Store) -> str:
    return (f"{store.path} holds no learner checkpoint yet (step {store.manifest().step}): start a "
            "worker on it and wait for its first checkpoint (Snapshot.open(..., wait=SECONDS), "
            "streamlearn serve --wait SECONDS)")


def _require_checkpoint(store: Store) -> None:
    """NoCheckpointError, saying how to wait for one, unless ``store`` holds a checkpoint."""
    if not has_checkpoint(store):
        raise NoCheckpointError(_no_checkpoint(store))


def open_ready_store(state_dir: str, wait: float = 0.0) -> Store:
    """``state_dir`` opened read-only once it is a state directory holding a learner
    checkpoint, waiting up to ``wait`` seconds for both: ``worker ... &`` then ``serve
    --wait 60`` may start before the worker has created the directory. Raises the last
    NotAStoreError or NoCheckpointError when the time is up."""
    deadline, told = time.monotonic() + wait, False
    while True:
        try:
            store = open_store(state_dir, readonly=True, backend="lmdb")
            break
        except NotAStoreError as exc:  # absent, or being created (data.mdb and meta come in turn)
            if time.monotonic() >= deadline:
                raise
            if not told:
                log.info("waiting up to %.0f s for %s to become a state directory (%s)", wait, state_dir, exc)
                told = True
            time.sleep(0.2)
    try:
        wait_for_checkpoint(store, max(0.0, deadline - time.monotonic()))
    except BaseException:
        store.close()
        raise
    return store


def wait_for_checkpoint(store: Store, wait: float) -> None:
    """Return once ``store`` holds a learner checkpoint; NoCheckpointError after ``wait`` s."""
    deadline = time.monotonic() + wait
    while True:
        try:
            _require_checkpoint(store)
            return
        except NoCheckpointError:
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.2)
