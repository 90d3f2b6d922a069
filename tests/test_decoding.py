"""Decoding: beam search with certificate vs brute force, candidate index persistence, T-Free."""
import threading

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

from streamlearn.decoding import (
    CandidateIndex, DecodingError, Fresh, PatternIndex, TopK, beam_topk, beam_topk_many,
    candidate_topk_many, exhaustive_topk, exhaustive_topk_many, tfree_topk,
)
from streamlearn.exceptions import StreamlearnError
from streamlearn.hashing import multi_hash, tfree_hashes


# ---------------------------------------------------------------------------- helpers

def table_hasher(table: dict[str, tuple[int, ...]]):
    """A hasher with hand-picked buckets, for examples checkable by hand."""
    return lambda toks: np.array([table[t] for t in toks], dtype=np.int64).reshape(len(toks), -1)


def brute(logp: np.ndarray, index: CandidateIndex, k: int) -> tuple[list[str], np.ndarray]:
    """Every candidate scored, ranked by (score desc, candidate order)."""
    H = index.hashes
    scores = logp[0, H[:, 0]].astype(np.float64)
    for j in range(1, H.shape[1]):
        scores = scores + logp[j, H[:, j]]
    order = sorted(range(len(H)), key=lambda i: (-scores[i], i))[:k]
    return [index.tokens[i] for i in order], scores[order]


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = x - x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


def random_logp(rng, m, size, ties):
    # Integer logits make many exact ties between candidates (shared buckets and equal sums).
    x = rng.integers(0, 3, (m, size)).astype(float) if ties else rng.normal(0, 2, (m, size))
    return log_softmax(x)


def superbloom(m, size, tokens=(), seed=0, merge_min=None):
    index = CandidateIndex.superbloom(m, size, seed)
    if merge_min is not None:
        index.merge_min = merge_min
    index.add(list(tokens))
    return index


# ---------------------------------------------------------------------------- hand-checked

HAND = {"a": (0, 0), "b": (0, 1), "c": (1, 0), "d": (3, 3)}
HAND_LOGP = np.log(np.array([[0.5, 0.3, 0.1, 0.1], [0.6, 0.2, 0.1, 0.1]]))


def hand_index():
    index = CandidateIndex(2, 4, table_hasher(HAND))
    index.add(["a", "b", "c", "d"])
    return index


def test_hand_example_certificate_after_one_level():
    # Level 1 visits bucket 0 of both lists: a, b (list 0) and a, c (list 1).
    # Scores: a = .5*.6 = .30, c = .3*.6 = .18, b = .5*.2 = .10; d (.01) is never scored.
    # Bound for anything unscored: second-best of each list, .3 * .2 = .06 < .10.
    top = beam_topk(HAND_LOGP, hand_index(), k=3, beam=1)
    assert top.tokens == ["a", "c", "b"]
    np.testing.assert_allclose(np.exp(top.scores), [0.30, 0.18, 0.10])
    assert top.exact and top.visited == 3


def test_hand_example_beam_too_narrow_is_not_exact():
    top = beam_topk(HAND_LOGP, hand_index(), k=4, beam=1)
    assert top.tokens == ["a", "c", "b"] and not top.exact and top.visited == 3
    full = beam_topk(HAND_LOGP, hand_index(), k=4, beam=4)
    assert full.tokens == ["a", "c", "b", "d"] and full.exact and full.visited == 4


def test_hand_example_certificate_fails_when_bound_is_higher():
    # Level 1 scores a = .5*.46 = .23, b = .5*.1 = .05, c = .1*.46 = .046. The second-best
    # buckets are 2 (.3) and 3 (.39): an unscored candidate could reach .117 > .046, so
    # k=3 is not certified; k=1 is (.23 > .117). Level 2 reaches d (3, 3) and ends the scan.
    logp = np.log(np.array([[0.5, 0.1, 0.3, 0.1], [0.46, 0.1, 0.05, 0.39]]))
    assert not beam_topk(logp, hand_index(), k=3, beam=1).exact
    assert beam_topk(logp, hand_index(), k=1, beam=1).exact
    top = beam_topk(logp, hand_index(), k=3, beam=2)
    assert top.exact and top.visited == 4 and top.tokens == ["a", "b", "c"]
    np.testing.assert_allclose(np.exp(top.scores), [0.23, 0.05, 0.046])


