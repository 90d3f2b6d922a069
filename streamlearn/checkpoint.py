"""The checkpoint format: the one codec of a :class:`~streamlearn.learner.Learner` in a store.

Every blob, key-value namespace and meta key of a checkpoint is named here and nowhere
else (tests/test_checkpoint.py greps the source tree), and every byte of them is
encoded and decoded here. The store (:mod:`streamlearn.state`) commits what
:func:`write` returns in one transaction with the consumed offsets; a checkpoint is read
back two ways:

- :func:`read_full` (training: the worker's ``open_learner``, replay, scale-out): a
  learner identical to the one checkpointed, optimizer state included;
- :func:`read_lazy` (serving: :class:`~streamlearn.snapshot.Snapshot`): the config, the
  counters, the dense weights, the labels, the candidates added since the last read, one
  key's history and rows on demand; never the optimizer blobs (twice the dense weights).

What a checkpoint of format :data:`FORMAT` holds:

- row tables: every table of :meth:`Learner.row_tables`, float32: the embedding's
  (``"E"``, ``"P"``, ...), the row optimizer's state (``"E.sum"`` for Adagrad;
  ``"E.exp_avg"``, ``"E.exp_avg_sq"`` for lazy Adam) and a task's count tables
  (``"nb.counts"``). Only rows changed since the previous checkpoint are written (all
  with ``full=True``). A row never written is still its seeded init, which the config
  rebuilds bit for bit, so a full read starts from the init and overlays stored rows.
- blobs: :data:`CONFIG_BLOB` (the config, JSON), :data:`META_BLOB` (msgpack map of the
  counters: :data:`META_FORMAT`, :data:`META_STEPS`, :data:`META_PREPARED`,
  :data:`META_APPLIED`, :data:`META_CANDIDATES`), :data:`DENSE_BLOB` (every non-row
  weight, ``torch.save``), :data:`DENSE_OPTIM_BLOB` (AdamW, ``torch.save``),
  :data:`ROW_OPTIM_BLOB` (the row optimizer's rule and step count, msgpack),
  :data:`LABELS_BLOB` (classify's label table, msgpack), :data:`SIZING_BLOB` (how a
  derived size was chosen, msgpack of :class:`~streamlearn.sizing.Sizing`; only a model
  sized from its stream has one); a group's writer adds
  :data:`FENCE_BLOB` (its generation, msgpack; :func:`fence_blob`).
- kv: :data:`HISTORY_NS` (:func:`history_key` -> msgpack ``[key, items]``; changed keys
  only), :data:`CANDIDATES_NS` (8-byte big-endian sequence number -> token, UTF-8; only
  tokens added since the previous checkpoint, replayed in order) and, with
  ``worker.audit``, :data:`AUDIT_NS` (8-byte big-endian commit number -> msgpack
  ``[[partition, first offset, last offset, records]]``; :func:`audit_kv`); from the
  worker, :data:`LIVE_NS` (8-byte big-endian point number -> msgpack map of the figures
  the dashboard draws, new and merged points only; :func:`live_kv`, :func:`read_live`).

Older formats still read: 1 -> 2 the Naive Bayes counts index tokens by hash embeddings'
D1 (format-1 counts are refused, :func:`check_format`); 2 -> 3 the task's head is the
model's one ``head`` (dense keys ``label_head.*``, ``hashed_head.*``, ``tfree_head.*``
are renamed on read).

Errors (:mod:`streamlearn.exceptions`): :class:`NoCheckpointError` (nothing stored
yet), :class:`CheckpointMismatchError` (the stored model does not fit the config),
:class:`CorruptStateError` (stored bytes missing or undecodable); never a raw decoder
error.
"""
from __future__ import annotations

import dataclasses
import io
import json
from typing import Any, Iterator, NamedTuple

import msgpack
import numpy as np
import torch
import xxhash

from .config import RUN_KEYS, Config, model_changes, stored_values
from .exceptions import CheckpointError, CheckpointMismatchError, CorruptStateError, NoCheckpointError
from .learner import Learner
from .sizing import Sizing, derived_keys
from .state.schema import TableSpec
from .tasks.classify import NB_COUNTS

