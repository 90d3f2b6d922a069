"""The checkpoint codec: its errors name what is wrong in one line and have the right type
(a damaged store is never called a config mismatch, nor a mismatch a damaged store), and
no module but the codec spells a blob or namespace name."""
import ast
import io
import re
from pathlib import Path

import msgpack
import pytest
import torch

from streamlearn import checkpoint, snapshot
from streamlearn.checkpoint import (CANDIDATES_NS, CONFIG_BLOB, DENSE_BLOB, DENSE_OPTIM_BLOB, HISTORY_NS, LABELS_BLOB,
                                    META_BLOB, ROW_OPTIM_BLOB, read_full, write)
from streamlearn.config import Config, StoreConfig
from streamlearn.consumers.checkpoint import open_learner
from streamlearn.exceptions import (CheckpointError, CheckpointMismatchError, CorruptStateError, NoCheckpointError,
                                    StreamlearnError)
from streamlearn.learner import Learner
from streamlearn.snapshot import Snapshot
from streamlearn.state import Checkpoint, open_store

ROOT = Path(__file__).resolve().parent.parent
SMALL = ("embedding.K=2000", "embedding.B=256", "embedding.d=16", "model.d_model=16", "model.heads=2",
         "model.ffn=32", "model.out_B=256", "model.max_labels=16")
NEXT_ITEM = ("learner.task=next-item", "model.tie_output=false")

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def config(*overrides: str) -> Config:
    return Config().override(*SMALL, *overrides)


def trained(*overrides: str) -> Learner:
    lrn = Learner(config(*overrides))
    if lrn.histories is not None:
        lrn.learn_many([{"key": f"u{i % 5}", "item": f"i{i % 7}"} for i in range(40)])
    else:
        lrn.learn_many([{"text": f"goal match {i}", "label": "sport"} for i in range(8)]
                       + [{"text": f"chip code {i}", "label": "tech"} for i in range(8)])
    return lrn


@pytest.fixture(params=["lmdb", "memory"])
def store(request, tmp_path):
    with open_store(tmp_path / "state", StoreConfig(backend=request.param, shards=2, map_size_gb=0.05)) as s:
        yield s


def commit(lrn: Learner, store, full: bool = True) -> None:
    specs, rows, blobs, kv = write(lrn, full=full)
    store.declare_tables(specs)
    store.commit(Checkpoint(step=lrn.steps, rows=rows, blobs=blobs, kv=kv))


def damage(store, step: int, blobs: dict | None = None, kv: dict | None = None) -> None:
    """Overwrite (bytes) or delete (None) stored blobs and kv entries, as a damaged disk
    or a stray tool would."""
    store.commit(Checkpoint(step=step, blobs=blobs or {}, kv=kv or {}))


def one_line(exc: pytest.ExceptionInfo) -> str:
    message = str(exc.value)
    assert "\n" not in message and message
    return message


# ---------------------------------------------------------------------------- round trip

def test_labels_of_every_kind_round_trip(store):
    lrn = Learner(config())
    lrn.learn_many([{"text": "a", "label": "b"}, {"text": "b", "label": "a"}, {"text": "c", "label": 1}])
    commit(lrn, store)
    assert read_full(store).labels == ["b", "a", 1]


def test_the_history_key_rule_is_the_one_the_lazy_reader_looks_up(store):
    lrn = Learner(config(*NEXT_ITEM))
    long_key = "u" * 300  # stored under its digest
    lrn.learn_many([{"key": long_key, "item": "i1"}, {"key": long_key, "item": "i2"}, {"key": "short", "item": "i3"}])
    commit(lrn, store)
    assert store.read_kv(HISTORY_NS, checkpoint.history_key(long_key)) is not None
    assert len(checkpoint.history_key(long_key)) == 17
    reader = checkpoint.read_lazy(store)
    assert reader.history(long_key) == ["i1", "i2"] and reader.history("short") == ["i3"]
    assert reader.history("never") == []


# ---------------------------------------------------------------------------- no checkpoint

def test_an_empty_store_has_no_checkpoint(store):
    assert not checkpoint.has_checkpoint(store)
    with pytest.raises(NoCheckpointError) as exc:
        read_full(store)
    assert "no learner checkpoint yet" in one_line(exc)
    with pytest.raises(NoCheckpointError):
        read_full(store, config())
    with pytest.raises(NoCheckpointError):
        checkpoint.stored_config(store)
    assert snapshot.NoCheckpointError is NoCheckpointError  # one class, whoever raises it


