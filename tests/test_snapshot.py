"""Snapshot: answers equal a learner restored from the same checkpoint, across
checkpoints and schemes; rows are read lazily (once per checkpoint); it follows a
writer in another process through every checkpoint; bad directories fail with clear errors.
(How soon it follows, the freshness target of 1 s, is bench/serve.py's to measure.)"""
import json
import os
import random
import shutil
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import torch

from streamlearn.checkpoint import read_full, write
from streamlearn.config import Config
from streamlearn.decoding import DecodingError
from streamlearn.exceptions import RecordError
from streamlearn.learner import Learner
from streamlearn.snapshot import NoCheckpointError, Snapshot, SnapshotError, TaskMismatchError
from streamlearn.state import Checkpoint, NotAStoreError, open_store

SMALL = ("embedding.K=2000", "embedding.B=256", "embedding.d=16", "embedding.tfree_rows=512",
         "embedding.plain_vocab=64", "model.d_model=16", "model.heads=2", "model.ffn=32",
         "model.out_B=256", "model.max_labels=16")
WORDS = [f"w{i}" for i in range(120)]


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def commit(store, learner: Learner, step: int) -> None:
    """The minimal checkpoint of a learner (the worker adds offsets and metrics)."""
    specs, rows, blobs, kv = write(learner)
    store.declare_tables(specs)
    store.commit(Checkpoint(step=step, rows=rows, blobs=blobs, kv=kv, config=learner.cfg.to_dict()))


def stream(task: str, n: int, rng: random.Random) -> list[dict]:
    if task == "classify":
        return [{"tokens": rng.sample(WORDS, 5), "label": rng.choice("abc")} for _ in range(n)]
    if task in ("mlm", "next-token"):
        return [{"tokens": rng.sample(WORDS[:40], 5)} for _ in range(n)]
    return [{"key": f"u{rng.randrange(4)}", "item": rng.choice(WORDS[:30])} for _ in range(n)]


QUERIES = {
    "classify": [{"tokens": ["w1", "w2", "w3"]}, {"text": "w4 w5 never-seen"}, {"tokens": [7, "w9"]}],
    "mlm": [{"tokens": ["w1", "[MASK]", "w3"]}, {"text": "w4 w5"}],
    "next-token": [{"tokens": ["w1", "w2"]}, {"tokens": []}, {"text": "w4 never-seen"}],
    "next-item": [{"key": "u1"}, {"key": "nobody"}, {"tokens": ["w1", "w2"]}, {"key": 3}],
}


def answers(source, task: str):
    """(values, comparable) from a Snapshot or a Learner."""
    q = QUERIES[task]
    if isinstance(source, Snapshot):
        a = source.predict_proba(q) if task == "classify" else source.topk(q, k=5)
        return a.step, a.values
    return None, source.predict_proba_many(q) if task == "classify" else source.topk_many(q, k=5)


def assert_same(task: str, got: list, want: list) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want):
        if task == "classify":
            assert g.keys() == w.keys()
            np.testing.assert_allclose([g[k] for k in w], [w[k] for k in w], rtol=0, atol=1e-6)
        else:
            assert g.tokens == w.tokens and g.exact == w.exact
            np.testing.assert_allclose(g.scores, w.scores, rtol=0, atol=1e-5)


@pytest.mark.parametrize("scheme,task,extra", [
    ("hash", "classify", ()), ("hash", "mlm", ()), ("hash", "next-item", ()), ("bloom", "mlm", ()),
    ("plain", "classify", ()), ("hashformer-pool", "next-item", ()), ("tfree", "classify", ()),
    ("hash", "classify", ("learner.nb_weight=1.0", "learner.nb_cells=65536")),  # + the Naive Bayes counts
    ("hash", "next-token", ("model.output=sampled",)), ("hash", "mlm", ("model.output=sampled",)),
    *(("hash", task, ("model.output=sampled", "model.counts=kn3", "model.count_slots=1024"))  # + the count part
      for task in ("next-token", "mlm")),
])
def test_answers_equal_a_restored_learner_at_every_checkpoint(scheme, task, extra, tmp_path):
    rng = random.Random(0)
    learner = Learner(Config().override(*SMALL, f"embedding.scheme={scheme}", f"learner.task={task}", *extra))
    store = open_store(tmp_path / "state")
    learner.learn_many(stream(task, 32, rng))
    commit(store, learner, 1)
    with Snapshot.open(str(tmp_path / "state")) as snap:
        for step in (1, 2, 3):
            step_seen, got = answers(snap, task)
            assert step_seen == step == snap.step
            _, want = answers(read_full(store), task)
            assert_same(task, got, want)
            for _ in range(2):
                learner.learn_many(stream(task, 32, rng))
            commit(store, learner, step + 1)
    store.close()