__all__ = [
    "AUDIT_NS", "BLOBS", "CANDIDATES_NS", "CONFIG_BLOB", "DENSE_BLOB", "DENSE_OPTIM_BLOB", "FENCE_BLOB", "FORMAT",
    "HISTORY_NS", "LABELS_BLOB", "LIVE_NS", "LazyCheckpoint", "META_APPLIED", "META_BLOB", "META_CANDIDATES",
    "META_FORMAT", "META_PREPARED", "META_STEPS", "NAMESPACES", "Parts", "ROW_OPTIM_BLOB", "SIZING_BLOB", "TOPIC_ID_NS", "audit_kv",
    "check_format", "config_diff", "fence_blob", "has_checkpoint", "history_key", "live_kv", "read_audit", "topic_id_kv",
    "as_it_runs", "read_full", "read_lazy", "read_live", "read_topic_id", "stored_config", "stored_generation", "stored_labels", "stored_sizing",
    "write",
]

FORMAT = 3

CONFIG_BLOB = "learner.config"
# Model keys added after checkpoints were first written, and the value that behaves as
# the version before them did: a stored config without the key was written by that
# version, so it reads as that value (and a restart with today's default is refused,
# naming the key), never as today's default applied silently to rows trained without it.
ABSENT_KEYS = {("hashing", "shapes"): False, ("hashing", "scripts"): False, ("learner", "recency"): 0,
                ("learner", "key_token"): False, ("learner", "place_weights"): False, ("model", "count_join"): "mixture",
                ("model", "count_fit"): "joint", ("model", "recent_pairs"): 0, ("learner", "nb_skip_unseen"): False}
# Keys added after the behaviour they name had changed (2026-11-29 for a change of
# 2026-11-27 08:49): a stored config without the key that holds the later key here (added
# 2026-11-27 16:33) was written after the change, so it keeps the new behaviour (the default).
LATER_KEYS = {("learner", "nb_skip_unseen"): ("learner", "compiled")}
META_BLOB = "learner.meta"
LABELS_BLOB = "learner.labels"
DENSE_BLOB = "model.dense"
DENSE_OPTIM_BLOB = "optim.dense"
ROW_OPTIM_BLOB = "optim.rows"
FENCE_BLOB = "dist.fence"
SIZING_BLOB = "learner.sizing"
BLOBS = (CONFIG_BLOB, META_BLOB, LABELS_BLOB, DENSE_BLOB, DENSE_OPTIM_BLOB, ROW_OPTIM_BLOB, FENCE_BLOB, SIZING_BLOB)

HISTORY_NS = "history"
CANDIDATES_NS = "candidates"
AUDIT_NS = "audit"
LIVE_NS = "live"
TOPIC_ID_NS = "topic.id"
NAMESPACES = (HISTORY_NS, CANDIDATES_NS, AUDIT_NS, LIVE_NS, TOPIC_ID_NS)

META_FORMAT = "format"
META_STEPS = "steps"
META_PREPARED = "prepared"
META_APPLIED = "applied"
META_CANDIDATES = "candidates"

# The dense keys of the heads before format 3, renamed on read (the weights are the same).
_OLD_HEADS = ("label_head.", "hashed_head.", "tfree_head.")
_SHORT_KEY = 256  # longer history keys are stored under their xxh3-128 digest
# Config sections that may differ from the stored config without changing the model.
_RUNTIME_SECTIONS = ("worker", "store", "service", "kafka")


class Parts(NamedTuple):
    """What :func:`write` gives a store commit (``state.Checkpoint`` takes each part)."""

    specs: list[TableSpec]
    rows: dict[str, tuple[np.ndarray, np.ndarray]]  # table -> (ids (n,), values (n, width))
    blobs: dict[str, bytes]
    kv: dict[str, dict[bytes, bytes]]


@dataclasses.dataclass(frozen=True)
class _Meta:
    """The :data:`META_BLOB` counters."""

    format: int
    steps: int
    prepared: int
    applied: int
    candidates: int


# ---------------------------------------------------------------------------- write

