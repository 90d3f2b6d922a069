"""Tasks are classes chosen once (streamlearn.tasks): every task module is registered,
the ingest half is pure numpy and picklable, and each task answers through one interface."""
import pickle
import pkgutil
import subprocess
import sys

import numpy as np
import pytest
import torch

import streamlearn.tasks as tasks
from streamlearn.batching import Schedule
from streamlearn.config import TASKS, Config
from streamlearn.embeddings import to_tensors
from streamlearn.exceptions import ConfigError
from streamlearn.featurize import NGRAM_SEP, input_ngrams
from streamlearn.learner import Learner
from streamlearn.objectives import BOS_TOKEN
from streamlearn.tasks.base import Task

SMALL = ("embedding.K=1000", "embedding.B=100", "embedding.d=16", "model.d_model=16", "model.out_B=128",
         "model.max_labels=8")
RECORDS = {
    "classify": [{"text": f"word{i % 5} other{i % 3}", "label": f"l{i % 3}"} for i in range(20)],
    "mlm": [{"text": f"word{i % 5} other{i % 3} third{i % 7}"} for i in range(20)],
    "next-item": [{"key": f"u{i % 4}", "item": f"i{i % 9}"} for i in range(20)],
    "next-token": [{"text": f"word{i % 5} other{i % 3} third{i % 7}"} for i in range(20)],
}


def test_every_task_module_is_registered_and_nothing_else():
    """Adding a task is one module in streamlearn/tasks and one registry line."""
    modules = {m.name for m in pkgutil.iter_modules(tasks.__path__)} - {"base"}
    registered = {entry.path.partition(":")[0] for entry in tasks.REGISTRY.values()}
    assert modules == registered
    assert TASKS == tuple(tasks.REGISTRY)
    for name in tasks.REGISTRY:
        cls = tasks.task_class(name)
        assert issubclass(cls, Task) and cls.name == name and cls.answers in ("labels", "tokens")


def test_a_tasks_defaults_apply_to_the_keys_not_set():
    """learner.task brings the task's defaults; a key given in the same call, in a file or
    set earlier to another value keeps its value; switching back restores the others."""
    for name, entry in tasks.REGISTRY.items():
        cfg = Config().override(f"learner.task={name}")
        for assignment in entry.defaults:
            dotted, _, value = assignment.partition("=")
            section, key = dotted.split(".")
            assert str(getattr(getattr(cfg, section), key)).lower() == value.lower(), (name, assignment)
    assert Config().override("learner.task=next-item", "model.out_B=1000").model.out_B == 1000
    assert Config().override("model.out_B=1000").override("learner.task=next-item").model.out_B == 1000
    back = Config().override("learner.task=next-item").override("learner.task=classify")
    assert back == Config()
    stored = Config.from_dict(Config().override("learner.task=next-item", "model.out_B=777").to_dict())
    assert stored.model.out_B == 777 and stored.hashing.tokenizer == "ids"


def test_a_learners_schedule_is_its_batch_size_its_tasks_ramp_and_its_doubling():
    """What the worker, replay and the benchmarks cut a stream by: classify ramps up (1, 2,
    4, ...), next-item takes 128 records a step, next-token doubles its batch from step
    250, a set key wins."""
    schedules = {name: Learner(Config().override(*SMALL, f"learner.task={name}")).schedule for name in TASKS}
    assert schedules == {"classify": Schedule(8, ramp=True, double_after=0),
                         "mlm": Schedule(8, ramp=False, double_after=0),
                         "next-item": Schedule(64, ramp=False, double_after=0),
                         "next-token": Schedule(8, ramp=False, double_after=250)}
    mine = Learner(Config().override(*SMALL, "learner.task=next-token", "learner.batch_size=4",
                                     "learner.double_batch_after=3")).schedule
    assert list(mine.batches(list(range(30)))) == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11],
                                                   list(range(12, 20)), list(range(20, 28)), [28, 29]]


