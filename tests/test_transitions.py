"""next-item's transition-count part: Witten-Bell over the counts equals a dict count while contexts keep
fewer than S successors, Space-Saving keeps the heavy successors past S, a full table
halves in place, and in the learner: restart from incremental checkpoints, snapshots,
the counts' weight learning, the config's rules and the group workers' refusal."""
from collections import Counter, defaultdict

import numpy as np
import pytest

from streamlearn.config import Config
from streamlearn.counts.transitions import ORDERS, Transitions, context_keys
from streamlearn.exceptions import ConfigError

SEED = 7


def _stream(n: int, items: int, seed: int) -> list[tuple[str, str]]:
    """(key, item) events: a few keys walking a sparse random successor graph."""
    rng = np.random.default_rng(seed)
    succ = rng.integers(0, items, (items, 3))
    last: dict[str, int] = {}
    out = []
    for _ in range(n):
        key = f"u{int(rng.integers(0, 6))}"
        prev = last.get(key)
        item = int(rng.integers(0, items)) if prev is None or rng.random() < 0.2 else int(succ[prev, rng.integers(0, 3)])
        last[key] = item
        out.append((key, f"i{item}"))
    return out


def _code(items, m=2, size=64):
    from streamlearn.hashing import multi_hash

    return multi_hash(list(items), n=m, size=size, seed=SEED, purpose="out")


def _feed(t: Transitions, events, batch: int) -> dict:
    """Learn ``events`` in batches as the preparer does; the reference dict counts."""
    hist: dict[str, list[str]] = defaultdict(list)
    ref: dict[int, Counter] = defaultdict(Counter)
    for s in range(0, len(events), batch):
        chunk = events[s:s + batch]
        histories, targets = [], []
        for key, item in chunk:
            if hist[key]:
                histories.append(tuple(hist[key]))
                targets.append(item)
                for k in context_keys([hist[key]], SEED)[0]:
                    if k:
                        ref[int(k)][tuple(_code([item])[0])] += 1
            hist[key].append(item)
        ctx = context_keys(histories, SEED)
        codes = _code(targets) if targets else np.empty((0, 2), np.int64)
        t.learn(ctx, codes, _code([i for _, i in chunk]))
    return ref


def _dense(t: Transitions, ctx: np.ndarray) -> np.ndarray:
    """Q_j(b | c) (n, m, size) from the shared and the sparse terms."""
    pop, base, at, value, evidence = t.components(ctx)
    out = base[:, None, None].astype(np.float64) * pop[None]
    np.add.at(out.reshape(-1), at, value)
    return out


def _wb(ref1: Counter, ref2: Counter, pop: np.ndarray, j: int) -> np.ndarray:
    """Witten-Bell backoff over buckets of slot j from dict counts: orders 1 and 2."""
    q = pop[j].astype(np.float64)
    for ref in (ref1, ref2):
        n, types = sum(ref.values()), len(ref)
        if not n:
            continue
        own = np.zeros_like(q)
        for code, c in ref.items():
            own[code[j]] += c
        q = (own + types * q) / (n + types)
    return q


@pytest.mark.parametrize("batch", [1, 13])
def test_counts_equal_a_dict_witten_bell_whatever_the_batch(batch):
    events = _stream(1500, 40, 0)
    t = Transitions(2, 64, 4096, successors=16)
    ref = _feed(t, events, batch)
    histories = [(f"i{a}",) for a in range(40)] + [(f"i{a}", f"i{b}") for a in range(0, 40, 3) for b in range(40)]
    ctx = context_keys(histories, SEED)
    q = _dense(t, ctx)  # (n, m, size)
    pop = t.components(ctx[:1])[0]
    for row, keys in enumerate(ctx.tolist()):
        for j in range(2):
            np.testing.assert_allclose(q[row, j], _wb(ref.get(keys[0], Counter()), ref.get(keys[1], Counter()), pop, j),
                                       rtol=1e-5, atol=1e-8)
    np.testing.assert_allclose(q.sum(-1), 1.0, rtol=1e-5)  # each slot a distribution
    evidence = t.components(ctx)[-1]
    for row, keys in enumerate(ctx.tolist()):
        for o, k in enumerate(keys):
            c = ref.get(k, Counter())
            assert evidence[row, 2 * o] == pytest.approx(np.log1p(sum(c.values())), rel=1e-6)
            assert evidence[row, 2 * o + 1] == pytest.approx(np.log1p(len(c)), rel=1e-6)
    every = Counter(_code([i for _, i in events])[:, 0].tolist())
    np.testing.assert_allclose(pop[0], [(every[b] + 0.5) / (len(events) + 32) for b in range(64)], rtol=1e-5)


