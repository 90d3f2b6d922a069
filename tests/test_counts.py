"""The hashed KN trigram count part (streamlearn.counts) against exact dictionary
counting and a hand-computed example; its tables as row tables (rows touched, restore)."""
from collections import defaultdict

import numpy as np
import pytest
import torch

from streamlearn.counts import ROW, CountTable, KneserNey3, KneserNey4
from streamlearn.counts.table import TableFullError

BOS = -1


class DictKN:
    """Interpolated Kneser-Ney trigram on dictionaries, one token at a time (the reference);
    ``order=4`` puts a 4-gram order of raw counts on top (KneserNey4's form)."""

    def __init__(self, order=3):
        self.order = order
        self.c = {k: defaultdict(dict) for k in range(1, order + 1)}
        self.tot = {k: defaultdict(int) for k in range(1, order + 1)}
        self.n = {k: [0, 0] for k in range(1, order + 1)}  # counts-of-counts n1, n2

    def _count(self, k, ctx, w):
        old = self.c[k][ctx].get(w, 0)
        self.c[k][ctx][w] = old + 1
        self.tot[k][ctx] += 1
        self.n[k][0] += (old == 0) - (old == 1)
        self.n[k][1] += (old == 1) - (old == 2)
        return old

    def learn(self, rec):
        r = [BOS] * (self.order - 1) + list(rec)
        for i in range(self.order - 1, len(r)):
            if self.order == 4:
                self._count(4, tuple(r[i - 3:i]), r[i])  # raw counts, on top of the trigram model
            for k in (3, 2, 1):
                if self._count(k, tuple(r[i - k + 1:i]), r[i]):
                    break  # lower orders count continuations: only a new type reaches them

    def D(self, k):
        n1, n2 = self.n[k]
        return n1 / (n1 + 2 * n2) if n1 + 2 * n2 else 0.5

    def p(self, ctx, w, cands):
        """P(w | ctx), ctx the last order - 1 tokens."""
        row = self.c[1].get(())
        if not row:
            p = 1.0 / len(cands)
        else:
            D, tot = self.D(1), self.tot[1][()]
            p = max(row.get(w, 0) - D, 0) / tot + D * len(row) / tot / len(cands)
        for k in range(2, self.order + 1):
            c = tuple(ctx[len(ctx) - k + 1:])
            row = self.c[k].get(c)
            if row:
                D, tot = self.D(k), self.tot[k][c]
                p = max(row.get(w, 0) - D, 0) / tot + D * len(row) / tot * p
        return p


def stream(seed, n_rec=150, vocab=15):
    rng = np.random.default_rng(seed)
    return [[int(x) % vocab for x in rng.zipf(1.5, rng.integers(1, 9))] for _ in range(n_rec)]


H = np.random.default_rng(99).integers(1, 2**63, 1000, dtype=np.uint64)  # token id -> hash; BOS is H[-1]


def grams(recs, n=3):
    """The hashes of every record's n-grams (BOS-padded), a column per place."""
    cols = [[] for _ in range(n)]
    for r in recs:
        p = [BOS] * (n - 1) + r
        for j in range(n):
            cols[j] += p[j:len(p) - n + 1 + j]
    return tuple(H[np.array(c)] for c in cols)


def trigrams(recs):
    return grams(recs, 3)


def test_table_counts_and_probes_under_load():
    t = CountTable(1 << 10, max_load=0.7)  # 600 keys in 1024 slots: long probe chains
    rng = np.random.default_rng(0)
    keys = rng.integers(1, 2**63, 600, dtype=np.uint64)
    reps = rng.integers(1, 4, 600)
    t.add(np.repeat(keys, reps), np.ones((reps.sum(), 2), np.float32))
    assert t.get(keys)[:, 0].tolist() == reps.astype(np.float32).tolist()
    assert not t.get(rng.integers(1, 2**63, 100, dtype=np.uint64)).any()
    assert t.used == 600
    rows = t.add(keys[:10], np.ones((10, 2), np.float32))  # existing keys: no new slots
    assert t.used == 600 and t.get(keys[:10])[:, 1].tolist() == (reps[:10] + 1).astype(np.float32).tolist()
    assert 3 <= len(rows) <= 21 and rows.max() < t.rows


def test_table_refuses_to_pass_its_load():
    t = CountTable(128)
    t.add(np.arange(1, 65, dtype=np.uint64), np.ones((64, 2), np.float32))
    with pytest.raises(TableFullError, match="model.count_slots"):
        t.add(np.array([999], dtype=np.uint64), np.ones((1, 2), np.float32))


def test_a_table_is_its_rows():
    """Copying the stored rows into a fresh table's buffer gives the same table (a restore)."""
    t = CountTable(256)
    keys = np.random.default_rng(1).integers(1, 2**63, 50, dtype=np.uint64)
    t.add(keys, np.full((50, 2), 3.0, np.float32))
    fresh = CountTable(256)
    fresh.buf.copy_(t.buf.clone())
    assert fresh.used == 50 and fresh.get(keys)[:, 0].tolist() == [3.0] * 50