def write(learner: Learner, full: bool = False) -> Parts:
    """The learner's checkpoint parts for one store commit (see the module docstring).

    Incremental (``full=False``): rows changed, history keys changed and candidates
    added since the previous call, which this call consumes; if the commit then fails,
    make the next one ``full=True``. Refused while a prepared training batch is not
    learned yet: the labels and histories would hold records the model has not applied.
    """
    if learner.pending:
        raise CheckpointError(
            f"{learner.pending} prepared batch(es) not learned yet: learn them "
            "before checkpointing, or the checkpoint would hold labels/histories of unapplied records"
        )
    tables = learner.row_tables()
    specs = [TableSpec(name, int(t.shape[0]), int(t.shape[1]), "float32") for name, t in tables.items()]
    rows = _changed_rows(tables, learner.take_dirty(), full)
    kv: dict[str, dict[bytes, bytes]] = {}
    if learner.histories is not None:
        kv[HISTORY_NS] = {history_key(k): msgpack.packb([k, list(v)]) for k, v in learner.take_histories(full).items()}
    candidates = 0
    if learner.index is not None:
        first, fresh = learner.take_new_candidates(full)
        kv[CANDIDATES_NS] = {_seq_key(first + i): t.encode("utf-8") for i, t in enumerate(fresh)}
        candidates = first + len(fresh)
    meta = _Meta(FORMAT, learner.steps, learner.prep.prepared, learner.applied, candidates)
    return Parts(specs, rows, _blobs(learner, meta), {ns: entries for ns, entries in kv.items() if entries})


def _changed_rows(tables: dict[str, torch.Tensor], dirty: dict[str, np.ndarray], full: bool):
    rows = {}
    for name, t in tables.items():
        ids = np.arange(t.shape[0], dtype=np.int64) if full else dirty.get(name)
        if ids is not None and len(ids):
            rows[name] = (ids, t.detach()[torch.from_numpy(ids).to(t.device)].float().cpu().numpy())
    return rows


def _blobs(learner: Learner, meta: _Meta) -> dict[str, bytes]:
    dense_optim, row_optim = learner.optimizer_state()
    blobs = {
        CONFIG_BLOB: learner.cfg.to_json().encode(),
        META_BLOB: msgpack.packb({META_FORMAT: meta.format, META_STEPS: meta.steps, META_PREPARED: meta.prepared,
                                  META_APPLIED: meta.applied, META_CANDIDATES: meta.candidates}),
    }
    if learner.label_table is not None:
        blobs[LABELS_BLOB] = msgpack.packb({"capacity": learner.label_table.capacity, "labels": learner.labels},
                                           use_bin_type=True)
    if learner.sizing is not None:
        blobs[SIZING_BLOB] = msgpack.packb(learner.sizing.to_dict())
    blobs[DENSE_BLOB] = _torch_bytes(learner.dense_state())
    blobs[DENSE_OPTIM_BLOB] = _torch_bytes(dense_optim)
    blobs[ROW_OPTIM_BLOB] = msgpack.packb(row_optim)
    return blobs


def _torch_bytes(obj) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def history_key(key: str) -> bytes:
    """The :data:`HISTORY_NS` key of a next-item key: its UTF-8 bytes, or for a key
    longer than 256 bytes ``0x01`` and its xxh3-128 digest (LMDB keys are short)."""
    raw = key.encode("utf-8")
    return raw if len(raw) <= _SHORT_KEY else b"\x01" + xxhash.xxh3_128_digest(raw)


def _seq_key(seq: int) -> bytes:
    return seq.to_bytes(8, "big")  # big-endian: a cursor walks the namespace in order


def audit_kv(commit: int, ranges: list[list[int]]) -> dict[str, dict[bytes, bytes]]:
    """The :data:`AUDIT_NS` entry of store commit number ``commit``: the offset ranges
    it applied, ``[partition, first, last, records]`` each (the worker's audit log)."""
    return {AUDIT_NS: {_seq_key(commit): msgpack.packb(ranges)}}


def topic_id_kv(topic: str, topic_id: str) -> dict[str, dict[bytes, bytes]]:
    """The :data:`TOPIC_ID_NS` entry of a commit: the broker's id of the ``topic`` read
    (a topic created again has a new one: ``consumers/positions.py``)."""
    return {TOPIC_ID_NS: {topic.encode(): topic_id.encode()}}


def live_kv(points: dict[int, dict | None]) -> dict[str, dict[bytes, bytes | None]]:
    """The :data:`LIVE_NS` entries of a commit: point number -> its figures (a map of
    str keys to numbers, None, lists and maps of them), or None to delete a point (one
    merged into its neighbour). The worker's live history (``consumers/live.py``)."""
    return {LIVE_NS: {_seq_key(n): None if figures is None else msgpack.packb(figures)
                      for n, figures in points.items()}}


def fence_blob(generation: int, rank: int, world_size: int) -> dict[str, bytes]:
    """The :data:`FENCE_BLOB` a group's writer commits with every checkpoint."""
    return {FENCE_BLOB: msgpack.packb({"generation": generation, "rank": rank, "world_size": world_size})}