def _dense_of(components) -> np.ndarray:
    pop, base, at, value, _ = components
    out = base[:, None, None].astype(np.float64) * pop[None]
    np.add.at(out.reshape(-1), at, value)
    return out


@pytest.mark.parametrize("seed", [0, 1])
def test_a_batch_in_order_scores_each_example_as_if_the_ones_before_were_counted(seed):
    """A training batch predicted before its step: example i's Q and evidence equal the
    tables' after counting the batch's events before it, one record at a time (transitions
    and popularity), including contexts and items the batch brings."""
    import copy

    events = _stream(900, 30, seed)
    t = Transitions(2, 64, 4096, successors=32)
    _feed(t, events[:600], 7)
    hist: dict[str, list[str]] = defaultdict(list)
    for key, item in events[:600]:
        hist[key].append(item)
    chunk = events[600:640] + [("new", "brand-new"), ("u0", "brand-new"), ("new", "i1")]
    histories, targets, places = [], [], []
    for place, (key, item) in enumerate(chunk):
        if hist[key]:
            histories.append(tuple(hist[key]))
            targets.append(item)
            places.append(place)
        hist[key].append(item)
    ctx, codes, every = context_keys(histories, SEED), _code(targets), _code([i for _, i in chunk])
    before = np.array(places)
    got = t.components(ctx, (codes, every, before))
    q = _dense_of(got)
    np.testing.assert_allclose(q.sum(-1), 1.0, rtol=1e-5)
    for i in range(len(targets)):
        ref = copy.deepcopy(t)
        ref.learn(ctx[:i], codes[:i], every[:before[i]])
        want = ref.components(ctx[i:i + 1])
        np.testing.assert_allclose(q[i], _dense_of(want)[0], rtol=1e-5, atol=1e-9)
        np.testing.assert_allclose(got[-1][i], want[-1][0], rtol=1e-6)
    plain = _dense_of(t.components(ctx))
    assert not np.allclose(plain[-1], q[-1])  # the batch's own transitions moved the last one


def test_space_saving_keeps_the_heavy_successors_exact():
    """One context, 40 successors, 4 of them heavy, S = 8: the heavy ones keep their
    exact counts (Space-Saving: an item counted more than N / S is never evicted)."""
    rng = np.random.default_rng(3)
    t = Transitions(2, 1024, 256, successors=8)
    heavy = [f"h{i}" for i in range(4)]
    light = [f"l{i}" for i in range(36)]
    targets = heavy * 30 + light
    order = rng.permutation(len(targets))
    targets = [targets[i] for i in order]
    ctx = context_keys([("a",)] * len(targets), SEED)
    for s in range(0, len(targets), 7):
        t.learn(ctx[s:s + 7], _code(targets[s:s + 7], size=1024), _code(targets[s:s + 7], size=1024))
    pop, base, at, value, evidence = t.components(ctx[:1])
    slot0 = at < 1024
    held = dict(zip(at[slot0].tolist(), value[slot0].tolist()))
    n, types = len(targets), 40
    for h, code in zip(heavy, _code(heavy, size=1024)[:, 0]):
        assert held[code] >= 30 / (n + types) * 0.99, h  # at least its count
    assert len(held) <= 8 and evidence[0, 1] == pytest.approx(np.log1p(types))


def test_a_full_table_halves_in_place_and_stays_bounded():
    t = Transitions(2, 64, 256, successors=4)
    buf, succ = t.ctx.buf, t.succ
    halved = []
    for s in range(0, 3000, 50):
        events = _stream(50, 500, s)
        before = t.ctx.used
        _feed(t, events, 50)
        assert t.ctx.used <= 0.5 * t.ctx.slots
        halved.append(t.ctx.used < before)
    assert any(halved) and t.ctx.buf is buf and t.succ is succ  # rewritten in place
    keys = t.ctx.keys[t.ctx.keys != 0]
    q = _dense(t, np.stack([keys, keys], 1))
    np.testing.assert_allclose(q.sum(-1), 1.0, rtol=1e-5)  # still distributions


def test_restored_tables_are_the_same_count_part():
    t = Transitions(2, 64, 1024, successors=8)
    _feed(t, _stream(400, 30, 1), 9)
    back = Transitions(2, 64, 1024, successors=8)
    for name, tab in back.tables().items():
        tab.copy_(t.tables()[name])
    ctx = context_keys([("i1",), ("i2", "i3"), ()], SEED)
    for a, b in zip(t.components(ctx), back.components(ctx)):
        np.testing.assert_array_equal(a, b)