# ---------------------------------------------------------------------------- corrupt state

FULL_READ_BLOBS = [CONFIG_BLOB, META_BLOB, LABELS_BLOB, DENSE_BLOB, DENSE_OPTIM_BLOB, ROW_OPTIM_BLOB]


@pytest.mark.parametrize("name", FULL_READ_BLOBS)
def test_a_missing_blob_is_corrupt_state(store, name):
    lrn = trained()
    commit(lrn, store)
    damage(store, lrn.steps, blobs={name: None})
    assert checkpoint.has_checkpoint(store)  # part of a checkpoint is still one: never a fresh start
    with pytest.raises(CorruptStateError) as exc:
        read_full(store)
    assert f"blob {name} is missing" in one_line(exc) and str(store.path) in str(exc.value)


@pytest.mark.parametrize("name", FULL_READ_BLOBS)
@pytest.mark.parametrize("garbage", [b"\xc1 not a checkpoint", b"", b"\x92\x01", msgpack.packb([1, 2])])
def test_an_unreadable_blob_is_corrupt_state(store, name, garbage):
    lrn = trained()
    commit(lrn, store)
    damage(store, lrn.steps, blobs={name: garbage})
    with pytest.raises(CorruptStateError) as exc:
        read_full(store)
    assert name in one_line(exc) and "unreadable" in str(exc.value)


def test_an_optimizer_state_of_another_structure_is_corrupt_state(store):
    lrn = trained()
    commit(lrn, store)
    buf = io.BytesIO()
    torch.save({"state": {}}, buf)  # torch bytes, but no AdamW state dict
    damage(store, lrn.steps, blobs={DENSE_OPTIM_BLOB: buf.getvalue()})
    with pytest.raises(CorruptStateError, match=DENSE_OPTIM_BLOB):
        read_full(store)
    damage(store, lrn.steps, blobs={ROW_OPTIM_BLOB: msgpack.packb({"rule": "adagrad", "steps": "many"})})
    with pytest.raises(CorruptStateError, match=ROW_OPTIM_BLOB):
        read_full(store)


def test_a_candidates_namespace_that_does_not_match_the_count_is_corrupt_state(store):
    lrn = trained(*NEXT_ITEM)
    commit(lrn, store)
    n = len(lrn.index)
    damage(store, lrn.steps, kv={CANDIDATES_NS: {n.to_bytes(8, "big"): b"extra"}})
    with pytest.raises(CorruptStateError) as exc:
        read_full(store)
    assert f"holds {n + 1} candidates but its checkpoint counted {n}" in one_line(exc)
    damage(store, lrn.steps, kv={CANDIDATES_NS: {n.to_bytes(8, "big"): None, (3).to_bytes(8, "big"): None}})
    with pytest.raises(CorruptStateError, match="numbered"):
        read_full(store)
    with pytest.raises(CorruptStateError, match="lacks some"):
        Snapshot(store)


@pytest.mark.parametrize("value", [b"\xc1", msgpack.packb({"not": "a list"}), msgpack.packb(["u1", [1, 2]])])
def test_an_unreadable_history_is_corrupt_state(store, value):
    lrn = trained(*NEXT_ITEM)
    commit(lrn, store)
    damage(store, lrn.steps, kv={HISTORY_NS: {checkpoint.history_key("u1"): value}})
    with pytest.raises(CorruptStateError) as exc:
        read_full(store)
    assert HISTORY_NS in one_line(exc)
    with Snapshot(store) as snap, pytest.raises(CorruptStateError):
        snap.topk([{"key": "u1"}])


def test_a_history_under_another_key_is_corrupt_state(store):
    lrn = trained(*NEXT_ITEM)
    commit(lrn, store)
    damage(store, lrn.steps, kv={HISTORY_NS: {b"u9": msgpack.packb(["u1", ["i1"]])}})
    with pytest.raises(CorruptStateError, match="stored under another key"):
        read_full(store)


def test_the_lazy_reader_reports_a_damaged_dense_blob_as_corrupt_state(store):
    lrn = trained()
    commit(lrn, store)
    with Snapshot(store) as snap:
        lrn.learn_many([{"text": "soup bread", "label": "food"}])
        specs, rows, blobs, kv = write(lrn)
        store.commit(Checkpoint(step=lrn.steps, rows=rows, blobs={**blobs, DENSE_BLOB: b"\x00" * 64}, kv=kv))
        with pytest.raises(CorruptStateError) as exc:
            snap.predict([{"text": "goal"}])
        assert DENSE_BLOB in one_line(exc)