def test_hand_computed_kn():
    """Records "a b", "a c" (BOS-padded): hand-computed interpolated KN."""
    a, b, c = 1, 2, 3
    kn = KneserNey3(1 << 10, 1 << 10)
    kn.learn(*trigrams([[a, b], [a, c]]))
    # order 3: c(BOS BOS a) = 2, c(BOS a b) = c(BOS a c) = 1 -> n1 = 2, n2 = 1, D3 = 2 / 4
    # order 2 (continuations): N1+(. BOS a) = 1, N1+(. a b) = N1+(. a c) = 1 -> D2 = 1
    # order 1: N1+(. a) = N1+(. b) = N1+(. c) = 1 -> D1 = 1, N1 = 3, 3 types
    assert (kn.D(3), kn.D(2), kn.D(1)) == (0.5, 1.0, 1.0)
    n = 3
    p1 = 1.0 * 3 / 3 / n  # max(1 - 1, 0) / 3 + 1 * 3 / 3 / 3
    p2 = 0 + 1.0 * 2 / 2 * p1  # context a: S = 2, L = 2, N1+(. a b) - D2 = 0
    p3 = (1 - 0.5) / 2 + 0.5 * 2 / 2 * p2  # context (BOS a): c = 1 of 2, 2 types
    w = H[np.array([[b]])]
    got = kn.next_token(H[np.array([[BOS]])], H[np.array([[a]])], w, n)
    assert got[0, 0] == pytest.approx(p3)


@pytest.mark.parametrize("order,bs", [(3, 1), (3, 7), (4, 1), (4, 7)])
def test_next_token_probabilities_equal_dict_kn(order, bs):
    """The trigram part (order 3) and the one with a 4-gram order on top (order 4) score
    every position as the dictionary reference does, learned a batch at a time."""
    recs = stream(1 if order == 3 else 11)
    ref = DictKN(order)
    kn = KneserNey3(1 << 14, 1 << 12) if order == 3 else KneserNey4(1 << 14, 1 << 12)
    seen, checked = [], 0
    for s in range(0, len(recs), bs):
        batch = recs[s:s + bs]
        if seen:
            cands = np.array(seen)
            for r in batch:
                p = [BOS] * (order - 1) + r
                for i in range(len(r)):
                    want = [ref.p(tuple(p[i:i + order - 1]), w, seen) for w in seen]
                    got = kn.score(tuple(H[[[t]]] for t in p[i:i + order - 1]), H[cands][None], len(seen))[0]
                    assert got == pytest.approx(want, rel=1e-5)
                    checked += 1
        for r in batch:
            ref.learn(r)
            seen += [t for t in r if t not in seen]
        kn.learn(*grams(batch, order))
    assert checked > 300 and kn.D(order) not in (0.5, 1.0)


@pytest.mark.parametrize("warm", [0, 40])
def test_in_order_scores_equal_counting_the_batch_record_by_record(warm):
    """next_token_in_order scores each record of a batch exactly as next_token does after
    the batch's earlier records are learned one at a time (shared candidates and each
    slot's own), from an empty model or a warm one, and leaves the tables as they were."""
    recs = stream(7, n_rec=warm + 60)
    kn, ref = KneserNey3(1 << 14, 1 << 12), KneserNey3(1 << 14, 1 << 12)
    if warm:
        kn.learn(*trigrams(recs[:warm]))
        ref.learn(*trigrams(recs[:warm]))
    cands = H[np.arange(15)][None]
    for start in range(warm, len(recs), 12):
        batch = recs[start:start + 12]
        u, v, w = trigrams(batch)
        records = np.repeat(np.arange(len(batch)), [len(r) for r in batch])
        before = {name: t.numpy().tobytes() for name, t in kn.tables("lm").items()}
        shared, own = kn.next_token_in_order(u[:, None], v[:, None], [cands, w[:, None]], 15,
                                             np.stack([u, v, w], 1), records)
        assert {name: t.numpy().tobytes() for name, t in kn.tables("lm").items()} == before
        at = 0
        for r in batch:
            rows = slice(at, at + len(r))
            ctx = u[rows, None], v[rows, None]
            assert np.array_equal(shared[rows], ref.next_token(*ctx, cands, 15))
            assert np.array_equal(own[rows], ref.next_token(*ctx, w[rows, None], 15))
            ref.learn(u[rows], v[rows], w[rows])
            at = rows.stop
        kn.learn(u, v, w)


def test_hand_computed_kn4():
    """Records "a b", "a c", "a b" (3 BOS before each): the 4-gram order by hand."""
    a, b, c = 1, 2, 3
    kn, ref = KneserNey4(1 << 10, 1 << 10), DictKN(4)
    recs = [[a, b], [a, c], [a, b]]
    kn.learn(*grams(recs, 4))
    for r in recs:
        ref.learn(r)
    # order 4: c(BOS BOS BOS a) = 3, c(BOS BOS a b) = 2, c(BOS BOS a c) = 1 -> n1 = 1, n2 = 1, D4 = 1 / 3
    assert kn.D(4) == pytest.approx(1 / 3)
    cands = [a, b, c]
    p3 = ref.p((BOS, a), b, cands)  # the trigram model below (checked against DictKN elsewhere)
    p4 = (2 - 1 / 3) / 3 + (1 / 3) * 2 / 3 * p3  # context (BOS BOS a): c(b) = 2 of 3, 2 types
    assert ref.p((BOS, BOS, a), b, cands) == pytest.approx(p4)
    got = kn.next_token4(*(H[np.array([[t]])] for t in (BOS, BOS, a)), H[np.array([[b]])], 3)
    assert got[0, 0] == pytest.approx(p4)
    assert kn.next_token4(*(H[np.array([[t]])] for t in (c, BOS, a)), H[np.array([[b]])], 3)[0, 0] == \
        pytest.approx(p3)  # an unseen 4-gram context: the trigram model