# ---------------------------------------------------------------------------- small reads

def has_checkpoint(store) -> bool:
    """Whether ``store`` holds a learner checkpoint (its config or counters): False for
    a new or empty store. A checkpoint with only some of its blobs is still one; reading
    it raises :class:`CorruptStateError`."""
    with store.snapshot():
        return store.read_blob(META_BLOB) is not None or store.read_blob(CONFIG_BLOB) is not None


def stored_config(store) -> Config:
    """The config a store's learner was checkpointed with."""
    with store.snapshot():
        return _config_of(_config_bytes(store), store)


def stored_task(path) -> str | None:
    """The task of the model checkpointed in the state directory at ``path``; None where
    there is none to read (no directory, no checkpoint yet, damage: the command that
    opens the state for its work says why). A command given no task builds its config
    on this one, so a ``--set`` of a key only that task takes is checked against it."""
    from .exceptions import StreamlearnError
    from .state import open_store

    try:
        with open_store(path, readonly=True, backend="lmdb") as store:
            return stored_config(store).learner.task if has_checkpoint(store) else None
    except StreamlearnError:
        return None


def stored_word_tables(store) -> list[str]:
    """The stored model's row tables whose float32 words hold bits (hashed keys, output
    codes), not numbers, as its task declares them (:meth:`Task.word_tables
    <streamlearn.tasks.base.Task.word_tables>`); none before the first checkpoint."""
    from .featurize import build_featurizer
    from .tasks import build_task

    if not has_checkpoint(store):
        return []
    cfg = stored_config(store).override("learner.compiled=false")  # names only: no kernels to load
    return sorted(build_task(cfg, build_featurizer(cfg.embedding, cfg.hashing.seed)).word_tables())


def stored_sizing(store) -> Sizing | None:
    """How the store's model had its derived sizes chosen (None: it was not sized from
    its stream). Call it inside ``store.snapshot()``."""
    raw = store.read_blob(SIZING_BLOB)
    if raw is None:
        return None
    obj = _unpack(raw, SIZING_BLOB, store)
    try:
        return Sizing.from_dict(obj)
    except TypeError as exc:  # not a map, or other fields
        raise _corrupt(store, SIZING_BLOB, exc) from exc


def stored_generation(store) -> int:
    """The group generation of the last fenced commit (0: never)."""
    raw = store.read_blob(FENCE_BLOB)
    return int(_field(_unpack(raw, FENCE_BLOB, store), "generation", int, FENCE_BLOB, store)) if raw else 0


def read_audit(store) -> Iterator[tuple[int, list[tuple[int, int, int, int]]]]:
    """Every checkpoint's audit entry, in commit order: ``(commit number, [(partition,
    first offset, last offset, records)])``. Present only with ``worker.audit=true``."""
    for key, value in store.iter_kv(AUDIT_NS):
        yield int.from_bytes(key, "big"), [tuple(r) for r in _unpack(value, AUDIT_NS, store)]


def read_topic_id(store, topic: str) -> str | None:
    """The id of ``topic`` a checkpoint stored with its offsets (None: none yet, or a state
    written before ids were kept)."""
    stored = store.read_kv(TOPIC_ID_NS, topic.encode())
    return None if stored is None else stored.decode()


def read_live(store) -> list[tuple[int, dict]]:
    """Every stored :data:`LIVE_NS` point in order: ``(point number, figures)`` (empty
    for a store no worker wrote figures into). Call it inside ``store.snapshot()`` to
    read the points of one checkpoint."""
    points = []
    for key, value in store.iter_kv(LIVE_NS):
        figures = _unpack(value, LIVE_NS, store)
        if len(key) != 8 or not isinstance(figures, dict):
            raise _corrupt(store, LIVE_NS, f"entry {key[:40]!r} is not a numbered map")
        points.append((int.from_bytes(key, "big"), figures))
    return points


def stored_labels(store) -> list:
    """classify: the labels of a store's checkpoint, in label-id order (empty for the
    other tasks, which store none)."""
    raw = store.read_blob(LABELS_BLOB)
    return [] if raw is None else _read_labels(store)