def test_the_lazy_reader_never_reads_the_optimizer_blobs(store):
    lrn = trained()
    commit(lrn, store)
    damage(store, lrn.steps, blobs={DENSE_OPTIM_BLOB: None, ROW_OPTIM_BLOB: b"\xc1"})
    with Snapshot(store) as snap:
        assert snap.predict([{"text": "goal match"}]).values == lrn.predict_many([{"text": "goal match"}])


# ---------------------------------------------------------------------------- mismatch

def mismatch(store, *overrides: str) -> str:
    commit(trained(), store)
    with pytest.raises(CheckpointMismatchError) as exc:
        read_full(store, config(*overrides))
    return one_line(exc)


def test_a_table_of_another_shape_is_a_mismatch(store):
    message = mismatch(store, "embedding.B=512")
    assert "table E is 256x16 stored, 512x16 built" in message
    assert "embedding.B 256 -> 512" in message  # and the config key behind it


def test_dense_weights_of_other_names_are_a_mismatch(store):
    message = mismatch(store, "model.layers=1")
    assert "dense weights not stored: " in message and "model.layers 0 -> 1" in message


def test_dense_weights_of_another_shape_are_a_mismatch(store):
    assert "dense weight head.weight is (16, 16) stored, (24, 16) built" in mismatch(store, "model.max_labels=24")


def test_another_row_optimizer_rule_is_a_mismatch(store):
    assert "optim.sparse is 'adagrad' stored, 'lazy-adam' configured" in mismatch(store, "optim.sparse=lazy-adam")


def test_a_config_that_fits_is_no_mismatch(store):
    commit(trained(), store)
    assert read_full(store, config("optim.sparse_lr=0.5")).cfg.optim.sparse_lr == 0.5


def test_old_format_dense_keys_are_renamed_on_read(store):
    """Format < 3 stored the label head as "label_head.*": read as the model's "head.*"."""
    lrn = trained()
    commit(lrn, store)
    old = {("label_head." + k[len("head."):] if k.startswith("head.") else k): v for k, v in lrn.dense_state().items()}
    buf = io.BytesIO()
    torch.save(old, buf)
    damage(store, lrn.steps, blobs={DENSE_BLOB: buf.getvalue()})
    query = [{"text": "goal chip"}]
    assert read_full(store).predict_proba_many(query) == lrn.predict_proba_many(query)


# ---------------------------------------------------------------------------- the worker's door

def test_open_learner_calls_a_mismatch_a_mismatch_with_the_config_diff(store):
    commit(trained(), store)
    with pytest.raises(CheckpointMismatchError) as exc:
        open_learner(store, config("embedding.B=512"))
    message = one_line(exc)
    assert message.startswith(f"the state at {store.path} was trained with another model config (embedding.B 256 -> 512)")
    assert "same --config/--set" in message and "table E is 256x16 stored" in message


def test_a_refused_size_too_large_to_build_is_refused_not_a_traceback(store, monkeypatch):
    """A model key set far larger than the stored one (embedding.K=2^32: 34 GB) failed to
    allocate before the restart check could refuse it: a traceback, exit 1. The tables of
    such a size cannot be allocated in a test, so the allocation's failure stands in."""
    commit(trained(), store)

    def cannot_allocate(cfg):
        raise RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 34359738368 bytes")

    monkeypatch.setattr(checkpoint, "Learner", cannot_allocate)
    with pytest.raises(CheckpointMismatchError) as exc:
        open_learner(store, config("embedding.K=4294967296"))
    assert "embedding.K 2000 -> 4294967296" in one_line(exc) and "same --config/--set" in one_line(exc)
    with pytest.raises(CheckpointError, match="cannot be built here .*can't allocate memory"):
        open_learner(store, config())


def test_another_task_on_a_stored_model_is_refused_in_one_message_naming_the_task(store):
    """Was: the new task's defaults against the stored model keys, one rule at a time
    (model.counts='kn4' is a count part of task next-token ..., then model.recent_pairs)."""
    commit(trained(), store)
    for given in ({"learner.task"}, None):
        with pytest.raises(CheckpointMismatchError) as exc:
            open_learner(store, config("learner.task=mlm"), given=given)
        assert one_line(exc) == (f"the state at {store.path} holds a classify model, and this run asks for "
                                 "learner.task=mlm: run it as --task classify, or use a new --state directory")
    assert open_learner(store, config(), given=set()).task.name == "classify"