@pytest.mark.parametrize("warm", [0, 40])
def test_kn4_in_order_scores_equal_counting_the_batch_record_by_record(warm):
    recs = stream(8, n_rec=warm + 60)
    kn, ref = KneserNey4(1 << 14, 1 << 12), KneserNey4(1 << 14, 1 << 12)
    if warm:
        kn.learn(*grams(recs[:warm], 4))
        ref.learn(*grams(recs[:warm], 4))
    cands = H[np.arange(15)][None]
    for start in range(warm, len(recs), 12):
        batch = recs[start:start + 12]
        x, u, v, w = grams(batch, 4)
        records = np.repeat(np.arange(len(batch)), [len(r) for r in batch])
        before = {name: t.numpy().tobytes() for name, t in kn.tables("lm").items()}
        ctx = (x[:, None], u[:, None], v[:, None])
        shared, own = kn.score_in_order(ctx, [cands, w[:, None]], 15, np.stack([x, u, v, w], 1), records)
        assert {name: t.numpy().tobytes() for name, t in kn.tables("lm").items()} == before
        at = 0
        for r in batch:
            rows = slice(at, at + len(r))
            mine = tuple(c[rows] for c in ctx)
            assert np.array_equal(shared[rows], ref.score(mine, cands, 15))
            assert np.array_equal(own[rows], ref.score(mine, w[rows, None], 15))
            ref.learn(x[rows], u[rows], v[rows], w[rows])
            at = rows.stop
        kn.learn(x, u, v, w)


def test_a_full_quad_table_halves_alone_and_recounts_its_order():
    recs = stream(4, n_rec=2000, vocab=400)
    kn = KneserNey4(1 << 11, 1 << 12)
    for s in range(0, len(recs), 10):
        big, small, quad = kn.learn(*grams(recs[s:s + 10], 4))
        assert kn.quad.used <= 0.5 * kn.quad.slots and quad.max() < kn.quad.rows
    keys, vals = kn.quad.entries()
    c4 = vals[(keys & np.uint64(7)) == np.uint64(6), 0]  # T4's tag
    n1, n2 = kn.stats.numpy()[0, [8, 9]]
    assert kn.halvings > 0 and (n1, n2) == (np.count_nonzero(c4 == 1), np.count_nonzero(c4 == 2))
    p = kn.next_token4(H[[[BOS]]], H[[[BOS]]], H[[[BOS]]], H[np.arange(400)][None], 400)[0]
    assert np.isfinite(np.log(p)).all() and p.sum() < 1.5


def test_restored_rows_are_the_same_kn4():
    kn = KneserNey4(1 << 12, 1 << 11)
    kn.learn(*grams(stream(6), 4))
    back = KneserNey4(1 << 12, 1 << 11)
    assert set(back.tables("lm")) == {"lm.kn3", "lm.kn12", "lm.stats", "lm.kn4"}
    for name, t in back.tables("lm").items():
        t.copy_(kn.tables("lm")[name])
    ctx = H[[[BOS]]], H[[[BOS]]], H[[[3]]]
    cands = H[np.arange(15)][None]
    assert back.score(ctx, cands, 15).tolist() == kn.score(ctx, cands, 15).tolist()


def test_chain_equals_the_trigram_scored_token_by_token():
    recs = stream(2)
    ref, kn = DictKN(), KneserNey3(1 << 14, 1 << 12)
    rng = np.random.default_rng(3)
    seen, checked = [], 0
    for r in recs:
        if seen:
            s = int(rng.integers(0, len(r)))
            p = [BOS, BOS] + r + [BOS, BOS]
            j = s + 2
            want = []
            for w in seen:
                x = np.log(ref.p((p[j - 2], p[j - 1]), w, seen))
                if s + 1 < len(r):
                    x += np.log(ref.p((p[j - 1], w), p[j + 1], seen))
                if s + 2 < len(r):
                    x += np.log(ref.p((w, p[j + 1]), p[j + 2], seen))
                want.append(x)
            ctx = [H[[[p[j + d]]]] for d in (-2, -1, 1, 2)]
            got = kn.chain(*ctx, np.array([[s + 1 < len(r)]]), np.array([[s + 2 < len(r)]]), H[np.array(seen)][None],
                           len(seen))[0]
            assert got == pytest.approx(want, rel=1e-4, abs=1e-4)
            checked += 1
        ref.learn(r)
        seen += [t for t in r if t not in seen]
        kn.learn(*trigrams([r]))
    assert checked > 100


