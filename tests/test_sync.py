"""streamlearn.sync, the replica operations, on in-process learners without a process
group: the transport's part (a sum over the ranks) is done by hand here, so each
operation is checked against arithmetic a reader can follow. The same operations over
real gloo collectives are tests/test_distributed.py's."""
import numpy as np
import pytest
import torch

from streamlearn.config import Config
from streamlearn.exceptions import LabelCapacityError
from streamlearn.learner import Learner

SMALL = ("model.layers=0", "embedding.K=2000", "embedding.B=256", "embedding.d=16", "model.d_model=16",
         "model.max_labels=8", "learner.nb_weight=0.5", "learner.nb_cells=65536")
WARM = [{"text": "goal match", "label": "sport"}, {"text": "pasta soup", "label": "food"}]

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def learner(*overrides: str) -> Learner:
    return Learner(Config().override(*SMALL, *overrides))


def replicas(n: int = 2, *overrides: str) -> list[Learner]:
    """``n`` equal replicas that know the same labels in the same order (a group's start)."""
    out = [learner(*overrides) for _ in range(n)]
    for lrn in out:
        lrn.learn_many(WARM)
    return out


def stream(rank: int, n: int = 32) -> list[dict]:
    """Records only rank ``rank`` sees: its own tokens (disjoint from other ranks')."""
    words = [f"r{rank}w{i}" for i in range(7)]
    return [{"text": f"{words[i % 7]} {words[(3 * i + 1) % 7]}", "label": ("sport", "food")[i % 2]}
            for i in range(n)]


def clone(tensors: dict) -> dict:
    return {n: t.detach().clone() for n, t in tensors.items()}


# ---------------------------------------------------------------------------- averaging

def test_averaging_two_replicas_gives_the_mean_of_their_touched_rows_and_dense_weights():
    a, b = replicas()
    for lrn, rank in ((a, 0), (b, 1)):
        lrn.learn_many(stream(rank))
    pre = [clone(r.replica.tables()) for r in (a, b)]
    dense_pre = [clone(r.model.dense_parameters()) for r in (a, b)]
    touched = [r.replica.take_touched() for r in (a, b)]
    assert list(touched[0]) == sorted(a.replica.tables()) and {"E", "E.sum", "P", "nb.counts"} <= set(touched[0])
    assert a.take_dirty() == {}  # taken: the sync owns them now
    union = {n: np.union1d(touched[0][n], touched[1][n]) for n in touched[0]}
    union = {n: ids for n, ids in union.items() if len(ids)}
    only_one = sum(len(np.setxor1d(touched[0][n], touched[1][n])) for n in union)
    assert only_one > 0, "the replicas touched the same rows: the test proves nothing"

    # The transport's part: one buffer per replica, summed over the ranks, over the world size.
    D = a.replica.dense_size
    buffers = [torch.cat([r.replica.dense_values(), r.replica.row_values(union)]) for r in (a, b)]
    assert buffers[0].numel() == D + sum(len(ids) * pre[0][n].shape[1] for n, ids in union.items())
    mean = (buffers[0] + buffers[1]) / 2
    for r in (a, b):
        r.replica.set_dense_values(mean[:D])
        r.replica.set_row_values(mean[D:], union)

    for name, table in a.replica.tables().items():
        expected = pre[0][name].clone()
        ids = torch.from_numpy(union.get(name, np.zeros(0, np.int64)))
        expected[ids] = (pre[0][name][ids] + pre[1][name][ids]) / 2
        untouched = torch.ones(len(expected), dtype=torch.bool)
        untouched[ids] = False
        assert torch.equal(pre[0][name][untouched], pre[1][name][untouched]), name  # equal already
        assert torch.equal(table.detach(), expected), name
        assert torch.equal(table.detach(), b.replica.tables()[name].detach()), name
    for name, p in a.model.dense_parameters().items():
        assert torch.equal(p.detach(), (dense_pre[0][name] + dense_pre[1][name]) / 2), name
    assert not torch.equal(dense_pre[0]["head.weight"], dense_pre[1]["head.weight"])
    assert a.replica.digest() == b.replica.digest()
    dirty = a.take_dirty()  # every averaged row is stored by the next checkpoint
    assert {n: ids.tolist() for n, ids in dirty.items()} == {n: ids.tolist() for n, ids in union.items()}