def test_ingest_modules_import_no_torch():
    """Featurising and batching are numpy only, so ingest can run where torch is not loaded."""
    code = ("import sys; import streamlearn.batching, streamlearn.featurize, streamlearn.outputs; "
            "print(sorted(m for m in ('torch', 'river') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize("task", sorted(RECORDS))
def test_the_preparer_pickles_and_prepares_the_same_batches(task):
    learner = Learner(Config().override(*SMALL, f"learner.task={task}"))
    learner.learn_many(RECORDS[task][:10])
    clone = pickle.loads(pickle.dumps(learner.prep))
    ours, theirs = learner.prep.train(RECORDS[task][10:]), clone.train(RECORDS[task][10:])
    assert sorted(ours.feats) == sorted(theirs.feats)
    assert all(np.array_equal(ours.feats[k], theirs.feats[k]) for k in ours.feats)
    assert all(np.array_equal(ours.targets[k], theirs.targets[k]) for k in ours.targets)
    assert ours.candidates == theirs.candidates and ours.seq == theirs.seq


@pytest.mark.parametrize("task", sorted(RECORDS))
def test_every_task_learns_predicts_and_refuses_what_it_cannot_answer(task):
    learner = Learner(Config().override(*SMALL, f"learner.task={task}"))
    report = learner.learn_many(RECORDS[task])
    assert report.records == 20 and report.examples > 0 and np.isfinite(report.loss)
    query = RECORDS[task][:2]
    tops = learner.topk_many(query, k=3)
    assert len(tops) == 2 and all(1 <= len(t.tokens) <= 3 for t in tops)
    assert learner.predict_many(query) == [t.tokens[0] for t in learner.topk_many(query, k=1)]
    if learner.task.answers == "labels":
        assert all(abs(sum(p.values()) - 1) < 1e-5 for p in learner.predict_proba_many(query))
    else:
        with pytest.raises(Exception, match="predict_proba is defined for task classify"):
            learner.predict_proba_many(query)


def test_next_token_queries_that_share_a_prefix_answer_as_alone():
    """A batch of the prefixes of one record is read out of one causal sequence: the
    answers equal each prefix asked alone."""
    learner = Learner(Config().override(*SMALL, "learner.task=next-token", "model.layers=1"))
    for _ in range(3):
        learner.learn_many(RECORDS["next-token"])
    tokens = RECORDS["next-token"][3]["text"].split()
    queries = [{"tokens": tokens[:i]} for i in range(len(tokens) + 1)] + [{"tokens": ["other1"]}]
    together = learner.topk_many(queries, k=3)
    alone = [learner.topk_many([q], k=3)[0] for q in queries]
    atol = 1e-2 if learner.dev.cuda else 1e-5  # bf16 autocast on CUDA: a batch's shape moves the rounding
    for a, b in zip(together, alone):
        assert a.tokens == b.tokens and np.allclose(a.scores, b.scores, atol=atol)
    assert len(learner.prepare(queries, train=False).feats["mask"]) == 2  # two sequences cover them all


def test_next_tokens_ngram_inputs_are_the_ngrams_ending_at_each_input():
    """``model.input_ngrams=2``: each input position also reads the hashed (previous, token)
    bigram ending at it, from the same tables, and never a token it is asked for: two
    records that differ in their last token only get the same inputs."""
    learner = Learner(Config().override(*SMALL, "learner.task=next-token", "model.layers=1", "model.input_ngrams=2"))
    learner.learn_many(RECORDS["next-token"])
    batch = learner.prepare([{"text": "word1 other2 third3"}, {"text": "word1 other2 never"}])
    inputs = [[BOS_TOKEN, "word1", "other2"]] * 2
    bigrams = [[f"{a}{NGRAM_SEP}{b}" for a, b in zip(["", *t], t)] for t in inputs]
    grams = learner.featurizer.featurize(bigrams, max_len=128)
    assert sorted(batch.feats) == ["buckets", "d1", "mask", "ngram2.buckets", "ngram2.d1"]
    assert np.array_equal(batch.feats["ngram2.d1"], grams["d1"])
    assert np.array_equal(batch.feats["ngram2.buckets"], grams["buckets"])
    assert all(np.array_equal(a[0], a[1]) for a in batch.feats.values())  # "third3" / "never" is no input

    feats = to_tensors(batch.feats, learner.device)
    tokens = {k: v for k, v in feats.items() if not k.startswith("ngram")}
    pairs = {"mask": feats["mask"], "d1": feats["ngram2.d1"], "buckets": feats["ngram2.buckets"]}
    with torch.no_grad():
        x = learner.model.embedding(tokens) + learner.model.embedding(pairs)
        torch.testing.assert_close(learner.model.encode(feats, causal=True),
                                   learner.model.encoder(x, feats["mask"], causal=True))

    read, own = learner.rows_read(batch), learner.featurizer.rows_touched(batch.feats)
    report = learner.learn_batch(batch)
    for name in ("E", "P"):  # the bigrams' rows are read, and learned, beside the tokens'
        assert len(np.setdiff1d(read[name], own[name])) > 0
        np.testing.assert_array_equal(report.rows[name], read[name])

    assert [g.split(NGRAM_SEP) for g in input_ngrams([["a", "b"]], 3)[0]] == [["", "", "a"], ["", "a", "b"]]
    plain = Learner(Config().override(*SMALL, "learner.task=next-token"))
    assert sorted(plain.prepare(RECORDS["next-token"][:2]).feats) == ["buckets", "d1", "mask"]
    with pytest.raises(ConfigError, match="model.input_ngrams=2 is an input of task next-token"):
        Config().override("learner.task=mlm", "model.input_ngrams=2")