def test_ties_break_by_candidate_order():
    index = CandidateIndex(1, 2, table_hasher({"x": (1,), "y": (0,), "z": (1,)}))
    index.add(["x", "y", "z"])
    logp = np.log([[0.5, 0.5]])
    assert beam_topk(logp, index, k=2, beam=2).tokens == ["x", "y"]
    assert exhaustive_topk(logp, index, k=3).tokens == ["x", "y", "z"]


# ---------------------------------------------------------------------------- properties

@st.composite
def problems(draw):
    m = draw(st.integers(1, 4))
    size = draw(st.integers(1, 12))  # small: buckets collide a lot
    n = draw(st.integers(0, 60))
    batches = draw(st.lists(st.integers(1, 30), min_size=1, max_size=4))
    return dict(m=m, size=size, n=n, batches=batches, k=draw(st.integers(1, 12)),
                beam=draw(st.integers(1, 14)), seed=draw(st.integers(0, 2**32 - 1)),
                ties=draw(st.booleans()), merge_min=draw(st.sampled_from([0, 3, 10**9])))


@settings(max_examples=250, deadline=None)
@given(problems())
def test_beam_topk_matches_brute_force_when_certified(p):
    rng = np.random.default_rng(p["seed"])
    index = superbloom(p["m"], p["size"], seed=p["seed"] % 7, merge_min=p["merge_min"])
    tokens = [str(t) for t in rng.integers(0, 10**6, p["n"])]  # int-like strings, duplicates
    start = 0
    for b in p["batches"]:  # grow online, querying in between (exercises tail and merges)
        index.add(tokens[start:start + b])
        start += b
        logp = random_logp(rng, p["m"], p["size"], p["ties"])
        top = beam_topk(logp, index, p["k"], p["beam"])
        want_tokens, want_scores = brute(logp, index, p["k"])
        assert len(top.tokens) == len(set(top.tokens)) <= min(p["k"], len(index))
        # Returned scores are the tokens' true scores, best first, whatever the certificate.
        true = dict(zip(*brute(logp, index, len(index))))
        assert [true[t] for t in top.tokens] == top.scores.tolist()
        assert (np.diff(top.scores) <= 0).all()
        if top.exact:
            assert top.tokens == want_tokens
            assert top.scores.tolist() == want_scores.tolist()
        if p["beam"] >= p["size"]:
            assert top.exact  # (it may still stop early: the certificate holds sooner)
        assert 0 <= top.visited <= len(index)


@settings(max_examples=60, deadline=None)
@given(problems())
def test_beam_topk_many_equals_one_at_a_time(p):
    rng = np.random.default_rng(p["seed"])
    index = superbloom(p["m"], p["size"], (str(i) for i in rng.integers(0, 500, p["n"])))
    logp = np.stack([random_logp(rng, p["m"], p["size"], p["ties"]) for _ in range(3)])
    many = beam_topk_many(logp, index, p["k"], p["beam"])
    for row, got in zip(logp, many):
        one = beam_topk(row, index, p["k"], p["beam"])
        assert (got.tokens, got.scores.tolist(), got.exact, got.visited) == \
               (one.tokens, one.scores.tolist(), one.exact, one.visited)


@settings(max_examples=150, deadline=None)
@given(problems(), st.data())
def test_exhaustive_topk_many_is_brute_force_minus_the_excluded(p, data):
    rng = np.random.default_rng(p["seed"])
    index = superbloom(p["m"], p["size"], (str(i) for i in rng.integers(0, 500, p["n"])),
                       merge_min=p["merge_min"])
    logp = np.stack([random_logp(rng, p["m"], p["size"], p["ties"]) for _ in range(4)])
    if p["ties"]:
        logp[0, 0, 0] = -np.inf  # -inf scores are ranked, not confused with excluded ones
    n = len(index)
    exclude = [np.array(data.draw(st.lists(st.integers(-1, n + 2), max_size=8)), dtype=np.int64)
               for _ in range(4)]
    plain = exhaustive_topk_many(logp, index, p["k"])
    masked = exhaustive_topk_many(logp, index, p["k"], exclude)
    for row, excl, got, got_masked in zip(logp, exclude, plain, masked):
        one = exhaustive_topk(row, index, p["k"])
        assert (got.tokens, got.scores.tolist(), got.exact, got.visited) == \
               (one.tokens, one.scores.tolist(), True, n)
        tokens, scores = brute(row, index, n)
        banned = {index.tokens[c] for c in excl if 0 <= c < n}
        keep = [i for i, t in enumerate(tokens) if t not in banned][:p["k"]]
        assert got_masked.tokens == [tokens[i] for i in keep]
        assert got_masked.scores.tolist() == scores[keep].tolist() and got_masked.exact