def config_diff(old: Config, new: Config) -> str:
    """``"model.layers 0 -> 1, ..."``: the keys of ``new`` that differ from ``old`` and
    may not change on a restart (not the sections worker, store, service, kafka, nor the
    run keys, such as learning rates: naming those would send a user after the wrong key)."""
    a, b = old.to_dict(), new.to_dict()
    diffs = [f"{section}.{key} {a[section][key]!r} -> {value!r}"
             for section, values in b.items() if section not in _RUNTIME_SECTIONS
             for key, value in values.items() if a[section].get(key) != value and f"{section}.{key}" not in RUN_KEYS]
    return ", ".join(diffs)


def check_format(learner: Learner, stored_format: int, store) -> None:
    """Refuse Naive Bayes counts stored by checkpoint format 1, which indexed tokens by a
    hash of their own (format 2 reuses D1), rather than read them as wrong counts
    (:class:`CheckpointMismatchError`). A format-1 state without counts reads with the
    part on: it starts counting then."""
    if NB_COUNTS in learner.task.count_tables() and stored_format < 2 and NB_COUNTS in store.tables():
        raise CheckpointMismatchError(
            f"{store.path}: this checkpoint's Naive Bayes counts were written by an older streamlearn "
            f"(checkpoint format {stored_format}, this one reads {FORMAT}) and index tokens differently: "
            "restore with learner.nb_weight=0, or train into a new state directory",
            (f"Naive Bayes counts of checkpoint format {stored_format}",))


# ---------------------------------------------------------------------------- full read

def read_full(store, cfg: Config | None = None) -> Learner:
    """A learner identical to the one checkpointed into ``store``, optimizer state
    included (training resumes bit for bit). Built from the stored config unless ``cfg``
    is given, which must build the same tables and weights (it may change e.g. learning
    rates). A size ``cfg`` leaves to be derived (``model.out_B=0``) is the stored one: a
    stored model is never sized again. Raises :class:`NoCheckpointError`,
    :class:`CheckpointMismatchError`, :class:`CorruptStateError`."""
    if not has_checkpoint(store):
        raise NoCheckpointError(_no_checkpoint(store))
    given = cfg is not None
    if cfg is None:
        cfg = stored_config(store)
    elif derived_keys(cfg):
        cfg = cfg.override(f"model.out_B={stored_config(store).model.out_B}")
    try:
        learner = Learner(cfg)
    except (RuntimeError, MemoryError) as exc:  # the tables do not fit in memory
        if given:
            _check_restart(store, cfg)  # a size the restart refuses anyway: say that
        raise CheckpointError(f"{store.path}: the model of this config cannot be built here ({exc})") from exc
    with store.snapshot():  # one checkpoint: counters, rows, blobs and kv agree
        meta = _read_meta(store)
        check_format(learner, meta.format, store)
        dense = _read_dense(store, "cpu")
        row_optim = _read_row_optim(store)
        misfits = _misfits(learner, store, dense) + _rule_misfit(learner, row_optim)
        if misfits:
            raise _mismatch(store, learner.cfg, misfits, compare=given)
        if given:
            _check_restart(store, cfg)
        _load_rows(learner, store)
        learner.load_dense_state(dense)
        _load_optimizers(learner, store, row_optim)
        if learner.label_table is not None:
            learner.replace_labels(_read_labels(store))
        if learner.histories is not None:
            learner.replace_histories(_read_histories(store))
        if learner.index is not None:
            learner.reset_candidates()
            learner.extend_candidates(_read_candidates(store, meta.candidates))
        learner.sizing = stored_sizing(store)
    learner.resume(meta.steps, meta.prepared, meta.applied)
    return learner


@torch.no_grad()
def _load_rows(learner: Learner, store) -> None:
    stored = store.tables()
    initial = learner.initial_rows()  # rows never stored keep their seeded init
    for name, t in learner.row_tables().items():
        host = initial[name]
        if name in stored:
            store.load_table(name, host.numpy())
        t.copy_(host.to(t.device))


def _load_optimizers(learner: Learner, store, row_optim: dict) -> None:
    dense_optim = _torch_load(_blob(store, DENSE_OPTIM_BLOB), DENSE_OPTIM_BLOB, store, "cpu")
    try:
        learner.load_optimizer_state(dense_optim, row_optim)
    except (ValueError, KeyError, TypeError, IndexError, AttributeError) as exc:  # AdamW's checks of a state dict
        raise _corrupt(store, DENSE_OPTIM_BLOB, exc) from exc