def test_rows_touched_scale_with_the_batch_not_the_table():
    recs = stream(5, n_rec=400, vocab=200)
    kn = KneserNey3(1 << 16, 1 << 15)
    for s in range(0, 400, 8):
        batch = recs[s:s + 8]
        big, small = kn.learn(*trigrams(batch))
        positions = sum(len(r) for r in batch)
        assert 0 < len(big) <= 4 * positions + 1 and len(small) <= 8 * positions + 1  # a key touches 2 rows
        assert big.max() < kn.big.rows and (len(small) == 0 or small.max() < kn.small.rows)


def test_a_full_table_halves_in_place_and_stays_bounded():
    recs = stream(4, n_rec=3000, vocab=400)
    kn = KneserNey3(1 << 11, 1 << 10)
    buf = kn.big.buf
    for s in range(0, len(recs), 10):
        big, _ = kn.learn(*trigrams(recs[s:s + 10]))
        assert kn.big.used <= 0.5 * kn.big.slots and kn.small.used <= 0.5 * kn.small.slots
    assert kn.halvings > 0 and kn.big.buf is buf  # rewritten in place: the stored table is the same tensor
    cands = H[np.arange(400)][None]
    p = kn.next_token(H[[[BOS]]], H[[[BOS]]], cands, 400)[0]
    assert np.isfinite(np.log(p)).all() and p.sum() < 1.5  # halving loses some mass (kn._halve_if_full)
    assert (kn.stats.numpy() >= 0).all()