def test_digest_tells_replicas_apart_and_names_every_table():
    a, b = replicas()
    assert a.replica.digest() == b.replica.digest()
    assert list(a.replica.tables()) == ["E", "E.sum", "P", "P.sum", "nb.counts"]
    b.learn_many(stream(1, 4))
    assert a.replica.digest() != b.replica.digest()


# ---------------------------------------------------------------------------- labels

def _head(lrn: Learner) -> dict[str, torch.Tensor]:
    """The label parameters' rows and their AdamW moments, by name."""
    out = {}
    for name, p in (("weight", lrn.model.head.weight), ("bias", lrn.model.head.bias)):
        out[name] = p.detach().clone()
        for moment, t in lrn.dense_optim.state[p].items():
            if t.shape == p.shape:
                out[f"{name}.{moment}"] = t.clone()
    return out


def test_a_label_permutation_moves_rows_and_moments_and_starts_a_new_label():
    lrn, = replicas(1)
    lrn.learn_many(stream(0, 8))
    before = _head(lrn)
    assert set(before) == {"weight", "bias", "weight.exp_avg", "weight.exp_avg_sq", "bias.exp_avg",
                           "bias.exp_avg_sq"}
    lrn.replica.permute_labels(["food", "news", "sport"])  # sport was 0, food 1; news is new
    assert lrn.labels == ["food", "news", "sport"]
    fresh = learner()
    fresh.prepare([{"text": "x", "label": "news"}])
    fresh.start_label_rows([0])
    after = _head(lrn)
    for name, t in after.items():
        assert torch.equal(t[0], before[name][1]) and torch.equal(t[2], before[name][0]), name
        assert not t[3:].any(), name
        if name != "weight":
            assert not t[1].any(), name  # a new label has no moments yet, its bias starts at 0
    assert torch.equal(after["weight"][1], fresh.model.head.weight[0].detach())
    assert not torch.equal(before["weight"][0], before["weight"][1])  # the move is visible


def test_merged_labels_are_rank_order_and_the_same_on_every_replica():
    a, b = learner(), learner()
    a.learn_many([{"text": "goal", "label": "sport"}, {"text": "soup", "label": "food"}])
    b.learn_many([{"text": "soup", "label": "food"}, {"text": "chip", "label": "tech"}])
    rows = {"sport": a.model.head.weight[0].detach().clone(), "food": b.model.head.weight[0].detach().clone()}
    gathered = [a.replica.labels, b.replica.labels]
    for r in (a, b):
        r.replica.merge_labels(gathered)
    assert a.labels == b.labels == ["sport", "food", "tech"]
    assert torch.equal(b.model.head.weight[1].detach(), rows["food"])  # b's row 0 moved to id 1
    assert torch.equal(a.model.head.weight[0].detach(), rows["sport"])  # a's first ids did not move
    # tech: a starts it as b did when its batch brought it (b's then took a step)
    fresh = learner()
    fresh.prepare([{"text": "x", "label": "tech"}])
    fresh.start_label_rows([0])
    assert torch.equal(a.model.head.weight[2].detach(), fresh.model.head.weight[0].detach())


def test_a_merge_over_capacity_fails_and_leaves_the_replica_unchanged():
    lrn = learner("model.max_labels=2")
    lrn.learn_many(WARM)
    before, digest = list(lrn.labels), lrn.replica.digest()
    with pytest.raises(LabelCapacityError):
        lrn.replica.merge_labels([lrn.replica.labels, ["tech"]])
    assert lrn.labels == before and lrn.replica.digest() == digest


def test_replacing_labels_moves_no_row():
    lrn, = replicas(1)
    weight = lrn.model.head.weight.detach().clone()
    lrn.replica.replace_labels(["sport", "food", "tech"])  # a group's table: ids already its order
    assert lrn.labels == ["sport", "food", "tech"]
    assert torch.equal(lrn.model.head.weight.detach(), weight)


def test_a_task_without_labels_has_no_label_parameters():
    # without its count part (a scale-out group refuses token tasks, so theirs never merge)
    lrn = learner("learner.task=mlm", "model.output=auto", "model.counts=none")
    assert lrn.replica.labels is None and lrn.task.label_parameters(lrn.model) == ()
    assert lrn.replica.counts() == {} and lrn.replica.count_delta({}).numel() == 0


# ---------------------------------------------------------------------------- gradients