def test_embed_gives_the_input_embedding_of_each_token(tmp_path):
    learner = Learner(Config().override(*SMALL))
    learner.learn_many(stream("classify", 32, random.Random(1)))
    with open_store(tmp_path) as store:
        commit(store, learner, 1)
        with Snapshot(store) as snap:
            answer = snap.embed([{"tokens": ["w1", 5, "unseen"]}, {"text": "W2 w3"}])
    first, second = answer.values
    assert first.tokens == ["w1", "5", "unseen"]
    assert second.tokens == ["w2", "w3", "w2 w3", "\x05w0", "\x05w0"]  # text: words, bigrams, digit shapes
    feats = learner.featurizer.featurize([first.tokens], 128)
    with torch.no_grad():
        want = learner.model.embedding(learner.dev.tensors(feats))[0].cpu().numpy()
    np.testing.assert_allclose(first.vectors, want, rtol=0, atol=1e-6)
    assert first.vectors.shape == (3, snap.embedding_dim) and answer.step == 1


class CountingStore:
    """The real store, with read_rows calls counted (rows asked for, per table)."""

    def __init__(self, store):
        self._store, self.rows = store, {}

    def read_rows(self, table, ids):
        self.rows[table] = self.rows.get(table, 0) + len(ids)
        return self._store.read_rows(table, ids)

    def __getattr__(self, name):
        return getattr(self._store, name)


def test_rows_are_read_once_per_checkpoint_and_only_those_touched(tmp_path):
    learner = Learner(Config().override(*SMALL, "learner.nb_weight=0.2"))  # with the Naive Bayes counts
    learner.learn_many(stream("classify", 32, random.Random(2)))
    store = open_store(tmp_path)
    commit(store, learner, 1)
    counting = CountingStore(store)
    snap = Snapshot(counting)
    query = [{"tokens": ["w1", "w2"]}]
    snap.predict(query)
    k = learner.cfg.embedding.k
    nb = len(learner.rows_read(learner.prepare(query, train=False))["nb.counts"])  # header + (token, label) rows
    assert 1 < nb <= 1 + 2 * len(learner.labels)
    once = {"E": 2 * k, "P": 2, "nb.counts": nb}  # two tokens: k buckets and one D1 row each
    assert counting.rows == once
    snap.predict(query)
    assert counting.rows == once  # same checkpoint: nothing read again
    learner.learn_many(stream("classify", 32, random.Random(3)))
    commit(store, learner, 2)
    touched = learner.rows_read(learner.prepare(query, train=False))
    changed = store.changed_rows(1, 2)
    again = {name: int(np.isin(np.unique(touched[name]), changed[name]).sum()) for name in once}
    assert 0 < sum(again.values()) < sum(once.values())  # the test reads some rows again, not all
    assert snap.predict(query).step == 2
    assert counting.rows == {name: n + again[name] for name, n in once.items()}  # what the commit wrote, again
    store.close()


def test_a_new_checkpoint_reads_only_the_rows_it_wrote_of_tables_read_whole(tmp_path):
    """A sampled head's output rows and the count part's tables are read whole by the first
    snapshot; after a commit only the rows it wrote (the store's change log), and whole
    again when the snapshot is further behind than the log reaches."""
    from streamlearn.state.changes import CHANGE_LOG

    rng = random.Random(5)
    learner = Learner(Config().override(*SMALL, "learner.task=next-token", "model.output=sampled",
                                        "model.counts=kn3", "model.count_slots=1024"))
    learner.learn_many(stream("next-token", 32, rng))
    store = open_store(tmp_path)
    commit(store, learner, 1)
    counting = CountingStore(store)
    snap = Snapshot(counting)
    whole = sorted(learner.task.whole_tables(learner.model))
    size = {name: store.tables()[name].rows for name in whole}
    assert {name: counting.rows.get(name) for name in whole} == size
    learner.learn_many(stream("next-token", 32, rng))
    commit(store, learner, 2)
    changed = store.changed_rows(1, 2)
    counting.rows.clear()
    assert_same("next-token", answers(snap, "next-token")[1], answers(read_full(store), "next-token")[1])
    assert {name: counting.rows.get(name, 0) for name in whole} == {n: len(changed.get(n, ())) for n in whole}
    assert sum(len(changed.get(n, ())) for n in whole) < sum(size.values()) / 2
    for step in range(3, 4 + CHANGE_LOG):
        learner.learn_many(stream("next-token", 8, rng))
        commit(store, learner, step)
    counting.rows.clear()
    assert_same("next-token", answers(snap, "next-token")[1], answers(read_full(store), "next-token")[1])
    assert {name: counting.rows.get(name) for name in whole} == size  # beyond the log: whole again
    store.close()