@settings(max_examples=80, deadline=None)
@given(problems(), st.data())
def test_fresh_candidates_are_the_index_grown_and_barred_before_their_row(p, data):
    """Candidates a batch brings (:class:`Fresh`) rank as if the index held them after its
    own, and a row before a fresh candidate's first row never gets it; ids past the
    index exclude them like any other."""
    rng = np.random.default_rng(p["seed"])
    tokens = [str(i) for i in rng.integers(0, 500, p["n"])]
    index = superbloom(p["m"], p["size"], tokens)
    new = [t for t in dict.fromkeys(str(i) for i in rng.integers(500, 600, 6))]
    grown = superbloom(p["m"], p["size"], [*tokens, *new])
    rows = 5
    logp = np.stack([random_logp(rng, p["m"], p["size"], p["ties"]) for _ in range(rows)])
    since = np.array(data.draw(st.lists(st.integers(0, rows), min_size=len(new), max_size=len(new))))
    n = len(index)
    exclude = [np.array(data.draw(st.lists(st.integers(-1, n + len(new) + 1), max_size=6)), dtype=np.int64)
               for _ in range(rows)]
    got = exhaustive_topk_many(logp, index, p["k"], exclude, Fresh(new, grown.hashes[n:], since))
    for r in range(rows):
        barred = {grown.tokens[c] for c in exclude[r] if 0 <= c < len(grown)}
        barred |= {t for t, s in zip(new, since) if r < s}
        ranked, scores = brute(logp[r], grown, len(grown))
        keep = [i for i, t in enumerate(ranked) if t not in barred][:p["k"]]
        assert got[r].tokens == [ranked[i] for i in keep]
        assert got[r].scores.tolist() == scores[keep].tolist() and got[r].exact