def test_restored_rows_are_the_same_count_part():
    recs = stream(6)
    kn = KneserNey3(1 << 12, 1 << 11)
    kn.learn(*trigrams(recs))
    back = KneserNey3(1 << 12, 1 << 11)
    for name, t in back.tables("lm").items():
        t.copy_(kn.tables("lm")[name])
    cands = H[np.arange(15)][None]
    ctx = H[[[BOS]]], H[[[3]]]
    assert back.next_token(*ctx, cands, 15).tolist() == kn.next_token(*ctx, cands, 15).tolist()
    assert ROW == 128 and kn.big.buf.shape == (2 * kn.big.slots // ROW + 1, 2 * ROW)


# ---------------------------------------------------------------------------- compiled counting

@pytest.mark.parametrize("order", [3, 4])
def test_the_compiled_counting_leaves_every_byte_as_numpys(order):
    """streamlearn.compiled_counts against the numpy passes, batch by batch over a Zipf
    stream in small tables that halve often: the same rows reported, the same raised
    tokens, and every table (keys in the same slots) and scalar byte for byte."""
    from streamlearn.compiled_counts import CompiledCounts

    cls = KneserNey4 if order == 4 else KneserNey3
    numpy_kn, fast_kn = cls(1024, 512), cls(1024, 512)
    fast_kn.compiled = CompiledCounts
    rng = np.random.default_rng(order)
    vocab = rng.integers(1, 2 ** 63, size=300, dtype=np.uint64)
    bits = lambda t: t.numpy().view(np.uint32)  # noqa: E731  (key words can read as NaN)
    for step in range(150):
        grams = vocab[np.minimum(rng.zipf(1.3, size=(int(rng.integers(1, 50)), order)) - 1, 299)]
        if step % 5 == 0:
            grams[:, :order - 1] = vocab[0]  # a record's first tokens: BOS contexts, repeated
        want, got = numpy_kn.learn(*grams.T), fast_kn.learn(*grams.T)
        assert len(want) == len(got) == order - 1
        for a, b in zip(want, got):
            assert a.dtype == b.dtype == np.int64 and np.array_equal(a, b), step
        assert np.array_equal(numpy_kn.raised, fast_kn.raised), step
        for name, table in numpy_kn.tables("lm").items():
            assert np.array_equal(bits(table), bits(fast_kn.tables("lm")[name])), (step, name)
    assert fast_kn.halvings == numpy_kn.halvings > 3


# ---------------------------------------------------------------------------- in the learner

def _learner(task: str, *extra: str):
    from streamlearn.config import Config
    from streamlearn.learner import Learner

    return Learner(Config().override(
        "embedding.K=2000", "embedding.B=256", "embedding.d=16", "model.d_model=16", "model.heads=2",
        "model.ffn=32", "model.out_B=256", "model.layers=1", "model.positions=true", f"learner.task={task}",
        "model.output=sampled", "model.counts=kn3", "model.count_slots=4096", "model.negatives=16",
        "learner.batch_size=4", "store.shards=2", *extra))


def _records(n: int, seed: int) -> list[dict]:
    rng = np.random.default_rng(seed)
    return [{"tokens": [f"w{int(x) % 50}" for x in rng.zipf(1.3, int(rng.integers(2, 12)))]} for _ in range(n)]


QUERY = {"next-token": [{"tokens": ["w1", "w2"]}, {"tokens": []}, {"text": "w4 never-seen"}],
         "mlm": [{"tokens": ["w1", "[MASK]", "w3"]}, {"text": "w4 w5"}, {"tokens": ["w2", "w1", "[MASK]"]}]}


def _commit(store, learner, full=False):
    from streamlearn.checkpoint import write
    from streamlearn.state import Checkpoint

    specs, rows, blobs, kv = write(learner, full=full)
    store.declare_tables(specs)
    store.commit(Checkpoint(step=learner.steps, rows=rows, blobs=blobs, kv=kv, config=learner.cfg.to_dict()))


def _same_answers(a, b, task):
    for x, y in zip(a.topk_many(QUERY[task], k=5), b.topk_many(QUERY[task], k=5)):
        assert x.tokens == y.tokens
        np.testing.assert_allclose(x.scores, y.scores, rtol=0, atol=1e-5)


@pytest.mark.parametrize("task,recent,fit,counts,pairs", [
    ("next-token", 0, "separate", "kn3", 0), ("next-token", 20, "separate", "kn3", 0),
    ("next-token", 0, "joint", "kn3", 0), ("next-token", 0, "separate", "kn4", 0), ("next-token", 20, "joint", "kn4", 0),
    ("next-token", 0, "separate", "kn4", 30), ("mlm", 0, "separate", "kn3", 0), ("mlm", 0, "joint", "kn3", 0)])
def test_the_count_part_round_trips_through_incremental_checkpoints(task, recent, fit, counts, pairs, tmp_path):
    """Checkpoints of dirty rows only, a restore, and training on: the restored learner
    answers and keeps learning as the live one (counts, the recent-token and pair caches,
    the joint fit's gates or the separate fit's fixed weights, output rows)."""
    from streamlearn.checkpoint import read_full
    from streamlearn.heads import COUNT_WEIGHT
    from streamlearn.state import open_store

    live = _learner(task, f"model.recent={recent}", f"model.count_fit={fit}", f"model.counts={counts}",
                    f"model.recent_pairs={pairs}")
    assert ("lm.recent" in live.task.count_tables()) == bool(recent)
    assert ("lm.pairs" in live.task.count_tables()) == bool(pairs)
    assert ("lm.kn4" in live.task.count_tables()) == (counts == "kn4")
    with open_store(tmp_path / "state", live.cfg.store) as store:
        for i in range(3):
            for j in range(3):
                live.learn_many(_records(4, 10 * i + j))
            _commit(store, live)
        back = read_full(store)
    assert live.task.counter.kn.big.used > 0
    assert counts == "kn3" or live.task.counter.kn.quad.used > 0
    for name, t in live.task.count_tables().items():
        assert back.task.count_tables()[name].numpy().tobytes() == t.numpy().tobytes(), name  # keys can read as NaN
    _same_answers(live, back, task)
    for s in range(3):
        live.learn_many(_records(4, 100 + s))
        back.learn_many(_records(4, 100 + s))
    _same_answers(live, back, task)
    if pairs:  # the ring wrapped (3 x 4 records of 10 tokens and more > 30 pairs) and lam moved off its start
        cache = back.task.counter.pairs
        assert cache.filled == pairs and cache.lam != cache.start and cache.lam == live.task.counter.pairs.lam
    if fit == "joint":
        assert live.model.head.gates.weight.abs().sum() > 0  # the gates learn (they start at W = 0)
    else:
        assert live.model.head.gates is None and back.model.head.weights[0] == COUNT_WEIGHT


@pytest.mark.parametrize("counts,pairs", [("kn3", 0), ("kn4", 0), ("kn4", 25)])
def test_a_next_token_batch_is_scored_with_its_earlier_records_counted(counts, pairs):
    """A next-token training batch's in-order count scores (what a prequential prediction
    of the batch reads) give each record the counts of the batch's records before it, as
    a baseline learning record by record has them; the lagged scores differ. With the
    pair cache, each record's cache holds the pairs of the records before it too."""
    import copy

    learner = _learner("next-token", f"model.counts={counts}", f"model.recent_pairs={pairs}")
    for s in range(3):
        learner.learn_many(_records(4, s))
    records = _records(4, 50)
    batch = learner.prepare(records)
    task = learner.task
    cands = task.counter.candidates(task.index)
    got = task.prediction_counts(batch, cands, len(cands))
    one_by_one = copy.deepcopy(task.counter)
    ctx, tri = batch.counts["ctx"], batch.counts["grams"]
    assert ctx.shape[1] == tri.shape[1] - 1 == {"kn3": 2, "kn4": 3}[counts]
    for r in range(len(records)):
        rows = batch.rows == r
        np.testing.assert_allclose(got[rows], one_by_one.next_token(ctx[rows], cands, len(cands)), rtol=0,
                                   atol=1e-6 if pairs else 0)  # the cache's mix: float64 of float32 scores
        lam = None if one_by_one.pairs is None else one_by_one.pairs.lam
        one_by_one.learn(tri[rows])
        if lam is not None:  # lam is the batch's: learning one record at a time would move it in between
            one_by_one.pairs.lam = lam
    lagged = task.counter.next_token(ctx, cands, len(cands))
    assert not np.array_equal(got, lagged)  # the batch's later records did see its earlier ones
    assert np.array_equal(got[batch.rows == 0], lagged[batch.rows == 0])


@pytest.mark.parametrize("task,counts", [("next-token", "kn3"), ("next-token", "kn4"), ("mlm", "kn3")])
def test_rows_dirtied_per_step_scale_with_the_batch_not_the_tables(task, counts):
    learner = _learner(task, "model.count_slots=65536", "model.out_B=50000", f"model.counts={counts}")
    for s in range(20):
        records = _records(4, s)
        report = learner.learn_many(records)
        positions = sum(len(r["tokens"]) for r in records)
        changed = {name: len(ids) for name, ids in report.rows.items()}
        assert 0 < changed["lm.kn3"] <= 4 * positions + 1 and changed.get("lm.kn12", 0) <= 8 * positions + 1
        assert counts == "kn3" or 0 < changed["lm.kn4"] <= 4 * positions + 1
        assert changed["lm.stats"] == 1
        assert changed["O"] <= 2 * (positions + 16)  # m = 2 rows per answer and negative
    tables = learner.task.count_tables()
    assert tables["lm.kn3"].shape[0] == 1025 and tables["lm.kn12"].shape[0] == 513
    assert counts == "kn3" or tables["lm.kn4"].shape[0] == 1025


@pytest.mark.parametrize("task,counts", [("next-token", "kn3"), ("next-token", "kn4"), ("mlm", "kn3")])
def test_bad_records_are_refused_and_not_counted(task, counts):
    learner = _learner(task, f"model.counts={counts}")
    report = learner.learn_many([{"tokens": []}, {"text": 5}, {"tokens": ["a", "b"]}])
    assert [i for i, _ in report.rejected] == [0, 1] and report.records == 1
    assert learner.task.counter.kn.stats.numpy()[0, 7] == 2  # two types counted: a, b (not BOS, not the bad ones)
    if counts == "kn4":  # two 4-gram types, each seen once: n1 = 2, n2 = 0
        assert learner.task.counter.kn.stats.numpy()[0, [8, 9]].tolist() == [2, 0]


@pytest.mark.parametrize("bad", [("model.counts=kn3",),  # classify
                                 ("learner.task=next-token", "model.output=hashed", "model.counts=kn3"),
                                 ("learner.task=next-item", "model.output=sampled", "model.counts=kn3")])
def test_a_count_part_outside_the_token_streams_sampled_head_is_refused(bad):
    from streamlearn.config import Config
    from streamlearn.exceptions import ConfigError

    with pytest.raises(ConfigError, match="model.counts='kn3' is a count part of task next-token or mlm"):
        Config().override(*bad)
    with pytest.raises(ConfigError, match="model.count_slots must be a power of two"):
        Config().override("model.count_slots=1000")
    with pytest.raises(ConfigError, match="model.recent=5 is a feature of the count part"):
        Config().override("model.recent=5")
    with pytest.raises(ConfigError, match="model.counts='kn4' is a count part of task next-token "):
        Config().override("learner.task=mlm", "model.counts=kn4")  # mlm's chain reads trigrams
    with pytest.raises(ConfigError, match="model.recent_pairs=8 mixes into next-token's count part"):
        Config().override("learner.task=mlm", "model.recent_pairs=8")
    assert Config().override("learner.task=next-token", "model.counts=none").model.recent_pairs == 1000


def test_the_recent_cache_counts_the_last_tokens():
    from collections import Counter

    from streamlearn.counts.recent import RecentTokens

    rng = np.random.default_rng(5)
    cache, seen = RecentTokens(50), []
    for _ in range(100):
        batch = rng.integers(1, 40, int(rng.integers(1, 70))).astype(np.uint64)
        rows = cache.learn(batch)
        assert rows.max() < cache.buf.shape[0] and 0 in rows
        seen += batch.tolist()
        last = Counter(seen[-50:])
        w = np.arange(1, 41, dtype=np.uint64)
        want = np.log((np.array([last[int(x)] for x in w]) + 0.1) / (len(seen[-50:]) + 0.1 * 40))
        assert cache.logp(w, 40) == pytest.approx(want, rel=1e-5)


def test_the_pair_cache_reads_each_records_window_of_the_last_pairs():
    """cached(): P(w | v) over the ``size`` pairs before each example's record (the ring
    and the batch's earlier records), against counting the pairs by hand."""
    from streamlearn.counts.recent import RecentPairs

    rng = np.random.default_rng(3)
    for _ in range(60):
        size = int(rng.integers(1, 12))
        cache, history = RecentPairs(size), []
        for _ in range(int(rng.integers(0, 4))):
            v, w = rng.integers(1, 5, (2, int(rng.integers(1, 8)))).astype(np.uint64)
            cache.learn(v, w, np.full(len(v), 0.2) if cache.due else None)
            history += list(zip(v.tolist(), w.tolist()))
        m = int(rng.integers(1, 10))
        records = np.sort(rng.integers(0, 3, m))
        v, w = rng.integers(1, 5, (2, m)).astype(np.uint64)
        cands = rng.permutation(np.arange(1, 6, dtype=np.uint64))[:int(rng.integers(1, 6))]
        starts = np.searchsorted(records, records, "left")
        ids, cols, p = cache.cached(v, cands, starts, np.stack([v, w], 1))
        got = dict(zip(zip(ids.tolist(), cols.tolist()), p.tolist()))
        pairs, want = history + list(zip(v.tolist(), w.tolist())), {}
        for i in range(m):
            end = len(history) + int(starts[i])
            row = [b for a, b in pairs[max(0, end - size):end] if a == int(v[i])]
            want.update({(i, j): row.count(c) / len(row) for j, c in enumerate(cands.tolist()) if c in row})
        assert got == pytest.approx(want, rel=1e-12) and got.keys() == want.keys()
        rows = cache.cached(v, np.tile(cands, (m, 1)), starts, np.stack([v, w], 1))  # each example's own row
        assert all(np.array_equal(a, b) for a, b in zip(rows, (ids, cols, p)))


def test_the_pair_caches_weight_follows_how_well_the_cache_predicts():
    """lam moves by online EM: up on a stream that repeats its pairs (the cache holds each
    answer), down to its floor on one whose answers the cache never holds; the mix adds
    lam / (1 - lam) P_cache to the cells the cache holds, nothing elsewhere."""
    from streamlearn.counts.recent import RecentPairs

    repeats, fresh = RecentPairs(50), RecentPairs(50)
    v = np.arange(1, 11, dtype=np.uint64)
    for step in range(1000):  # every 8th batch of 10 pairs moves lam 8% of the way
        repeats.learn(v, v + np.uint64(100), np.full(10, 0.01))  # P_KN 0.01; the cache's P 1 from step 2
        fresh.learn(v, np.arange(10, dtype=np.uint64) + np.uint64(1000 + 10 * step), np.full(10, 0.01))
        assert repeats.due == ((step + 1) % RecentPairs.EVERY == 0)
    assert repeats.lam == RecentPairs.HIGH and fresh.lam == RecentPairs.LOW
    logp = np.log(np.full((2, 3), 0.1, np.float32))
    cands = np.array([101, 102, 7], np.uint64)
    repeats.mix(logp, np.array([1, 99], np.uint64), cands)
    odds = RecentPairs.HIGH / (1 - RecentPairs.HIGH)
    assert logp[0] == pytest.approx(np.log([0.1 + odds, 0.1, 0.1])) and logp[1] == pytest.approx(np.log([0.1] * 3))


@pytest.mark.parametrize("task,counts,pairs", [("next-token", "kn3", 0), ("next-token", "kn4", 0),
                                               ("next-token", "kn4", 30), ("mlm", "kn3", 0)])
def test_replicas_merged_by_replay_hold_one_learners_counts(task, counts, pairs):
    """Two replicas learn different records; after merging their logs both hold the
    count tables (bit for bit) and candidates of a third learner that learned both
    records' batches in rank order, and the merged rows are dirty for the checkpoint."""
    a, b, one = (_learner(task, f"model.counts={counts}", f"model.recent_pairs={pairs}") for _ in range(3))
    a.replica.keep_log()
    b.replica.keep_log()
    mine, theirs = _records(24, 1), _records(24, 2)
    for learner, recs in ((a, mine), (b, theirs)):
        for at in range(0, len(recs), 4):
            learner.learn_batch(learner.prepare(recs[at:at + 4]))
    for recs in (mine, theirs):
        for at in range(0, len(recs), 4):
            one.learn_batch(one.prepare(recs[at:at + 4]))
    assert not np.array_equal(a.task.counter.kn.big.buf.numpy(), b.task.counter.kn.big.buf.numpy())
    logs = [a.replica.log(), b.replica.log()]
    a.take_dirty()
    for learner in (a, b):
        learner.replica.merge_logs(logs)
    bits = lambda t: t.numpy().view(np.uint32)  # noqa: E731  (key words can read as NaN)
    for name, table in one.task.count_tables().items():
        assert np.array_equal(bits(a.task.count_tables()[name]), bits(table)), name
        assert np.array_equal(bits(b.task.count_tables()[name]), bits(table)), name
    assert sorted(a.index.tokens) == sorted(b.index.tokens) == sorted(one.index.tokens)
    dirty = a.take_dirty()
    assert "lm.kn3" in dirty and "lm.kn12" in dirty and ("lm.kn4" in dirty) == (counts == "kn4")
    assert a.replica.log().grams == [] and a.replica.log().new_tokens == []  # the next merge starts here


@pytest.mark.parametrize("task,counts", [("next-token", "kn4"), ("mlm", "kn3")])
def test_a_learner_counts_the_same_bytes_with_the_kernels_and_without(task, counts):
    """``learner.compiled`` (the default) counts through the kernels, ``false`` through
    numpy: after the same stream every count table is the same bytes."""
    fast, slow = _learner(task, f"model.counts={counts}"), _learner(task, f"model.counts={counts}",
                                                                    "learner.compiled=false")
    assert fast.task.counter.kn.compiled() is not None and slow.task.counter.kn.compiled is None
    for recs in (_records(60, 3)[at:at + 4] for at in range(0, 60, 4)):
        fast.learn_many(recs)
        slow.learn_many(recs)
    bits = lambda t: t.numpy().view(np.uint32)  # noqa: E731  (key words can read as NaN)
    for name, table in slow.task.count_tables().items():
        assert np.array_equal(bits(fast.task.count_tables()[name]), bits(table)), name


def test_the_proposal_kept_in_step_equals_reading_every_candidate():
    """The negatives' proposal is updated from the tokens each learn touched; after
    learns, new candidates, a halving and a restore of other counts it equals a fresh
    read of every candidate's N1+(. w), to the last bit."""
    from streamlearn.counts.part import CountPart

    part = CountPart(1 << 10, seed=0)
    cands = H[:40]
    for step, recs in enumerate(stream(7, n_rec=400)[i:i + 8] for i in range(0, 400, 8)):
        u, v, w = trigrams(recs)
        part.learn(np.stack([u, v, w], 1))
        seen = cands[:10 + step % 31]  # the candidates grow (and once shrink: a new index)
        q, total = part.proposal(seen)
        weight = part.kn.token_stats(seen)[:, 0].astype(np.float64) ** 0.75
        assert total == weight.sum()
        np.testing.assert_array_equal(q, 0.9 * weight / total + 0.1 / len(seen))
    assert part.kn.halvings > 0  # the halving path was taken
    other = CountPart(1 << 10, seed=0)
    other.learn(np.stack(trigrams(stream(8, n_rec=50)), 1))
    for name, t in part.tables().items():
        t.copy_(other.tables()[name])  # a restore: the tables change without a learn
    q, total = part.proposal(cands)
    assert total == (other.kn.token_stats(cands)[:, 0].astype(np.float64) ** 0.75).sum()



def test_a_separate_count_part_leaves_the_network_learning_alone_and_joins_its_answers():
    """``model.count_fit=separate``: the network learns exactly as with no count part
    (same losses, same weights: a step reads no count score), and its answers add the
    count part's log-probabilities times COUNT_WEIGHT; ``joint`` learns otherwise."""
    from streamlearn.heads import COUNT_WEIGHT

    alone, separate, joint = (_learner("next-token", *extra) for extra in
                              (("model.counts=none",), (), ("model.count_fit=joint",)))
    for s in range(4):
        records = _records(4, s)
        losses = [learner.learn_many(records).loss for learner in (alone, separate, joint)]
        assert losses[0] == losses[1] and (s == 0 or losses[2] != losses[1])
    for name, p in alone.model.dense_parameters().items():
        assert torch.equal(p, separate.model.dense_parameters()[name]), name
    assert torch.equal(alone.model.head.O, separate.model.head.O)
    task = separate.task
    batch = separate.prepare(QUERY["next-token"], train=False)
    cands = task.counter.candidates(task.index)
    counts = torch.from_numpy(task.score_counts(batch.counts["ctx"], cands, len(cands)))[:, 0].to(separate.device)
    with torch.no_grad():
        joined = task.logits(separate.model, batch, separate.dev)
        states = task.readout(separate.model, batch, separate.dev.tensors(batch.feats), separate.dev)
        net = separate.model.head(states, None, **separate.dev.tensors(task.code.scoring_inputs(task.index)))
    torch.testing.assert_close(torch.log_softmax(joined.float(), -1),
                               torch.log_softmax(net + COUNT_WEIGHT * counts, -1), rtol=1e-5, atol=1e-5)

def test_a_token_state_stored_before_count_fit_keeps_the_joint_fit(tmp_path, store_as_before):
    """A next-token state written before ``model.count_fit`` existed was trained on the
    joined loss: it restores as ``joint``, answers as it did, and a restart at today's
    default is refused, naming the key."""
    from streamlearn import checkpoint
    from streamlearn.exceptions import CheckpointMismatchError
    from streamlearn.state import open_store

    live = _learner("next-token", "model.count_fit=joint")
    for s in range(3):
        live.learn_many(_records(4, s))
    store_as_before(live, tmp_path, "model.count_fit")
    with open_store(tmp_path, readonly=True) as store:
        assert checkpoint.stored_config(store).model.count_fit == "joint"
        back = checkpoint.read_full(store)
        assert back.model.head.gates is not None  # the joint fit's learned gates
        _same_answers(live, back, "next-token")
        with pytest.raises(CheckpointMismatchError, match=r"model.count_fit.*--set model.count_fit=joint"):
            checkpoint.read_full(store, _learner("next-token").cfg)
    assert _learner("next-token").model.head.gates is None


def test_a_next_token_state_stored_with_the_trigram_keeps_it(tmp_path):
    """next-token's default moved from kn3 to kn4 (2026-11-27): a worker restarted on a
    state trained with kn3, its run setting no counts, opens it with kn3 and answers as
    it did; setting kn4 on that state is refused, naming the key."""
    from streamlearn.consumers.checkpoint import open_learner
    from streamlearn.exceptions import CheckpointMismatchError
    from streamlearn.state import open_store

    live = _learner("next-token")  # model.counts=kn3
    for s in range(3):
        live.learn_many(_records(4, s))
    with open_store(tmp_path / "state", live.cfg.store) as store:
        _commit(store, live, full=True)
    today = _learner("next-token", "model.counts=kn4").cfg  # the run's config: kn4 by default
    given = {"learner.task"}  # what the run set: not model.counts
    with open_store(tmp_path / "state", live.cfg.store) as store:
        back = open_learner(store, today, None, given)
        assert back.cfg.model.counts == "kn3" and "lm.kn4" not in back.task.count_tables()
        _same_answers(live, back, "next-token")
        with pytest.raises(CheckpointMismatchError, match="model.counts: stored 'kn3', now 'kn4'"):
            open_learner(store, today, None, {"learner.task", "model.counts"})
