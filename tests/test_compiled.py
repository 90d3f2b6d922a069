"""The compiled classify step (streamlearn.compiled) against torch's closed-form step:
the same updates to float rounding, the same rows reported, the same skips."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from streamlearn.compiled_loading import WhenLoaded
from streamlearn.compiled import CompiledClassifyStep, CompiledNaiveBayes, classify_step, row_groups
from streamlearn.config import Config
from streamlearn.heads import NaiveBayesHead
from streamlearn.learner import Learner
from tests.test_learner import SMALL, assert_same, batches, params, topic_stream

pytestmark = pytest.mark.usefixtures("one_torch_thread")


# The kernel runs on the CPU only: pinned there, so these tests hold on a machine with a GPU too.
CPU = (*SMALL, "learner.device=cpu")


def pair(*overrides: str) -> tuple[Learner, Learner]:
    """(compiled, torch) learners of one config."""
    fast = Learner(Config().override(*CPU, *overrides))
    slow = Learner(Config().override(*CPU, *overrides, "learner.compiled=false"))
    assert fast.runs_compiled and not slow.runs_compiled
    return fast, slow


def assert_nearly(a: torch.Tensor, b: torch.Tensor, name: str) -> None:
    """Equal to float rounding, but for a few cells of the row tables where Adagrad
    magnified it: a cell whose gradients so far summed to almost nothing (cancelling
    contributions, an Adagrad sum of 1e-15 to 1e-18) moves by about lr g / |g|, so the
    last bits of g show in the update (at most 3e-4 here, against moves of up to 0.2)."""
    close = torch.isclose(a, b, rtol=1e-4, atol=1e-6)
    assert float(close.float().mean()) > 0.999 and float((a - b).abs().max()) < 1e-3, name


def stream() -> list[dict]:
    """Three topics, weighted records (one at zero), a fourth label arriving late, an empty text."""
    records = topic_stream(64, seed=3) + [{"text": "team goal", "label": "sport", "weight": 2.5}]
    records += [{"text": "sofa lamp chair", "label": "home"}, {"text": "", "label": "food"},
                {"text": "lamp lamp goal", "label": "home", "weight": 0.0}]
    return records + topic_stream(24, seed=4) + [{"text": "chair lamp", "label": "home"}]


@pytest.mark.parametrize("overrides", [(), ("embedding.k=3",), ("learner.nb_weight=0",), ("embedding.init=paper",)])
def test_the_compiled_step_equals_torchs(overrides):
    """Stepped on the same batches, prequentially, the two give the same predictions
    and losses and change the same rows, and leave every table, optimizer state and
    count equal to float rounding (the compiled step sums in another order)."""
    fast, slow = pair(*overrides)
    for records in batches(stream(), 8):
        bf, bs = fast.prepare(records), slow.prepare(records)
        (pf, rf), (ps, rs) = fast.predict_learn_batch(bf), slow.predict_learn_batch(bs)
        np.testing.assert_allclose(pf, ps, rtol=1e-5, atol=1e-6)
        assert rf.loss == pytest.approx(rs.loss, rel=1e-5)
        assert not rf.skipped and rf.step == rs.step
        assert rf.rows.keys() == rs.rows.keys() and all(np.array_equal(rf.rows[k], rs.rows[k]) for k in rf.rows)
    a, b = params(fast), params(slow)
    assert a.keys() == b.keys()
    for name in a:
        assert_nearly(a[name], b[name], name)
    assert fast.task.count_tables().keys() == slow.task.count_tables().keys()
    for name, counts in fast.task.count_tables().items():
        assert torch.equal(counts, slow.task.count_tables()[name]), name
    assert fast.steps == slow.steps and fast.row_optim.steps == slow.row_optim.steps
    dense_a, dense_b = fast.optimizer_state()[0]["state"], slow.optimizer_state()[0]["state"]
    for i in dense_b:
        assert torch.equal(dense_a[i]["step"], dense_b[i]["step"])
        for key in ("exp_avg", "exp_avg_sq"):
            torch.testing.assert_close(dense_a[i][key], dense_b[i][key], rtol=1e-4, atol=1e-7, msg=key)
    assert fast.take_dirty().keys() == slow.take_dirty().keys()
    queries = topic_stream(16, seed=7) + [{"text": "sofa unknown words"}]  # a blank one is refused, not answered
    for a_row, b_row in zip(fast.predict_proba_many(queries), slow.predict_proba_many(queries)):  # the query forward
        assert a_row.keys() == b_row.keys()
        assert [a_row[k] for k in a_row] == pytest.approx([b_row[k] for k in a_row], rel=1e-4, abs=1e-6)
    assert len(classify_step.signatures) == 1  # the types _load compiles for: no second compile at a first step


@pytest.mark.parametrize("poison", [float("nan"), float("inf"), 1e30])
def test_a_compiled_step_that_is_not_safe_changes_nothing(poison, caplog):
    """A batch whose loss or gradient is not finite, or too large, leaves every table,
    optimizer state and count as it was, counts the skip and names the cause."""
    fast, _ = pair()
    for records in batches(topic_stream(24), 8):
        fast.learn_many(records)
    batch = fast.prepare(topic_stream(8, seed=9))
    batch.weight[:] = poison
    before, steps = params(fast), fast.steps
    state = {k: v.clone() for k, v in fast.optimizer_state()[0]["state"][0].items()}
    report = fast.learn_batch(batch)
    assert report.skipped and report.rows == {} and fast.skipped_steps == 1 and fast.steps == steps
    assert_same(before, params(fast))
    for key, value in fast.optimizer_state()[0]["state"][0].items():
        assert torch.equal(value, state[key]), key
    assert ("its loss" if poison != 1e30 else "the gradient of E") in caplog.text


def test_a_learner_runs_it_only_where_it_computes_the_step():
    """Bound for classify's default depth-0 step on the CPU; torch's step for the rest,
    a GPU's included."""
    assert Learner(Config().override(*CPU)).runs_compiled
    others = [("model.layers=1",), ("optim.sparse=lazy-adam",), ("optim.row_decay=0.9",),
              ("embedding.scheme=hashing-trick",),
              ("embedding.combine=concat",), ("learner.task=next-token",), ("learner.compiled=false",)]
    if torch.cuda.is_available():
        others.append(("learner.device=cuda",))
    for overrides in others:
        assert not Learner(Config().override(*CPU, *overrides)).runs_compiled, overrides