@pytest.mark.parametrize("n", [300, 5_000])  # 5,000: enough candidates for the blocks' bound
def test_candidate_topk_many_is_brute_force_over_many_candidates(n):
    """The k best by (score descending, id ascending) of a brute-force sort, with ties
    across blocks, -inf scores and excluded candidates, where the k-th best is bounded
    by the blocks' maxima (decoding._at_most_kth) and where it is found exactly."""
    rng = np.random.default_rng(n)
    index = superbloom(2, 64, (f"t{i}" for i in range(n)))
    assert len(index) == n
    scores = np.round(rng.standard_normal((6, n)), 1)  # ties everywhere
    scores[1, :] = -np.inf
    scores[1, [7, n - 1]] = [-1.0, 2.0]  # two finite candidates: the rest ties at -inf
    scores[2, n // 2:] = scores[2].max() + 1  # the best all in one half
    exclude = [np.array([], np.int64), np.array([n - 1]), np.arange(n // 2, n // 2 + 5), np.array([-1, n + 3]),
               np.array([], np.int64), np.flatnonzero(scores[5] == scores[5].max())]
    for k in (1, 10, 25):
        got = candidate_topk_many(scores, index, k, exclude)
        for row, excl, top in zip(scores, exclude, got):
            banned = set(excl[(excl >= 0) & (excl < n)].tolist())
            order = [i for i in np.lexsort((np.arange(n), -row)) if i not in banned][:k]
            assert top.tokens == [index.tokens[i] for i in order]
            assert top.scores.tolist() == row[order].tolist() and top.exact


def test_exhaustive_topk_many_bad_input_is_a_clear_error():
    index = superbloom(2, 8, ["a", "b"])
    with pytest.raises(DecodingError, match="expected \\(N, m, size\\)"):
        exhaustive_topk_many(np.zeros((2, 8)), index, 1)
    with pytest.raises(DecodingError, match="one id array per position"):
        exhaustive_topk_many(np.zeros((3, 2, 8)), index, 1, exclude=[np.array([0])])
    with pytest.raises(DecodingError, match="NaN"):
        exhaustive_topk_many(np.full((1, 2, 8), np.nan), index, 1)


def test_ids_are_candidate_positions_and_minus_one_when_absent():
    index = superbloom(2, 8, ["a", 7, "b"])
    assert index.ids(["b", 7, "zz", "a"]).tolist() == [2, 1, -1, 0]
    assert index.ids([]).dtype == np.int64 and index.ids([]).shape == (0,)


def test_peaked_distribution_certifies_early_on_a_large_index():
    rng = np.random.default_rng(0)
    m, size = 2, 1000
    index = superbloom(m, size, (f"item:{i}" for i in range(20_000)))
    target = index.hashes[1234]
    logits = rng.normal(0, 1, (m, size))
    logits[np.arange(m), target] += 8.0  # a confident model
    top = beam_topk(log_softmax(logits), index, k=5, beam=50)
    assert top.exact and top.tokens[0] == "item:1234"
    assert top.tokens == exhaustive_topk(log_softmax(logits), index, 5).tokens
    assert top.visited < len(index) // 10  # the point of the certificate


def test_merged_inverse_map_lists_every_bucket_exactly():
    rng = np.random.default_rng(1)
    m, size = 3, 64
    index = superbloom(m, size)
    for chunk in range(4):  # 4 x 3000 > merge threshold: merges happen between queries
        index.add([f"t{i}" for i in rng.integers(0, 10**7, 3000)])
        view = index.view()
        merged = len(index) - len(view.tail_keys)
        for g in rng.integers(0, m * size, 20):
            members = view.members[view.indptr[g]:view.indptr[g + 1]]
            j, h = divmod(int(g), size)
            np.testing.assert_array_equal(members, np.flatnonzero(index.hashes[:merged, j] == h))
    assert len(view.tail_keys) < len(index)  # at least one merge happened
    logp = random_logp(rng, m, size, ties=False)
    assert beam_topk(logp, index, 7, beam=size).tokens == exhaustive_topk(logp, index, 7).tokens


def test_torch_input_and_float32():
    rng = np.random.default_rng(2)
    index = superbloom(2, 16, map(str, range(40)))
    logp = torch.log_softmax(torch.tensor(rng.normal(size=(2, 16)), dtype=torch.float32), -1)
    top = beam_topk(logp, index, 3, 16)
    assert top.tokens == brute(logp.numpy().astype(np.float64), index, 3)[0]
    many = beam_topk_many(logp[None].expand(2, 2, 16), index, 3, 16)
    assert [t.tokens for t in many] == [top.tokens, top.tokens]


def test_fewer_candidates_than_k_and_empty_index():
    empty = superbloom(2, 8)
    top = beam_topk(np.log(np.full((2, 8), 1 / 8)), empty, 3, 2)
    assert top == TopK([], top.scores, True, 0) and top.scores.shape == (0,)
    index = superbloom(2, 8, ["p", "q"])
    top = beam_topk(np.log(np.full((2, 8), 1 / 8)), index, 5, 8)
    assert sorted(top.tokens) == ["p", "q"] and top.exact


@pytest.mark.parametrize("logp, k, beam, match", [
    (np.zeros((3, 8)), 1, 1, "shape"),
    (np.zeros((2, 7)), 1, 1, "shape"),
    (np.full((2, 8), np.nan), 1, 1, "NaN"),
    (np.full((2, 8), np.inf), 1, 1, "NaN or \\+inf"),
    (np.zeros((2, 8)), 0, 1, "k and beam"),
    (np.zeros((2, 8)), 1, 0, "k and beam"),
    (np.zeros((2, 8)), 1.5, 1, "k and beam"),
    (np.zeros((4, 2, 8)), 1, 1, "beam_topk_many"),
    (np.zeros((2, 8)), None, 1, "k and beam"),
    (np.zeros((2, 8)), True, 1, "k and beam"),
    ([["x"] * 8] * 2, 1, 1, "numeric"),
])
def test_bad_beam_input_is_a_clear_error(logp, k, beam, match):
    with pytest.raises(DecodingError, match=match):
        beam_topk(logp, superbloom(2, 8, ["a"]), k, beam)


def test_minus_inf_log_probs_are_fine():
    index = superbloom(2, 8, map(str, range(30)))
    with np.errstate(divide="ignore"):  # -inf everywhere but one bucket of list 0
        logp = np.log(np.r_[[np.eye(8)[0]], [np.full(8, 1 / 8)]])
    top = beam_topk(logp, index, 2, 8)
    assert top.exact and top.tokens == brute(logp, index, 2)[0]


# ---------------------------------------------------------------------------- candidate index

def test_add_skips_duplicates_and_canonicalises_ints():
    index = superbloom(2, 100)
    assert index.add(["a", "b", "a", "42"]) == 3
    assert index.add([42, "b", "c"]) == 1
    assert index.tokens == ["a", "b", "42", "c"] and len(index) == 4
    assert 42 in index and "42" in index and "zz" not in index and 4.2 not in index
    np.testing.assert_array_equal(index.hashes, multi_hash(["a", "b", "42", "c"], 2, 100, 0, "out"))


def test_checkpoint_round_trip_restores_identical_index():
    rng = np.random.default_rng(3)
    live = superbloom(3, 50, merge_min=5)
    saved, mark = [], live.mark
    for _ in range(4):  # one "checkpoint" per batch: only the new tokens are stored
        live.add([str(t) for t in rng.integers(0, 300, 40)])
        saved.append(live.new_since(mark))
        mark = live.mark
    restored = superbloom(3, 50)
    for chunk in saved:
        restored.extend(chunk)
    assert restored.tokens == live.tokens
    np.testing.assert_array_equal(restored.hashes, live.hashes)
    logp = random_logp(rng, 3, 50, ties=True)
    a, b = beam_topk(logp, live, 9, 5), beam_topk(logp, restored, 9, 5)
    assert (a.tokens, a.scores.tolist(), a.exact) == (b.tokens, b.scores.tolist(), b.exact)
    assert live.new_since(live.mark) == []


def test_extend_is_strict_and_add_validates():
    index = superbloom(2, 10, ["a"])
    with pytest.raises(DecodingError, match="already in the index"):
        index.extend(["b", "a"])
    with pytest.raises(DecodingError, match="already in the index"):
        index.extend(["c", "c"])
    with pytest.raises(DecodingError, match="single string"):
        index.add("abc")
    with pytest.raises(DecodingError, match="str or int"):
        index.add(["ok", 1.5])
    with pytest.raises(DecodingError, match="str or int"):
        index.add([True])
    with pytest.raises(DecodingError, match="mark"):
        index.new_since(5)
    assert index.tokens == ["a"]  # nothing half-added
    assert issubclass(DecodingError, StreamlearnError)


@pytest.mark.parametrize("bad, match", [
    (lambda toks: np.zeros((len(toks), 3), np.int64), "expected int"),
    (lambda toks: np.zeros((len(toks), 2), np.float64), "expected int"),
    (lambda toks: np.full((len(toks), 2), 10, np.int64), "outside"),
])
def test_bad_hasher_output_is_rejected_without_adding(bad, match):
    index = CandidateIndex(2, 10, bad)
    with pytest.raises(DecodingError, match=match):
        index.add(["x"])
    assert len(index) == 0 and "x" not in index


def test_concurrent_add_and_query_stay_consistent():
    index = superbloom(2, 32, merge_min=16)
    rng = np.random.default_rng(4)
    logp = random_logp(rng, 2, 32, ties=False)
    errors = []

    def writer():
        for i in range(200):
            index.add([f"w{i}-{j}" for j in range(10)])

    def reader():
        try:
            for _ in range(200):
                top = beam_topk(logp, index, 5, 32)
                assert top.exact and len(set(top.tokens)) == len(top.tokens)
                # Scores must belong to the returned tokens: a torn view would mix them up.
                H = multi_hash(top.tokens, 2, 32, 0, "out")
                assert (logp[0, H[:, 0]] + logp[1, H[:, 1]]).tolist() == top.scores.tolist()
        except Exception as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=f) for f in (writer, writer, reader)]  # writers overlap
    [t.start() for t in threads]
    [t.join() for t in threads]
    assert not errors
    assert len(index) == len(set(index.tokens)) == 2000
    assert beam_topk(logp, index, 5, 32).tokens == brute(logp, index, 5)[0]