def _read_histories(store) -> Iterator[tuple[str, list[str]]]:
    for stored_key, value in store.iter_kv(HISTORY_NS):
        key, items = _history_entry(value, store)
        if history_key(key) != stored_key:
            raise CorruptStateError(f"{store.path}: {HISTORY_NS} entry {stored_key[:40]!r} holds key {key[:40]!r}, "
                                    f"stored under another key: {_DAMAGED}")
        yield key, items


def _read_candidates(store, count: int) -> list[str]:
    tokens = []
    for seq, (key, value) in enumerate(store.iter_kv(CANDIDATES_NS)):
        if key != _seq_key(seq):
            raise CorruptStateError(f"{store.path}: {CANDIDATES_NS} entry {seq} is numbered "
                                    f"{int.from_bytes(key, 'big')}: the namespace was altered; {_DAMAGED}")
        tokens.append(_token(value, store))
    if len(tokens) != count:
        raise CorruptStateError(f"{store.path}: the store holds {len(tokens)} {CANDIDATES_NS} but its checkpoint "
                                f"counted {count}: the namespace was altered; {_DAMAGED}")
    return tokens


# ---------------------------------------------------------------------------- lazy read

def read_lazy(store, device: str | None = None) -> "LazyCheckpoint":
    """A :class:`LazyCheckpoint` of ``store`` (a learner built from the stored config;
    ``device`` overrides ``learner.device``): nothing but the config is read until
    :meth:`LazyCheckpoint.advance`. Raises :class:`NoCheckpointError`."""
    return LazyCheckpoint(store, device)