def test_task_mismatch_and_bad_queries_raise_clear_errors(tmp_path):
    learner = Learner(Config().override(*SMALL))
    learner.learn_many(stream("classify", 8, random.Random(4)))
    with open_store(tmp_path) as store:
        commit(store, learner, 1)
        snap = Snapshot(store)
        with pytest.raises(TaskMismatchError, match="use predict"):
            snap.topk([{"text": "w1"}])
        for k in (None, "3", 0):  # was: a TypeError from max(beam, k), or torch's RuntimeError
            with pytest.raises(DecodingError, match="k must be an int >= 1"):
                snap.explain([{"text": "w1"}], k=k)
        for bad in ({"tokens": "w1 w2"}, {"tokens": [1.5]}, {"nothing": 1}, "text", {"text": ""}, {"text": "  "},
                    {"tokens": []}, {"text": "w1 \ud800"}):  # blank, empty and a lone surrogate: was an answer, a crash
            with pytest.raises(RecordError):
                snap.predict([bad])
            with pytest.raises(RecordError):
                snap.embed([bad])
        assert snap.predict([]).values == []


def test_predict_on_a_non_classifier_names_topk(tmp_path):
    learner = Learner(Config().override(*SMALL, "learner.task=mlm"))
    learner.learn_many(stream("mlm", 8, random.Random(5)))
    with open_store(tmp_path) as store:
        commit(store, learner, 1)
        snap = Snapshot(store)
        with pytest.raises(TaskMismatchError, match=r"^predict_proba answers labels, from a classify model.*POST /v1/topk"):
            snap.predict_proba([{"text": "w1"}])
        with pytest.raises(TaskMismatchError, match=r"^predict answers labels, from a classify model.*Snapshot.topk"):
            snap.predict([{"text": "w1"}])
        for k, beam in ((None, None), ("3", None), (0, None), (3, 0)):  # was: TypeError, or beam 0 the default
            with pytest.raises(DecodingError, match="(k|beam) must be an int >= 1"):
                snap.topk([{"tokens": ["w1", "[MASK]"]}], k=k, beam=beam)
        assert len(snap.topk([{"tokens": []}], k=2).values) == 1  # empty tokens: still a top-k question


def test_open_rejects_missing_foreign_and_empty_directories(tmp_path):
    with pytest.raises(NotAStoreError, match="does not exist"):
        Snapshot.open(str(tmp_path / "missing"))
    (tmp_path / "foreign").mkdir()
    (tmp_path / "foreign" / "notes.txt").write_text("hello")
    with pytest.raises(NotAStoreError, match="not a streamlearn state"):
        Snapshot.open(str(tmp_path / "foreign"))
    open_store(tmp_path / "empty").close()
    with pytest.raises(NoCheckpointError, match="no learner checkpoint yet.*wait"):
        Snapshot.open(str(tmp_path / "empty"))


def test_open_waits_for_a_first_checkpoint(tmp_path):
    learner = Learner(Config().override(*SMALL))
    learner.learn_many(stream("classify", 8, random.Random(6)))
    store = open_store(tmp_path)
    timer = threading.Timer(0.3, commit, (store, learner, 7))
    timer.start()
    started = time.monotonic()
    with Snapshot.open(str(tmp_path), wait=20) as snap:
        assert snap.step == 7 and time.monotonic() - started >= 0.25
    timer.join()
    store.close()


WRITER = r"""
import json, random, sys
from streamlearn.checkpoint import write
from streamlearn.config import Config
from streamlearn.learner import Learner
from streamlearn.state import Checkpoint, open_store
import torch
torch.set_num_threads(1)
learner = Learner(Config())  # the default model: the freshness promise is for it
store = open_store(sys.argv[1])
rng = random.Random(0)
words = [f"w{i}" for i in range(5000)]
for step in range(1, 8):
    for _ in range(4):
        learner.learn_many([{"tokens": rng.sample(words, 12), "label": rng.choice("ab")} for _ in range(32)])
    specs, rows, blobs, kv = write(learner)
    store.declare_tables(specs)
    store.commit(Checkpoint(step=step, rows=rows, blobs=blobs, kv=kv, config=learner.cfg.to_dict()))
    print(json.dumps({"step": step}), flush=True)
    sys.stdin.readline()  # the next commit waits until the reader has seen this one
"""