# ---------------------------------------------------------------------------- T-Free

def own_logits(word, m, v, seed, strength=6.0):
    """The noiseless head output for ``word``: its rows on, all others off."""
    ids, _ = tfree_hashes([word], m, v, seed)
    logits = np.full(v, -strength)
    logits[ids] = strength
    return logits


words_st = st.lists(st.text("abcdefghij", min_size=1, max_size=9), min_size=1, max_size=40, unique=True)


@settings(max_examples=80, deadline=None)
@given(words_st, st.integers(1, 3), st.integers(0, 1000))
def test_tfree_recovers_each_word_from_its_own_pattern(words, m, seed):
    v = 4096
    index = PatternIndex.tfree(m, v, seed)
    index.add(words)
    patterns = [tuple(index.pattern(w)) for w in words]
    for w, pat in zip(words, patterns):
        logits = own_logits(w, m, v, seed)
        top = tfree_topk(logits, index, k=1)
        if patterns.count(pat) == 1:  # identical patterns (a full collision) tie by order
            assert top.tokens == [w]
        probs = tfree_topk((logits > 0).astype(float), index, k=1, kind="probs")
        assert probs.tokens == top.tokens and top.exact and top.visited == len(words)
        paper = tfree_topk(logits, index, k=len(words), rule="paper")
        if not any(set(pat) < set(q) for q in patterns):  # a superset pattern beats w there
            assert paper.scores[paper.tokens.index(w)] == paper.scores[0]  # w is among the best