# ---------------------------------------------------------------------------- in the learner

SMALL = ("embedding.K=2000", "embedding.B=256", "embedding.d=16", "model.d_model=16", "model.heads=2",
         "model.ffn=32", "model.out_B=256", "model.count_slots=1024", "model.successors=8",
         "learner.batch_size=16", "store.shards=2")


def _learner(*extra):
    from streamlearn.learner import Learner

    return Learner(Config().override("learner.task=next-item", *SMALL, *extra))


def _records(n, seed):
    return [{"key": k, "item": i} for k, i in _stream(n, 30, seed)]


QUERIES = [{"key": "u1"}, {"key": "nobody"}, {"tokens": ["i1", "i2"]}, {"tokens": ["i3"]}]


def _commit(store, learner):
    from streamlearn.checkpoint import write
    from streamlearn.state import Checkpoint

    specs, rows, blobs, kv = write(learner)
    store.declare_tables(specs)
    store.commit(Checkpoint(step=learner.steps, rows=rows, blobs=blobs, kv=kv, config=learner.cfg.to_dict()))


def _same(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert x.tokens == y.tokens
        np.testing.assert_allclose(x.scores, y.scores, rtol=0, atol=1e-5)


def test_the_task_default_is_the_transition_part():
    cfg = Config().override("learner.task=next-item")
    assert cfg.model.counts == "transitions" and cfg.model.count_slots == 1 << 18
    learner = _learner()
    assert set(learner.task.count_tables()) == {"ni.ctx", "ni.succ", "ni.pop", "ni.stats"}
    assert Config().override("learner.task=next-item", "model.counts=none").model.counts == "none"


def test_a_training_batch_is_predicted_with_its_earlier_transitions_counted():
    """The learner's outputs for a training batch (a prequential replay's predictions)
    read the count part in order: a transition shown earlier in the batch lifts its item
    for a later example with the same last item; the step's loss and a query read the
    tables as they are."""
    learner = _learner()
    learner.learn_many(_records(400, 0))
    batch = learner.prepare([{"key": "a", "item": "i1"}, {"key": "b", "item": "i1"},
                             {"key": "a", "item": "zz"}, {"key": "b", "item": "zz"}], train=True)
    assert batch.examples == 2 and batch.example_records.tolist() == [2, 3]
    task, code = learner.task, learner.task.code
    got = learner.outputs(batch).numpy()  # (2, m, size) log P
    ctx = batch.counts["ctx"]
    stored = _dense_of(task.counter.components(ctx))
    in_order = _dense_of(task.counter.components(ctx, (batch.targets["hashes"], batch.counts["every"],
                                                       batch.example_records)))
    zz = code.ids(["zz"])[0]
    assert (in_order[1, range(code.m), zz] > 10 * stored[1, range(code.m), zz]).all()  # a's i1 -> zz counted
    query = learner.prepare([{"tokens": ["i1"], "key": "b"}], train=False)
    asked = learner.outputs(query).numpy()[0]
    assert (got[1, range(code.m), zz] > asked[range(code.m), zz] + 1).all()


def test_a_training_batch_past_the_in_order_size_reads_the_tables(monkeypatch):
    """Reading a batch in order costs an entry per pair of its records: a batch of more
    than IN_ORDER_RECORDS reads the tables and the index as they are."""
    from streamlearn.tasks import next_item

    learner = _learner()
    learner.learn_many(_records(400, 0))
    monkeypatch.setattr(next_item, "IN_ORDER_RECORDS", 3)
    batch = learner.prepare([{"key": "a", "item": "i1"}, {"key": "b", "item": "i1"},
                             {"key": "a", "item": "zz"}, {"key": "b", "item": "zz"}], train=True)
    got = learner.outputs(batch).numpy()
    asked = learner.outputs(learner.prepare([{"tokens": ["i1"], "key": "b"}], train=False)).numpy()[0]
    np.testing.assert_allclose(got[1], asked, rtol=1e-5, atol=1e-5)
    assert learner.task.fresh(batch) is None


def test_the_part_round_trips_through_incremental_checkpoints_and_snapshots(tmp_path):
    """Dirty rows only, a restore, a snapshot, and training on: the restored learner and
    the snapshot answer as the live one, and the restored one keeps learning alike."""
    from streamlearn.checkpoint import read_full
    from streamlearn.snapshot import Snapshot
    from streamlearn.state import open_store

    live = _learner()
    with open_store(tmp_path / "state", live.cfg.store) as store:
        for i in range(3):
            for j in range(2):
                live.learn_many(_records(40, 10 * i + j))
            _commit(store, live)
        back = read_full(store)
        with Snapshot(store) as snap:
            _same(snap.topk(QUERIES, k=5).values, live.topk_many(QUERIES, k=5))
    assert live.task.counter.ctx.used > 0
    for name, t in live.task.count_tables().items():
        assert back.task.count_tables()[name].numpy().tobytes() == t.numpy().tobytes(), name
    _same(live.topk_many(QUERIES, k=5), back.topk_many(QUERIES, k=5))
    for s in range(3):
        live.learn_many(_records(40, 100 + s))
        back.learn_many(_records(40, 100 + s))
    _same(live.topk_many(QUERIES, k=5), back.topk_many(QUERIES, k=5))
    assert live.model.head.trust.weight.abs().sum() > 0  # the counts' weight learns (it starts at W = 0)


def test_rows_dirtied_per_step_scale_with_the_batch_not_the_tables():
    learner = _learner("model.count_slots=65536")
    for s in range(10):
        report = learner.learn_many(_records(16, s))
        changed = {name: len(ids) for name, ids in report.rows.items()}
        assert changed["ni.pop"] == learner.cfg.model.out_m and changed["ni.stats"] == 1  # a row per slot
        assert 0 < changed["ni.succ"] <= ORDERS * 16 and changed["ni.ctx"] <= 2 * ORDERS * 16 + 1


def test_the_counts_win_a_world_the_network_alone_cannot_memorise():
    """A first-order world over 300 items, 3 successors each, 3,000 events: the counts
    learn each transition from a few sightings; the network alone does not."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
    import synthetic_items

    events = synthetic_items.markov_world(300, events=3000, n_users=100, successors=3).events

    def recall(*extra):
        learner = _learner("model.count_slots=4096", "learner.batch_size=32", *extra)
        hits = n = 0
        for s in range(0, len(events), 32):
            chunk = events[s:s + 32]
            if s >= 1500:
                for e, top in zip(chunk, learner.topk_many([{"key": e["key"]} for e in chunk], k=10)):
                    hits += e["item"] in top.tokens
                    n += 1
            learner.learn_many(chunk)
        return hits / n

    with_counts, without = recall(), recall("model.counts=none")
    assert with_counts > without + 0.1, (with_counts, without)


@pytest.mark.parametrize("bad", [("model.counts=transitions",),  # classify
                                 ("learner.task=next-token", "model.counts=transitions"),
                                 ("learner.task=next-item", "model.output=sampled"),  # the task's default part
                                 ("learner.task=next-item", "embedding.scheme=tfree")])
def test_the_transition_part_outside_next_items_hashed_head_is_refused(bad):
    with pytest.raises(ConfigError, match="model.counts='transitions' is a count part of task next-item"):
        Config().override(*bad)
    with pytest.raises(ConfigError, match="model.successors"):
        Config().override("learner.task=next-item", "model.successors=0")


def test_group_workers_refuse_next_item(tmp_path):
    """The part's successor rows (Space-Saving) are not additive, nor are the per-key
    histories: a group of workers refuses the task before it joins or opens the state."""
    from streamlearn.consumers.scaleout import GroupWorker
    from streamlearn.consumers.worker import RunOptions
    from streamlearn.broker import free_port
    from streamlearn.consumers.distributed import DistSettings

    settings = DistSettings(0, 2, f"tcp://127.0.0.1:{free_port()}", timeout_s=1.0)
    with pytest.raises(ConfigError, match="supports learner.task=classify"):
        GroupWorker(Config().override("learner.task=next-item", *SMALL), RunOptions("topic", str(tmp_path / "s")),
                    settings)
    assert not (tmp_path / "s").exists()


def _counts_weight(head):
    """The parameter through which a transition head weighs the counts."""
    return head.trust.weight if hasattr(head, "trust") else head.gate.weight


@pytest.mark.parametrize("join", ["product", "mixture"])
def test_the_loss_at_the_answers_equals_the_loss_of_the_whole_mixture(join):
    """A transition head's fit_loss reads log P at the answers' buckets only; it must be
    the hashed loss of forward's log P over every bucket, value and gradient."""
    import torch

    learner = _learner(f"model.count_join={join}")
    for s in range(3):
        learner.learn_many(_records(40, s))
    batch = learner.prepare(_records(40, 50))
    task, model, dev = learner.task, learner.model, learner.dev
    states = task.readout(model, batch, dev.tensors(batch.feats), dev)
    experts = task.experts(batch, dev)
    targets, weight = dev.tensors(batch.targets), dev.tensor(batch.weight)
    fast = model.head.fit_loss(states, targets, weight, None, experts)
    (g_fast,) = torch.autograd.grad(fast, _counts_weight(model.head), retain_graph=True)
    whole = model.head.loss(model.head(states, None, experts), targets, weight)
    (g_whole,) = torch.autograd.grad(whole, _counts_weight(model.head))
    assert float(fast.detach()) == pytest.approx(float(whole.detach()), rel=1e-5)
    torch.testing.assert_close(g_fast, g_whole, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("join", ["product", "mixture"])
def test_answering_in_place_gives_the_mixture_of_the_graph_path(join):
    """Without autograd a transition head builds log P in the logits' buffer; it must be
    the same normalised log P as the path autograd runs, every bucket."""
    import torch

    learner = _learner(f"model.count_join={join}")
    for s in range(3):
        learner.learn_many(_records(40, s))
    batch = learner.prepare(QUERIES, train=False)
    task, model, dev = learner.task, learner.model, learner.dev
    with torch.no_grad():
        fast = task.logits(model, batch, dev)
    with torch.enable_grad():
        graph = task.logits(model, batch, dev).detach()
    assert fast.shape == graph.shape == (len(QUERIES), learner.cfg.model.out_m, learner.cfg.model.out_B)
    torch.testing.assert_close(fast, graph, rtol=0, atol=1e-5)
    torch.testing.assert_close(fast.exp().sum(-1), torch.ones(fast.shape[:2], device=fast.device), rtol=0,
                               atol=1e-5)  # normalised


def test_the_counts_join_the_logits_as_their_whole_log_probability():
    """TransitionHead's sparse prior (log pop shared, a lift where successors are held, log
    base dropped) must give what the dense product gives: log_softmax(logits + lam log Q)
    with Q built over every bucket, value and the counts' weight's gradient."""
    import torch
    import torch.nn.functional as F

    learner = _learner()
    for s in range(3):
        learner.learn_many(_records(40, s))
    batch = learner.prepare(_records(40, 50))
    task, model, dev = learner.task, learner.model, learner.dev
    states = task.readout(model, batch, dev.tensors(batch.feats), dev).detach()
    pop, base, at, value, evidence = experts = task.experts(batch, dev)
    assert len(torch.unique(at)) < len(at)  # two successors share a bucket somewhere: the sums matter
    head = model.head
    q = torch.outer(base, pop.reshape(-1)).view(-1).index_add(0, at, value).view(len(base), *pop.shape)
    lam = F.softplus(head.trust(evidence.float()))[:, :, None]
    dense = F.log_softmax(super(type(head), head).forward(states).float() + lam * q.log(), -1)
    sparse = head(states, None, experts)
    torch.testing.assert_close(sparse, dense, rtol=0, atol=1e-4)
    targets, weight = dev.tensors(batch.targets), dev.tensor(batch.weight)
    (g_dense,) = torch.autograd.grad(head.loss(dense, targets, weight), head.trust.bias)
    (g_fit,) = torch.autograd.grad(head.fit_loss(states, targets, weight, None, experts), head.trust.bias)
    torch.testing.assert_close(g_fit, g_dense, rtol=1e-3, atol=1e-6)


def test_a_state_stored_before_the_product_keeps_its_mixture(tmp_path, store_as_before):
    """A next-item state written before ``model.count_join`` existed has a mixture head
    (its gate among the dense weights): it restores as one and answers as it did, and a
    restart at today's default is refused, naming the key."""
    from streamlearn import checkpoint
    from streamlearn.exceptions import CheckpointMismatchError
    from streamlearn.state import open_store
    from streamlearn.tasks.next_item import MixtureHead, TransitionHead

    live = _learner("model.count_join=mixture")
    for s in range(3):
        live.learn_many(_records(40, s))
    store_as_before(live, tmp_path, "model.count_join")
    with open_store(tmp_path, readonly=True) as store:
        assert checkpoint.stored_config(store).model.count_join == "mixture"
        back = checkpoint.read_full(store)
        assert type(back.model.head) is MixtureHead
        _same(live.topk_many(QUERIES, k=5), back.topk_many(QUERIES, k=5))
        with pytest.raises(CheckpointMismatchError, match=r"model.count_join.*--set model.count_join=mixture"):
            checkpoint.read_full(store, _learner().cfg)
    assert type(_learner().model.head) is TransitionHead