def test_a_gradient_hook_takes_torchs_step():
    """A learner whose gradients are exchanged (distributed) steps through ``.grad``."""
    fast, slow = pair()
    fast.gradient_hook = slow.gradient_hook = lambda _learner: None
    for records in batches(topic_stream(32), 8):
        fast.learn_many(records), slow.learn_many(records)
    assert_same(params(fast), params(slow))


@pytest.mark.parametrize("seed", range(3))
def test_row_groups_are_the_distinct_rows_and_each_ones_place(seed):
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, [5, 1_000, 2**62][seed], size=[1, 300, 5_000][seed]).astype(np.int64)
    rows, group = row_groups(ids)
    expected, inverse = np.unique(ids, return_inverse=True)
    np.testing.assert_array_equal(rows, expected)
    np.testing.assert_array_equal(group, inverse)


def test_binding_refuses_tables_it_cannot_step():
    lrn = Learner(Config().override(*CPU, "learner.compiled=false"))
    lrn.model.embedding.E.data = lrn.model.embedding.E.data.double()
    assert CompiledClassifyStep.bind(lrn, 1e15) is None


@pytest.mark.parametrize("seed", range(3))
def test_the_compiled_naive_bayes_part_is_numpys(seed):
    """Batches with repeated tokens, padding, zero and fractional weights and a label not
    counted yet: the same count cells to the bit (the adds in the same order), the same
    changed rows, and the same scores of a query and in stream order to float rounding."""
    rng = np.random.default_rng(seed)
    fast, slow = NaiveBayesHead(64 * 40, 4, 0.3), NaiveBayesHead(64 * 40, 4, 0.3)
    fast.compiled = WhenLoaded(lambda: CompiledNaiveBayes(fast))
    for _ in range(8):
        N, T = rng.integers(1, 9), rng.integers(1, 12)
        tokens = rng.integers(0, 30, size=(N, T))
        tokens[rng.random((N, T)) < 0.3] = -1
        labels = rng.integers(0, 3, size=N)
        weight = rng.choice(np.array([0.0, 1.0, 2.5, 0.1], np.float32), size=N)
        for n_labels in (3, 4):
            np.testing.assert_allclose(fast.scores(tokens, n_labels), slow.scores(tokens, n_labels), rtol=1e-5,
                                       atol=1e-5)
            np.testing.assert_allclose(fast.scores_in_order(tokens, labels, weight, n_labels),
                                       slow.scores_in_order(tokens, labels, weight, n_labels), rtol=1e-5, atol=1e-5)
        np.testing.assert_array_equal(fast.learn(tokens, labels, weight), slow.learn(tokens, labels, weight))
        np.testing.assert_array_equal(fast.flat, slow.flat)
    assert fast.flat[2 * 4] > 0