def test_bce_rule_is_not_fooled_by_a_superset_pattern_but_the_paper_rule_is():
    table = {"a": [0, 1], "ab": [0, 1, 2], "dup": [3, 3, 4]}

    def hasher(toks):
        ids = [table[t] for t in toks]
        return np.array(sum(ids, []), np.int64), np.cumsum([0] + [len(i) for i in ids])

    index = PatternIndex(8, hasher)
    index.add(["ab", "a", "dup"])
    np.testing.assert_array_equal(index.pattern("dup"), [3, 4])  # repeated rows count once
    logits = np.where(np.isin(np.arange(8), [0, 1]), 5.0, -5.0)  # "a" exactly
    bce = tfree_topk(logits, index, k=3)
    assert bce.tokens[0] == "a"
    np.testing.assert_allclose(bce.scores, [10.0, 5.0, -10.0])  # a; ab = 5 + 5 - 5; dup
    paper = tfree_topk(logits, index, k=3, rule="paper")
    assert paper.tokens[0] == "ab"  # the longer word collects one more (small) activation
    np.testing.assert_allclose(paper.scores.sum(), 1.0)


def test_tfree_bad_input_is_a_clear_error():
    index = PatternIndex.tfree(2, 64, 0)
    index.add(["hello"])
    with pytest.raises(DecodingError, match="shape"):
        tfree_topk(np.zeros(63), index, 1)
    with pytest.raises(DecodingError, match="not in the index"):
        index.pattern("absent")
    with pytest.raises(DecodingError, match="outside \\[0, 1\\]"):
        tfree_topk(np.full(64, 2.0), index, 1, kind="probs")
    with pytest.raises(DecodingError, match="rule"):
        tfree_topk(np.zeros(64), index, 1, rule="max")
    with pytest.raises(DecodingError, match="kind"):
        tfree_topk(np.zeros(64), index, 1, kind="softmax")
    bad = PatternIndex(64, lambda toks: (np.array([1, 2]), np.array([0, 1])))
    with pytest.raises(DecodingError, match="CSR"):
        bad.add(["x", "y"])
    assert len(bad) == 0


def test_tfree_index_round_trip_and_torch_input():
    live = PatternIndex.tfree(2, 512, 7)
    live.add(["Hello", "world", "hello"])  # case-distinct tokens, same (lowercased) pattern
    restored = PatternIndex.tfree(2, 512, 7)
    restored.extend(live.new_since(0))
    assert restored.tokens == live.tokens == ["Hello", "world", "hello"]
    logits = torch.tensor(own_logits("world", 2, 512, 7))
    assert tfree_topk(logits, restored, 2).tokens[0] == "world"
    # Same pattern: the tie breaks by candidate order.
    assert tfree_topk(own_logits("hello", 2, 512, 7), restored, 2).tokens == ["Hello", "hello"]


def test_pattern_index_built_in_several_adds_equals_one_add():
    """Regression: the used length of the pattern buffer is offsets[n], not offsets[-1]
    (the buffer has spare capacity), so a second add() must not corrupt patterns."""
    words = ["apple", "pear", "plum", "fig", "kiwi", "lime"]
    one = PatternIndex.tfree(2, 4096, 0)
    one.add(words)
    several = PatternIndex.tfree(2, 4096, 0)
    for chunk in (words[:2], words[2:3], words[3:]):
        several.add(chunk)
    for w in words:
        assert several.pattern(w).tolist() == one.pattern(w).tolist()