def test_answers_follow_a_writer_in_another_process_through_every_checkpoint(tmp_path):
    """A query that starts after a commit returned answers from that checkpoint: the
    writer (the default model, another process) commits only after the reader has
    answered from its previous checkpoint, so the test counts events, not time."""
    state = str(tmp_path / "state")
    writer = subprocess.Popen([sys.executable, "-c", WRITER, state], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        committed, answered = [], []  # steps committed; the step of the answer after each
        line = writer.stdout.readline()
        with Snapshot.open(state) as snap:
            while line:
                committed.append(json.loads(line)["step"])
                answered.append(snap.predict([{"tokens": ["w1", "w2", "w3"]}]).step)
                writer.stdin.write("next\n")
                writer.stdin.flush()
                line = writer.stdout.readline()
        assert writer.wait(60) == 0
    finally:
        writer.kill()
        writer.wait()
    assert committed == answered == list(range(1, 8))


RESETTER = r"""
import random, shutil, sys
from streamlearn.checkpoint import write
from streamlearn.config import Config
from streamlearn.learner import Learner
from streamlearn.state import Checkpoint, open_store
import torch
torch.set_num_threads(1)
state, how, small = sys.argv[1], sys.argv[2], sys.argv[3:]
learner = Learner(Config().override(*small))
rng = random.Random(1)
learner.learn_many([{"tokens": rng.sample([f"w{i}" for i in range(50)], 4), "label": rng.choice("xy")}
                    for _ in range(16)])
if how == "rm":
    shutil.rmtree(state)
with open_store(state, reset=how == "reset") as store:
    specs, rows, blobs, kv = write(learner)
    store.declare_tables(specs)
    store.commit(Checkpoint(step=3, rows=rows, blobs=blobs, kv=kv, config=learner.cfg.to_dict()))
"""


@pytest.mark.parametrize("how", ["reset", "rm"])
def test_a_snapshot_follows_a_directory_another_process_resets_or_replaces(how, tmp_path):
    """Another process resets the directory (open_store(reset=True)), or deletes it and
    saves again, and commits a new model (labels x, y): the open snapshot says it is
    behind and answers from the new model, and so does a new Snapshot.open in this
    process (was: both kept answering from the old one, whose LMDB environment the
    process shared per path)."""
    state = str(tmp_path / "state")
    learner = Learner(Config().override(*SMALL))
    learner.learn_many(stream("classify", 16, random.Random(4)))  # labels a, b, c
    with open_store(state) as store:
        commit(store, learner, 9)
    with Snapshot.open(state) as snap:
        assert set(snap.predict_proba([{"tokens": ["w1"]}]).values[0]) == set("abc")
        subprocess.run([sys.executable, "-c", RESETTER, state, how, *SMALL], check=True, timeout=120)
        with Snapshot.open(state) as fresh:
            answer = fresh.predict_proba([{"tokens": ["w1"]}])
            assert answer.step == 3 and set(answer.values[0]) == set("xy")
        assert snap.behind()
        answer = snap.predict_proba([{"tokens": ["w1"]}])
        assert answer.step == 3 and set(answer.values[0]) == set("xy")
        assert not snap.behind()


def test_a_snapshot_follows_a_data_file_restored_alone(tmp_path):
    """A data.mdb copied over the directory's own (its lock.mdb kept, as a restore of the
    data file alone leaves it): was "already open in this process" on every later query
    (py-lmdb knows an environment by its lock file too, and the new one was opened before
    the old one closed)."""
    state, other = str(tmp_path / "state"), str(tmp_path / "other")
    first = Learner(Config().override(*SMALL))
    first.learn_many(stream("classify", 16, random.Random(4)))  # labels a, b, c
    with open_store(state) as store:
        commit(store, first, 9)
    second = Learner(Config().override(*SMALL))
    second.learn_many([{"tokens": ["w1", "w2"], "label": label} for label in ("x", "y")])
    with open_store(other) as store:
        commit(store, second, 3)
    with Snapshot.open(state) as snap:
        assert set(snap.predict_proba([{"tokens": ["w1"]}]).values[0]) == set("abc")
        os.replace(os.path.join(other, "data.mdb"), os.path.join(state, "data.mdb"))
        for _ in range(2):
            answer = snap.predict_proba([{"tokens": ["w1"]}])
            assert answer.step == 3 and set(answer.values[0]) == set("xy")


def test_a_snapshot_of_a_store_it_was_given_refuses_a_replaced_or_deleted_directory(tmp_path):
    state = str(tmp_path / "state")
    learner = Learner(Config().override(*SMALL))
    learner.learn_many(stream("classify", 8, random.Random(4)))
    with open_store(state) as store:
        commit(store, learner, 1)
    with open_store(state, readonly=True) as store:
        snap = Snapshot(store)
        subprocess.run([sys.executable, "-c", RESETTER, state, "reset", *SMALL], check=True, timeout=120)
        with pytest.raises(SnapshotError, match="reset or replaced after its store was opened.*Snapshot.open"):
            snap.predict([{"tokens": ["w1"]}])
    with Snapshot.open(state) as snap:
        shutil.rmtree(state)
        assert snap.behind()
        with pytest.raises(SnapshotError, match="is gone: deleted, or being reset by a worker"):
            snap.predict([{"tokens": ["w1"]}])