def test_kernels_that_could_not_be_built_are_a_clear_error():
    """Where the kernels cannot be built (the loading thread raised), the step that needs
    them says so and names the way back to torch's step. A fresh process whose import
    system refuses the kernels' module, as a machine without a working numba would."""
    code = """
import sys
import streamlearn.compiled_loading as c
from streamlearn.exceptions import StreamlearnError

class NoKernels:
    def find_spec(self, name, path=None, target=None):
        if name == "streamlearn.compiled":
            raise ImportError("no LLVM target for this CPU")
        return None

sys.meta_path.insert(0, NoKernels())
try:
    c.loaded()
except StreamlearnError as exc:
    print(exc)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert re.search("no LLVM target.*learner.compiled=false", out.stdout), out.stdout


def test_a_commands_loading_thread_skips_numbas_blas_probe_and_no_other_import():
    """The commands' loading thread refuses numba's probe of scipy.linalg (0.6 s of a
    worker's CPU at start, bench/startup.py) to itself alone: the kernels load and run,
    and scipy.linalg imports afterwards as ever. A fresh process: this one has numba's
    registries loaded already."""
    code = """
import sys
from pathlib import Path
import numpy as np
import streamlearn.compiled_loading as c
from streamlearn.config import Config
c.in_a_command()
c.start_loading_for(Config())
c.loaded()
assert "scipy.linalg" not in sys.modules
assert not any(type(f).__name__ == "_SkipBlasProbe" for f in sys.meta_path)
from streamlearn.compiled import row_groups
rows, group = row_groups(np.array([5, 2, 5], dtype=np.int64))
assert rows.tolist() == [2, 5] and group.tolist() == [1, 0, 1]
import scipy.linalg
print("ok")
"""
    pytest.importorskip("scipy.linalg")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


def test_a_worker_learner_runs_torchs_step_until_the_kernels_are_loaded():
    """Built inside ``learning_meanwhile`` (the worker's learner), a learner neither imports
    numba nor waits for the loading thread: its first batches take torch's step, numpy's
    Naive Bayes and Python's tokenizer, as a ``learner.compiled=false`` learner does, to
    the bit; once the thread is done, its next batch runs the kernels. A fresh process,
    whose loading thread is held at its start until the first batches are learned."""
    code = """
import sys, threading
import numpy as np
import torch
import streamlearn.compiled_loading as c
from streamlearn.config import Config
from streamlearn.learner import Learner
from tests.test_learner import SMALL, assert_same, params, topic_stream

torch.set_num_threads(1)
gate, main = threading.Event(), threading.get_ident()

class HeldLoading:  # the loading thread waits at its import of the kernels until the gate opens
    def find_spec(self, name, path=None, target=None):
        if name == "streamlearn.compiled" and threading.get_ident() != main:
            gate.wait(60)
        return None

sys.meta_path.insert(0, HeldLoading())
CPU = (*SMALL, "learner.device=cpu", "embedding.K=262144", "learner.nb_cells=262144")  # the text hasher's rule
with c.learning_meanwhile():
    fast = Learner(Config().override(*CPU))
slow = Learner(Config().override(*CPU, "learner.compiled=false"))
records = topic_stream(96, seed=3)
for learner in (fast, slow):
    learner.learn_many(records[:40])
assert not fast.runs_compiled and "numba" not in sys.modules
assert_same(params(fast), params(slow))
gate.set()
c.loaded()
for learner in (fast, slow):
    learner.learn_many(records[40:])
assert fast.runs_compiled and fast.task.prep.text_hasher() is not None and fast.task.nb.compiled() is not None
from tests.test_compiled import assert_nearly
a, b = params(fast), params(slow)
for name in a:
    assert_nearly(a[name], b[name], name)
for name, counts in fast.task.count_tables().items():
    assert torch.equal(counts, slow.task.count_tables()[name]), name
print("ok")
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         cwd=Path(__file__).resolve().parents[1])
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


EXITS_AT_ONCE = """
import atexit, threading
# registered first, so it runs last at exit (atexit is last in, first out): what is alive then
atexit.register(lambda: print("alive at exit:", sorted(t.name for t in threading.enumerate())))
from streamlearn.config import Config
from streamlearn.learner import Learner
Learner(Config().override("embedding.K=1000", "embedding.B=100", "learner.nb_cells=4096", "model.max_labels=8"))
"""


def test_a_program_that_builds_a_learner_and_exits_waits_for_the_kernels_loading_thread():
    """Was: the daemon thread still in numba's compiler when the interpreter shut down,
    which sometimes aborted the process ("terminate called without an active exception",
    SIGABRT: a CI run of tests/test_device.py's probe)."""
    out = subprocess.run([sys.executable, "-c", EXITS_AT_ONCE], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "alive at exit: ['MainThread']" in out.stdout, out.stdout