class LazyCheckpoint:
    """A store's latest checkpoint, read in the parts a query needs (serving).

    ``learner`` is built from the stored config. :meth:`advance` reads, inside the
    caller's read transaction, what changes at every checkpoint and is small: counters,
    dense weights, labels and the candidates added since; rows (:meth:`read_rows`) and
    histories (:meth:`history`) are read on demand. The optimizer blobs are never read.
    """

    def __init__(self, store, device: str | None = None):
        self._store, self._device = store, device
        with store.snapshot():
            self._config = _config_bytes(store)
        self.learner = self._build(self._config)

    def advance(self, rebuild: bool = False) -> bool:
        """Read the store's current checkpoint into :attr:`learner` (call it inside the
        store's ``snapshot()``). The learner is built anew when the stored config changed
        or ``rebuild`` (a rewritten store); returns whether it was: every row then is its
        init again."""
        store = self._store
        config = _config_bytes(store)
        meta = _read_meta(store)
        rebuilt = rebuild or config != self._config
        if rebuilt:
            self.learner, self._config = self._build(config), config
        learner = self.learner
        check_format(learner, meta.format, store)
        dense = _read_dense(store, learner.device)
        misfits = _misfits(learner, store, dense)
        if misfits:
            raise _mismatch(store, learner.cfg, misfits, compare=False)
        learner.load_dense_state(dense)
        if learner.label_table is not None:
            learner.replace_labels(_read_labels(store))
        self._read_new_candidates(meta.candidates)
        return rebuilt

    def history(self, key: str) -> list[str]:
        """The stored history of next-item key ``key`` (empty for a key never seen)."""
        value = self._store.read_kv(HISTORY_NS, history_key(key))
        return [] if value is None else _history_entry(value, self._store)[1]

    def read_rows(self, table: str, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Stored rows ``ids`` of ``table``: values (n, width) and found (n,) (rows never
        stored read as zeros, found False)."""
        return self._store.read_rows(table, ids)

    def _build(self, config: bytes) -> Learner:
        cfg = _config_of(config, self._store)
        if self._device is not None:
            cfg = cfg.override(f"learner.device={self._device}")
        return Learner(cfg)

    def _read_new_candidates(self, count: int) -> None:
        learner, store = self.learner, self._store
        if learner.index is None:
            return
        if count < learner.candidates_mark:  # fewer than before: the store was rewritten
            learner.reset_candidates()
        values = [store.read_kv(CANDIDATES_NS, _seq_key(seq)) for seq in range(learner.candidates_mark, count)]
        if any(v is None for v in values):
            raise CorruptStateError(f"{store.path}: the checkpoint counts {count} decoding candidates but the store "
                                    f"lacks some: the {CANDIDATES_NS} namespace was altered; {_DAMAGED}")
        learner.extend_candidates([_token(v, store) for v in values])


# ---------------------------------------------------------------------------- fit

def _misfits(learner: Learner, store, dense: dict[str, torch.Tensor]) -> list[str]:
    """What of the stored model does not fit ``learner``: table shapes, dense names and shapes."""
    out = []
    stored = store.tables()
    for name, t in learner.row_tables().items():
        spec = stored.get(name)
        if spec is not None and (spec.rows, spec.width) != tuple(t.shape):
            out.append(f"table {name} is {spec.rows}x{spec.width} stored, {t.shape[0]}x{t.shape[1]} built")
    want = learner.dense_state()
    missing, unexpected = sorted(set(want) - set(dense)), sorted(set(dense) - set(want))
    if missing:
        out.append(f"dense weights not stored: {_some(missing)}")
    if unexpected:
        out.append(f"stored dense weights this model lacks: {_some(unexpected)}")
    for key in sorted(set(want) & set(dense)):
        # A module's extra state (the plain scheme's dictionary) grows: its size is data.
        if not key.endswith("_extra_state") and dense[key].shape != want[key].shape:
            out.append(f"dense weight {key} is {tuple(dense[key].shape)} stored, {tuple(want[key].shape)} built")
    return out


def _rule_misfit(learner: Learner, row_optim: dict) -> list[str]:
    rule, ours = row_optim["rule"], learner.cfg.optim.sparse
    return [] if rule == ours else [f"optim.sparse is {rule!r} stored, {ours!r} configured"]


def _check_restart(store, cfg: Config) -> None:
    """Refuse a config that changes a key of :data:`~streamlearn.config.MODEL_KEYS` from
    the stored one, even where the tables and weights would fit (a hash seed, the
    tokenizer, the Naive Bayes part: what stored rows MEAN); keys of ``RUN_KEYS`` may
    change. (Keys whose change also misfits a table or weight are named by the misfits
    check before this one, with the shapes.)"""
    stored = stored_config(store)
    changes = model_changes(stored, cfg)
    if changes:
        keep = " ".join(f"--set {dotted}={value}" for dotted, value in stored_values(stored, changes))
        raise CheckpointMismatchError(
            f"{store.path}: the stored model was trained with other values of keys that change what its rows "
            f"and weights mean ({'; '.join(changes)}): open it with the stored values ({keep}), or start a new "
            "model (a new --state directory, or `worker --reset` to discard this one)",
            tuple(changes), config_diff(stored, cfg))


def _mismatch(store, cfg: Config, misfits: list[str], compare: bool) -> CheckpointMismatchError:
    diff, keep = "", ""
    if compare:
        try:
            stored = stored_config(store)
        except CheckpointError:
            stored = None  # the stored config is unreadable: the misfits still say what differs
        if stored is not None:
            diff = config_diff(stored, cfg)
            keep = " ".join(f"--set {k}={v}" for k, v in stored_values(stored, model_changes(stored, cfg)))
    differs = f"; the config differs from the stored one: {diff}" if diff else ""
    how = f"open it with the stored values ({keep})" if keep else "restore with the stored config"
    return CheckpointMismatchError(
        f"{store.path}: the stored model does not fit this config ({'; '.join(misfits)}){differs}: {how}, or "
        "start a new model (a new --state directory, or `worker --reset` to discard this one)", tuple(misfits), diff)


def _some(names: list[str], n: int = 5) -> str:
    more = f" and {len(names) - n} more" if len(names) > n else ""
    return ", ".join(names[:n]) + more


# ---------------------------------------------------------------------------- decoding

_DAMAGED = "restore the state directory from a good copy, or train into a new one"


def _no_checkpoint(store) -> str:
    return (f"{store.path} holds no learner checkpoint yet: train into it first (streamlearn worker "
            "--state DIR), or pass a state directory a worker or `replay --save` wrote")


def _corrupt(store, what: str, exc: BaseException | str) -> CorruptStateError:
    detail = " ".join(str(exc).split())[:120] or type(exc).__name__
    return CorruptStateError(f"{store.path}: checkpoint {what} is unreadable ({detail}): {_DAMAGED}")


def _blob(store, name: str) -> bytes:
    data = store.read_blob(name)
    if data is None:
        raise CorruptStateError(f"{store.path}: checkpoint blob {name} is missing though the store holds a "
                                f"checkpoint: {_DAMAGED}")
    return data


def _unpack(data: bytes, what: str, store) -> Any:
    try:
        return msgpack.unpackb(data)
    except (ValueError, TypeError, msgpack.UnpackException) as exc:  # TypeError: an unhashable map key
        raise _corrupt(store, what, exc) from exc


def _torch_load(data: bytes, what: str, store, device: torch.device | str):
    try:
        return torch.load(io.BytesIO(data), map_location=device, weights_only=True)
    # Damaged torch.save bytes raise a zoo of types (measured: KeyError, EOFError,
    # RuntimeError, UnicodeDecodeError, UnpicklingError), none of them torch's own.
    except Exception as exc:
        raise _corrupt(store, what, exc) from exc


def _field(obj: Any, key: str, kind: type, what: str, store) -> Any:
    value = obj.get(key) if isinstance(obj, dict) else None
    if not isinstance(value, kind) or isinstance(value, bool):
        raise _corrupt(store, what, f"no {kind.__name__} {key!r}")
    return value


def _config_bytes(store) -> bytes:
    data = store.read_blob(CONFIG_BLOB)
    if data is None:
        if store.read_blob(META_BLOB) is None:
            raise NoCheckpointError(_no_checkpoint(store))
        return _blob(store, CONFIG_BLOB)
    return data


def _config_of(data: bytes, store) -> Config:
    try:
        obj = json.loads(data)
    except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError
        raise _corrupt(store, CONFIG_BLOB, exc) from exc
    if not isinstance(obj, dict):
        raise _corrupt(store, CONFIG_BLOB, "not a JSON object")
    return Config.from_dict(as_it_runs(obj))


def as_it_runs(config: dict) -> dict:
    """A stored config (a dict) with the keys it is older than (:data:`ABSENT_KEYS`, dated
    by :data:`LATER_KEYS`) at the values the model runs with; a copy, sections that are
    not dicts left as they are (the config's own check names them)."""
    out = {section: dict(values) if isinstance(values, dict) else values for section, values in config.items()}
    for (section, name), value in ABSENT_KEYS.items():
        if isinstance(out.get(section), dict) and name not in out[section]:
            later = LATER_KEYS.get((section, name))
            if later is None or later[1] not in (out.get(later[0]) or {}):
                out[section][name] = value
    return out


def _read_meta(store) -> _Meta:
    obj = _unpack(_blob(store, META_BLOB), META_BLOB, store)
    if isinstance(obj, dict):
        obj = {META_FORMAT: 1, META_CANDIDATES: 0, **obj}  # format 1 stored neither
    return _Meta(*(_field(obj, key, int, META_BLOB, store)
                   for key in (META_FORMAT, META_STEPS, META_PREPARED, META_APPLIED, META_CANDIDATES)))


def _read_dense(store, device: torch.device | str) -> dict[str, torch.Tensor]:
    """The :data:`DENSE_BLOB` state dict on ``device``, keys of an older format renamed."""
    state = _torch_load(_blob(store, DENSE_BLOB), DENSE_BLOB, store, device)
    if not isinstance(state, dict) or not all(isinstance(k, str) and torch.is_tensor(v) for k, v in state.items()):
        raise _corrupt(store, DENSE_BLOB, "not a state dict")
    return {_current_key(k): v for k, v in state.items()}


def _current_key(key: str) -> str:
    old = next((p for p in _OLD_HEADS if key.startswith(p)), None)
    return key if old is None else "head." + key[len(old):]


def _read_row_optim(store) -> dict:
    obj = _unpack(_blob(store, ROW_OPTIM_BLOB), ROW_OPTIM_BLOB, store)
    return {"rule": _field(obj, "rule", str, ROW_OPTIM_BLOB, store),
            "steps": _field(obj, "steps", int, ROW_OPTIM_BLOB, store)}


def _read_labels(store) -> list:
    labels = _field(_unpack(_blob(store, LABELS_BLOB), LABELS_BLOB, store), "labels", list, LABELS_BLOB, store)
    if not all(isinstance(label, (str, int)) for label in labels):
        raise _corrupt(store, LABELS_BLOB, "a label that is neither str nor int")
    return labels


def _history_entry(value: bytes, store) -> tuple[str, list[str]]:
    entry = _unpack(value, HISTORY_NS, store)
    if not (isinstance(entry, list) and len(entry) == 2 and isinstance(entry[0], str) and isinstance(entry[1], list)
            and all(isinstance(item, str) for item in entry[1])):
        raise _corrupt(store, HISTORY_NS, "an entry that is not [key, items]")
    return entry[0], entry[1]


def _token(value: bytes, store) -> str:
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _corrupt(store, CANDIDATES_NS, exc) from exc