def test_another_task_on_a_model_that_learned_nothing_points_to_reset(tmp_path):
    """A worker run without --task on a token stream dead-letters every record and leaves
    a classify model at step 0 with offsets: the refusal says --reset starts it again."""
    with open_store(tmp_path / "s") as fresh:
        commit(Learner(config()), fresh)
        assert fresh.manifest().step == 0
        with pytest.raises(CheckpointMismatchError, match=r"learned nothing yet: --reset discards it and starts "
                                                          r"a next-token model"):
            open_learner(fresh, config("learner.task=next-token"), given={"learner.task"})


def test_open_learner_calls_corruption_corruption_even_with_a_changed_config(store):
    lrn = trained()
    commit(lrn, store)
    damage(store, lrn.steps, blobs={DENSE_BLOB: b"\xc1"})
    with pytest.raises(CorruptStateError) as exc:
        open_learner(store, config("model.layers=1", "optim.sparse_lr=0.5"))
    assert "trained with another model config" not in one_line(exc)


def test_open_learner_starts_fresh_only_on_an_empty_store(store):
    assert open_learner(store, config()).steps == 0
    lrn = trained()
    commit(lrn, store)
    damage(store, lrn.steps, blobs={META_BLOB: None})
    with pytest.raises(CorruptStateError):
        open_learner(store, config())


def test_the_errors_are_one_family_under_the_root():
    for error in (NoCheckpointError, CheckpointMismatchError, CorruptStateError):
        assert issubclass(error, CheckpointError) and issubclass(error, StreamlearnError)


def test_a_checkpoint_waits_for_every_prepared_batch():
    lrn = Learner(config())
    lrn.prepare([{"text": "x", "label": "a"}])
    with pytest.raises(CheckpointError, match="not learned yet"):
        write(lrn)


# ---------------------------------------------------------------------------- one owner

def _docstrings(tree: ast.AST) -> set[int]:
    nodes = [n for n in ast.walk(tree) if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))]
    return {id(n.body[0].value) for n in nodes
            if n.body and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}


def _string_constants(path: Path):
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skip = _docstrings(tree)  # prose may mention a blob; code may not spell one
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
            yield node.lineno, node.value


# A rank's gathered progress record carries its audit ranges under this field; the writer
# then commits them through checkpoint.audit_kv.
NOT_A_NAMESPACE = {("consumers/scaleout.py", "audit")}


def test_no_module_but_the_codec_spells_a_blob_or_namespace_name():
    blob = re.compile(r"(?<![\w.])(" + "|".join(map(re.escape, checkpoint.BLOBS)) + r")(?![\w])")
    found = []
    for package in ("streamlearn", "consumers", "state"):
        for path in sorted((ROOT / package).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if rel == "streamlearn/checkpoint.py":
                continue
            for line, value in _string_constants(path):
                if blob.search(value) or (value in checkpoint.NAMESPACES and (rel, value) not in NOT_A_NAMESPACE):
                    found.append(f"{rel}:{line}: {value[:60]!r}")
    assert not found, f"use the constants of streamlearn.checkpoint: {found}"


def test_the_scan_finds_a_spelled_name(tmp_path):
    """The check above can fail: a module spelling a blob or a namespace is found."""
    path = tmp_path / "m.py"
    path.write_text('"""Mentions learner.meta in prose."""\nstore.read_blob("learner.meta")\nstore.iter_kv("history")\n')
    values = [v for _, v in _string_constants(path)]
    assert values == ["learner.meta", "history"]


def test_docs_list_every_blob_and_namespace():
    doc = (ROOT / "docs" / "state.md").read_text(encoding="utf-8")
    missing = [name for name in (*checkpoint.BLOBS, *checkpoint.NAMESPACES) if f"`{name}`" not in doc]
    assert not missing, f"docs/state.md does not list {missing}"
    assert f"format {checkpoint.FORMAT}" in doc


def test_the_candidates_written_are_numbered_from_the_previous_checkpoint(store):
    lrn = trained(*NEXT_ITEM)
    commit(lrn, store, full=False)
    first = len(lrn.index)
    lrn.learn_many([{"key": "u1", "item": "brand-new"}])
    _, _, _, kv = write(lrn)
    assert kv[CANDIDATES_NS] == {first.to_bytes(8, "big"): b"brand-new"}
    assert kv[HISTORY_NS] == {b"u1": msgpack.packb(["u1", list(lrn.histories.get("u1"))])}  # the changed key only