def test_mean_gradients_keep_two_replicas_bit_equal():
    """The all-reduce's step, by hand: each replica's local gradients (taken in the
    learner's gradient hook), their mean put back before the optimizers step."""
    a, b, probe = replicas(3, "learner.nb_weight=0")  # counts would differ by design: off
    labels = len(a.labels)
    grabbed = {}

    def grab(rank):
        def hook(lrn):
            grabbed[rank] = (*lrn.replica.dense_gradients(labels), lrn.replica.row_gradients())
        return hook

    probe.gradient_hook = grab(1)  # rank 1's local gradients, before rank 0 steps
    probe.learn_many(stream(1))
    seen = {}

    def exchange(rank):
        def hook(lrn):
            if rank == 0:
                grab(0)(lrn)
            (has0, dense0, rows0), (has1, dense1, rows1) = grabbed[0], grabbed[1]
            lrn.replica.set_dense_gradients((has0 + has1).tolist(), (dense0 + dense1) / 2, labels)
            lrn.replica.set_row_gradients({n: (torch.cat([rows0[n][0], rows1[n][0]]),
                                               torch.cat([rows0[n][1], rows1[n][1]]) / 2) for n in rows0})
            seen[rank] = ({n: p.grad.clone() for n, p in lrn.model.dense_parameters().items() if p.grad is not None},
                          {n: p.grad.to_dense().clone() for n, p in lrn.row_optim.tables.items()})
        return hook

    a.gradient_hook, b.gradient_hook = exchange(0), exchange(1)
    a.learn_many(stream(0))
    b.learn_many(stream(1))
    assert a.replica.digest() == b.replica.digest() != probe.replica.digest()
    assert a.steps == b.steps

    has, dense, rows = grabbed[0]
    names = list(a.model.dense_parameters())
    assert [n for n, h in zip(names, has.tolist()) if h] == ["head.weight", "head.bias"] == sorted(seen[0][0])[::-1]
    cut = (a.cfg.model.max_labels - labels) * (a.cfg.model.d_model + 1)  # label rows past the labels stay
    assert dense.numel() == a.replica.dense_size - cut
    assert sorted(rows) == a.replica.gradient_tables == ["E", "P"]
    for name, grad in seen[0][1].items():  # rows: the mean of both ranks' sparse gradients
        ids0, v0 = grabbed[0][2][name]
        ids1, v1 = grabbed[1][2][name]
        local = torch.zeros_like(grad)
        local.index_add_(0, ids0.to(grad.device), v0.to(grad.device)).index_add_(0, ids1.to(grad.device),
                                                                                 v1.to(grad.device))
        torch.testing.assert_close(grad, local / 2)
        assert len(np.setxor1d(ids0.cpu().numpy(), ids1.cpu().numpy())), "both ranks touched the same rows"
    for name, grad in seen[0][0].items():  # dense: the mean of both ranks' gradients, the same on both
        assert torch.equal(grad, seen[1][0][name]), name
    assert not seen[0][0]["head.weight"][labels:].any()  # label rows past the labels: no gradient


# ---------------------------------------------------------------------------- counts

def test_count_deltas_of_two_replicas_add_up_to_one_learner_that_counted_both():
    a, b, both = replicas(3)
    base = a.replica.counts()
    assert set(base) == {"nb.counts"} and torch.equal(base["nb.counts"], b.replica.counts()["nb.counts"])
    a.learn_many(stream(0))
    b.learn_many(stream(1))
    both.learn_many(stream(0))
    both.learn_many(stream(1))
    a.take_dirty()
    total = a.replica.count_delta(base) + b.replica.count_delta(base)  # the all-reduce's sum
    assert total.numel() == base["nb.counts"].numel() and total.any()
    for r in (a, b):
        r.replica.add_counts(base, total)
    expected = both.replica.counts()["nb.counts"]  # disjoint tokens: no (token, label) cell counted twice
    assert torch.equal(a.replica.counts()["nb.counts"], expected)
    assert torch.equal(b.replica.counts()["nb.counts"], expected)
    max_labels = a.cfg.model.max_labels
    assert float(expected.reshape(-1)[:max_labels].sum()) == len(WARM) + 2 * len(stream(0))  # records per label
    changed = (expected != base["nb.counts"]).any(1).nonzero().flatten()
    assert a.take_dirty()["nb.counts"].tolist() == changed.tolist()  # the next checkpoint stores them
    assert not a.replica.count_delta(a.replica.counts()).any()
