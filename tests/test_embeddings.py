"""Embedding schemes: shapes, parameter counts, the papers' special cases, sparse rows,
padding, and tiny hand-checked tensors."""
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from streamlearn.config import SCHEMES, EmbeddingConfig
from streamlearn.embeddings import (
    BloomEmbedding, BloomEmbeddingConfig, HashEmbedding, HashEmbeddingConfig, HashFormerConfig,
    HashFormerEmbedding, HashingTrickConfig, HashingTrickEmbedding, PlainEmbedding, PlainEmbeddingConfig,
    TFreeEmbedding, TFreeEmbeddingConfig, build_embedding, to_tensors,
)
from streamlearn.featurize import build_featurizer, pad
from streamlearn.embeddings.hashformer import char_ngrams, lsh_bits
from streamlearn.exceptions import ConfigError, RecordError, StreamlearnError
from streamlearn.hashing import TokenHasher, derive_seed, hash64, multi_hash, token_bits

BATCH = [["the", "cat", "sat"], [], ["on", "the", "mat", "again", "and", "again"]]


def n_params(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def run(emb, token_lists, max_len=16):
    feats = emb.featurizer.featurize(token_lists, max_len)
    return feats, emb(to_tensors(feats))


def sparse_rows(param: nn.Parameter) -> list[int]:
    assert param.grad.is_sparse
    return param.grad.coalesce().indices()[0].tolist()


# ---------------------------------------------------------------------------- featurize contract

def test_mask_is_truncated_and_padded():
    emb = HashEmbedding(HashEmbeddingConfig(K=100, B=10, d=4))
    feats = emb.featurizer.featurize(BATCH, max_len=4)
    assert feats["mask"].dtype == np.bool_
    assert feats["mask"].astype(int).tolist() == [[1, 1, 1, 0], [0, 0, 0, 0], [1, 1, 1, 1]]
    assert feats["d1"].shape == (3, 4) and feats["buckets"].shape == (3, 4, 2)
    assert feats["d1"].dtype == np.int64


def test_T_is_at_least_one_and_empty_batches_work():
    emb = HashEmbedding(HashEmbeddingConfig(K=100, B=10, d=4))
    feats, out = run(emb, [[], []])
    assert feats["mask"].shape == (2, 1) and not feats["mask"].any()
    assert out.shape == (2, 1, 4) and torch.count_nonzero(out) == 0
    _, out = run(emb, [])
    assert out.shape == (0, 1, 4)


def test_truncation_keeps_the_first_tokens():
    emb = HashEmbedding(HashEmbeddingConfig(K=100, B=10, d=4))
    _, full = run(emb, [["a", "b", "c", "d"]])
    _, cut = run(emb, [["a", "b", "c", "d"]], max_len=2)
    assert torch.equal(cut[0], full[0, :2])


def test_int_and_str_ids_are_the_same_token():
    emb = HashEmbedding(HashEmbeddingConfig(K=100, B=10, d=4))
    a, b = emb.featurizer.featurize([[42, 7]], 4), emb.featurizer.featurize([["42", "7"]], 4)
    assert np.array_equal(a["d1"], b["d1"]) and np.array_equal(a["buckets"], b["buckets"])


@pytest.mark.parametrize("bad", ["a string", None, 5])
def test_a_list_that_is_not_a_token_list_is_a_record_error(bad):
    emb = HashEmbedding(HashEmbeddingConfig(K=100, B=10, d=4))
    with pytest.raises(RecordError, match="token list 1"):
        emb.featurizer.featurize([["ok"], bad], 4)


def test_a_token_of_the_wrong_type_is_a_record_error():
    emb = HashEmbedding(HashEmbeddingConfig(K=100, B=10, d=4))
    with pytest.raises(RecordError, match="str or int"):
        emb.featurizer.featurize([["ok", 1.5]], 4)


def test_max_len_below_one_is_a_config_error():
    emb = HashEmbedding(HashEmbeddingConfig(K=100, B=10, d=4))
    with pytest.raises(ConfigError, match="max_len"):
        emb.featurizer.featurize([["a"]], 0)


# ---------------------------------------------------------------------------- hash embeddings

@pytest.mark.parametrize("K,B,d,k", [(1000, 100, 8, 2), (50, 7, 3, 3), (10, 10, 1, 1)])
def test_hash_parameter_count_is_B_d_plus_K_k(K, B, d, k):
    emb = HashEmbedding(HashEmbeddingConfig(K=K, B=B, d=d, k=k))
    assert n_params(emb) == B * d + K * k
    assert emb.E.shape == (B, d) and emb.P.shape == (K, k)


@pytest.mark.parametrize("combine,append_p,width", [
    ("sum", False, 8), ("sum", True, 8 + 3), ("concat", False, 3 * 8), ("concat", True, 3 * 8 + 3),
])
def test_hash_output_width(combine, append_p, width):
    emb = HashEmbedding(HashEmbeddingConfig(K=100, B=10, d=8, k=3, combine=combine, append_p=append_p))
    _, out = run(emb, BATCH)
    assert emb.out_dim == width and out.shape == (3, 6, width)


def _hand_module(**kw) -> HashEmbedding:
    emb = HashEmbedding(HashEmbeddingConfig(K=2, B=3, d=2, k=2, **kw))
    with torch.no_grad():
        emb.E.copy_(torch.tensor([[1.0, 0.0], [0.0, 1.0], [2.0, 2.0]]))
        emb.P.copy_(torch.tensor([[1.0, -1.0], [0.5, 2.0]]))
    return emb


def _hand_feats():
    # one record, two tokens: w0 -> P[1], E[0], E[2]; w1 -> P[0], E[1], E[1]; then padding
    return to_tensors({
        "mask": np.array([[True, True, False]]),
        "d1": np.array([[1, 0, 0]]),
        "buckets": np.array([[[0, 2], [1, 1], [0, 0]]]),
    })


def test_hash_sum_by_hand():
    out = _hand_module()(_hand_feats())
    # w0: 0.5*[1,0] + 2*[2,2] = [4.5, 4]; w1: 1*[0,1] - 1*[0,1] = [0, 0]
    assert out.tolist() == [[[4.5, 4.0], [0.0, 0.0], [0.0, 0.0]]]


def test_hash_concat_and_append_p_by_hand():
    out = _hand_module(combine="concat", append_p=True)(_hand_feats())
    assert out[0, 0].tolist() == [0.5, 0.0, 4.0, 4.0, 0.5, 2.0]
    assert out[0, 1].tolist() == [0.0, 1.0, 0.0, -1.0, 1.0, -1.0]
    assert out[0, 2].tolist() == [0.0] * 6


def test_hash_gradients_by_hand():
    emb = _hand_module()
    emb(_hand_feats()).sum().backward()
    # d/dE[0] = p0 = 0.5, d/dE[2] = 2 (w0); d/dE[1] = 1 - 1 = 0 (w1), present but zero
    E_grad = emb.E.grad.coalesce()
    assert E_grad.indices()[0].tolist() == [0, 1, 2]
    assert E_grad.values().tolist() == [[0.5, 0.5], [0.0, 0.0], [2.0, 2.0]]
    # d/dp = E row sums: w0 -> [1, 4]; w1 -> [1, 1]
    P_grad = emb.P.grad.coalesce()
    assert P_grad.indices()[0].tolist() == [0, 1]
    assert P_grad.values().tolist() == [[1.0, 1.0], [1.0, 4.0]]


def test_k1_with_p_fixed_at_1_is_the_hashing_trick():
    """Svenstrup et al. section 3: k = 1, p = 1 gives feature hashing, same hash."""
    hashed = HashEmbedding(HashEmbeddingConfig(K=1000, B=37, d=5, k=1, seed=3))
    trick = HashingTrickEmbedding(HashingTrickConfig(B=37, d=5, seed=3))
    with torch.no_grad():
        hashed.P.fill_(1.0)
        trick.E.copy_(hashed.E)
    feats_h, out_h = run(hashed, BATCH)
    feats_t, out_t = run(trick, BATCH)
    assert np.array_equal(feats_h["buckets"][..., 0], feats_t["buckets"])
    assert torch.equal(out_h, out_t)


def test_identity_hashes_with_B_equal_vocab_is_a_standard_embedding():
    """... and with B = |T| and identity hashes, a standard embedding table."""
    V, d = 11, 4
    hashed = HashEmbedding(HashEmbeddingConfig(K=V, B=V, d=d, k=1, seed=1))
    table = nn.Embedding(V, d)
    with torch.no_grad():
        hashed.P.fill_(1.0)
        table.weight.copy_(hashed.E)
    ids = torch.tensor([[3, 0, 10, 3], [7, 1, 2, 9]])
    feats = {"mask": torch.ones_like(ids, dtype=torch.bool), "d1": ids, "buckets": ids.unsqueeze(-1)}
    assert torch.equal(hashed(feats), table(ids))


def test_hash_sparse_gradient_rows_equal_rows_touched():
    emb = HashEmbedding(HashEmbeddingConfig(K=500, B=40, d=3, k=2))
    feats, out = run(emb, BATCH, max_len=4)
    out.pow(2).sum().backward()
    touched = emb.featurizer.rows_touched(feats)
    assert sorted(touched) == sorted(emb.row_tables()) == ["E", "P"]
    for name, param in emb.row_tables().items():
        assert touched[name].dtype == np.int64
        assert sparse_rows(param) == touched[name].tolist()


def test_padding_rows_are_never_read():
    """Junk ids at padding cells must not be looked up (no gradient, no output)."""
    emb = HashEmbedding(HashEmbeddingConfig(K=10, B=10, d=2, k=2))
    feats = {
        "mask": np.array([[True, False]]),
        "d1": np.array([[1, 9]]),
        "buckets": np.array([[[2, 3], [8, 9]]]),
    }
    out = emb(to_tensors(feats))
    out.sum().backward()
    assert torch.count_nonzero(out[0, 1]) == 0
    assert sparse_rows(emb.E) == [2, 3] and sparse_rows(emb.P) == [1]


@pytest.mark.parametrize("init,p_mean", [("paper", 0.0), ("mean", 0.5)])
def test_hash_inits(init, p_mean):
    emb = HashEmbedding(HashEmbeddingConfig(K=20_000, B=10_000, d=10, k=2, init=init))
    assert abs(emb.E.std().item() - 0.1) < 0.005 and abs(emb.E.mean().item()) < 0.005
    assert abs(emb.P.std().item() - 0.0005) < 0.00005 and abs(emb.P.mean().item() - p_mean) < 0.0001


@pytest.mark.parametrize("bad", [{"combine": "max"}, {"init": "xavier"}, {"k": 0}, {"B": -1}])
def test_hash_config_errors_name_the_key(bad):
    key = next(iter(bad))
    with pytest.raises(ConfigError, match=f"embedding.{key}"):  # checked where the key is declared
        EmbeddingConfig(scheme="hash", **bad)


def test_hash_featurize_matches_token_hasher():
    emb = HashEmbedding(HashEmbeddingConfig(K=1000, B=50, d=2, k=2, seed=9))
    feats = emb.featurizer.featurize([["x", "y"], ["z"]], 4)
    d1, buckets = TokenHasher(K=1000, B=50, k=2, seed=9)(["x", "y", "z"])
    assert np.array_equal(feats["d1"][feats["mask"]], d1)
    assert np.array_equal(feats["buckets"][feats["mask"]], buckets)


# ---------------------------------------------------------------------------- hashing trick

def test_hashing_trick_parameter_count_and_rows():
    emb = HashingTrickEmbedding(HashingTrickConfig(B=64, d=6))
    assert n_params(emb) == 64 * 6
    feats, out = run(emb, BATCH)
    out.sum().backward()
    assert sparse_rows(emb.E) == emb.featurizer.rows_touched(feats)["E"].tolist()


# ---------------------------------------------------------------------------- build_embedding

def test_build_embedding_maps_the_flat_config():
    cfg = EmbeddingConfig(scheme="hash", d=6, K=300, B=30, k=3, append_p=True, combine="concat", init="mean")
    _, emb = build_embedding(cfg, seed=4)
    assert emb.cfg == HashEmbeddingConfig(K=300, B=30, d=6, k=3, append_p=True, combine="concat",
                                          init="mean", seed=4)
    _, trick = build_embedding(EmbeddingConfig(scheme="hashing-trick", d=6, B=30), seed=4)
    assert trick.cfg == HashingTrickConfig(B=30, d=6, seed=4)


def test_build_embedding_rejects_unknown_schemes():
    with pytest.raises(ConfigError, match="embedding.scheme"):
        build_embedding(EmbeddingConfig(scheme="nope"), seed=0)


# ---------------------------------------------------------------------------- Bloom (Superbloom)

def test_bloom_parameter_count_and_sum_by_hand():
    emb = BloomEmbedding(BloomEmbeddingConfig(B=4, d=2, m=2))
    assert n_params(emb) == 4 * 2
    with torch.no_grad():
        emb.E.copy_(torch.tensor([[1.0, 0.0], [0.0, 1.0], [3.0, 3.0], [-1.0, 5.0]]))
    feats = to_tensors({"mask": np.array([[True, True, False]]), "ids": np.array([[[0, 2], [1, 1], [3, 3]]])})
    out = emb(feats)
    assert out.tolist() == [[[4.0, 3.0], [0.0, 2.0], [0.0, 0.0]]]
    out.sum().backward()
    assert sparse_rows(emb.E) == [0, 1, 2]  # row 3 sits only under padding
    assert emb.E.grad.coalesce().values().tolist() == [[1.0, 1.0], [2.0, 2.0], [1.0, 1.0]]


def test_bloom_digest_is_multi_hash_and_rows_touched_match_gradients():
    emb = BloomEmbedding(BloomEmbeddingConfig(B=97, d=3, m=3, seed=2))
    feats, out = run(emb, BATCH)
    assert np.array_equal(feats["ids"][feats["mask"]], multi_hash(sum(BATCH, []), 3, 97, 2, "bloom"))
    assert np.array_equal(emb.featurizer.hash_ids(["the", "cat"]), feats["ids"][0, :2])
    out.sum().backward()
    assert sparse_rows(emb.E) == emb.featurizer.rows_touched(feats)["E"].tolist()


# ---------------------------------------------------------------------------- T-Free

HELLO_TRIGRAMS = [  # written by hand: " w " cut into overlapping triples, as a set
    [" he", "hel", "ell", "llo", "lo "],
    [" wo", "wor", "orl", "rld", "ld "],
    [" ! "],
]


def _tfree_bags(feats):
    """Split the flat ids into one sorted list per valid position."""
    counts = feats["counts"][feats["mask"]]
    ends = np.cumsum(counts)
    return [sorted(feats["ids"][e - c:e].tolist()) for c, e in zip(counts, ends)]


def test_tfree_trigrams_of_hello_world_by_hand():
    emb = TFreeEmbedding(TFreeEmbeddingConfig(v=1000, d=2, m=3, seed=4))
    feats = emb.featurizer.featurize([["Hello", "world", "!"]], max_len=8)
    assert feats["counts"].tolist() == [[15, 15, 3]]
    expected = [sorted(multi_hash(grams, 3, 1000, 4, "tfree").reshape(-1).tolist()) for grams in HELLO_TRIGRAMS]
    assert _tfree_bags(feats) == expected


def test_tfree_uses_the_trigram_set_not_the_list():
    emb = TFreeEmbedding(TFreeEmbeddingConfig(v=1000, d=2, m=2))
    feats = emb.featurizer.featurize([["aaaa", ""]], max_len=4)  # " aaaa " has "aaa" twice; "" has none
    assert feats["counts"].tolist() == [[3 * 2, 0]]
    assert _tfree_bags(feats)[0] == sorted(multi_hash([" aa", "aaa", "aa "], 2, 1000, 0, "tfree").reshape(-1).tolist())


def test_tfree_sums_its_rows_and_touches_exactly_them():
    emb = TFreeEmbedding(TFreeEmbeddingConfig(v=50, d=3, m=2))
    assert n_params(emb) == 50 * 3
    feats, out = run(emb, [["Hello", "world", "!"], ["x"]])
    for (n, t), bag in zip(np.argwhere(feats["mask"]), _tfree_bags(feats)):
        assert torch.allclose(out[n, t], emb.E[bag].sum(0), atol=1e-6)
    assert torch.count_nonzero(out[1, 1:]) == 0
    out.sum().backward()
    assert sparse_rows(emb.E) == emb.featurizer.rows_touched(feats)["E"].tolist()


# ---------------------------------------------------------------------------- HashFormers

@pytest.mark.parametrize("variant,count", [
    ("pool", (math.ceil(128 / 10) + 2 ** 10) * 768), ("add", 2 * 128 * 768), ("proj", 128 * 768),
])
def test_hashformer_parameter_counts_are_the_papers_formulas(variant, count):
    emb = HashFormerEmbedding(HashFormerConfig(variant=variant, d=768, bits=128, pool_bits=10))
    assert n_params(emb) == count


def test_hashformer_pool_codewords_follow_the_papers_example():
    emb = HashFormerEmbedding(HashFormerConfig(variant="pool", d=2, bits=12, pool_bits=4))
    tau = np.array([[1, 0, 1, 0, 0, 1, 0, 0, 0, 0, 0, 1]], dtype=np.uint8)
    assert emb.featurizer.codewords(tau).tolist() == [[10, 4, 1]]
    short_last = HashFormerEmbedding(HashFormerConfig(variant="pool", d=2, bits=12, pool_bits=5))
    assert short_last.featurizer.codewords(tau).tolist() == [[0b10100, 0b10000, 0b01]]


def test_hashformer_pool_by_hand():
    emb = HashFormerEmbedding(HashFormerConfig(variant="pool", d=2, bits=4, pool_bits=2))
    with torch.no_grad():
        emb.C.copy_(torch.tensor([[0.0, 0.0], [1.0, 2.0], [3.0, 4.0], [5.0, 6.0]]))
        emb.W.copy_(torch.tensor([[0.0, math.log(3.0)], [0.0, 0.0]]))  # weights [.5,.5] and [.75,.25]
    out = emb(to_tensors({"mask": np.array([[True]]), "codes": np.array([[[1, 3]]])}))
    assert torch.allclose(out[0, 0], torch.tensor([0.5 * 1 + 0.5 * 5, 0.75 * 2 + 0.25 * 6]))


def test_hashformer_add_by_hand():
    emb = HashFormerEmbedding(HashFormerConfig(variant="add", d=1, bits=2))
    with torch.no_grad():
        emb.C.copy_(torch.tensor([[[1.0], [2.0]], [[10.0], [20.0]]]))  # C[j, bit]
    bits = np.array([[[1, 0], [0, 1]]], dtype=np.uint8)
    out = emb(to_tensors({"mask": np.array([[True, True]]), "bits": bits}))
    assert torch.allclose(out[0, :, 0], torch.tensor([2.0 + 10.0, 1.0 + 20.0]) / math.sqrt(2))


def test_hashformer_proj_is_pearson_correlation():
    emb = HashFormerEmbedding(HashFormerConfig(variant="proj", d=3, bits=6, seed=1))
    bits = np.array([[[1, 0, 0, 1, 1, 0], [1, 1, 1, 1, 1, 1]]], dtype=np.uint8)
    out = emb(to_tensors({"mask": np.array([[True, True]]), "bits": bits}))
    W = emb.W.detach().numpy()
    expected = [np.corrcoef(bits[0, 0], W[:, j])[0, 1] for j in range(3)]
    assert np.allclose(out[0, 0].detach().numpy(), expected, atol=1e-6)
    assert torch.count_nonzero(out[0, 1]) == 0  # a constant code correlates with nothing


@pytest.mark.parametrize("method", ["md5", "xxh3"])
def test_hashformer_codes_are_token_bits(method):
    emb = HashFormerEmbedding(HashFormerConfig(variant="add", d=2, bits=128, hash=method, seed=6))
    feats = emb.featurizer.featurize([["play", "plays"]], 4)
    assert feats["bits"].dtype == np.uint8
    assert np.array_equal(feats["bits"][0], token_bits(["play", "plays"], 6, method, 128))


def test_lsh_bits_equal_the_dense_hyperplane_formula():
    """Sign of x . r_j with R[i, j] = eta[(i + j) mod d_x] built densely."""
    eta = np.random.default_rng(0).standard_normal(64).astype(np.float32)
    tokens = ["play", "plays", "a", ""]
    got = lsh_bits(tokens, eta, bits=16, seed=3)
    R = eta[(np.arange(64)[:, None] + np.arange(16)) % 64]  # (d_x, bits)
    for token, row in zip(tokens, got):
        slots = hash64(char_ngrams(token), derive_seed(3, "lsh-ngram")) % np.uint64(64)
        x = np.bincount(slots.astype(np.int64), minlength=64).astype(np.float32)
        assert row.tolist() == (x @ R >= 0).astype(np.uint8).tolist()


def test_lsh_bit_flips_follow_the_angle_between_ngram_vectors():
    """P(bit differs) = angle / pi. "playing" (22 n-grams) and "played" (18) share 10:
    p l a y, pl la ay, pla lay, play; cos = 10 / sqrt(22 * 18), so about 42.5 of 128
    bits differ, against 64 for random (MD5) codes."""
    expected = 128 * math.acos(10 / math.sqrt(22 * 18)) / math.pi

    def mean_flips(method):
        flips = []
        for seed in range(8):
            codes = HashFormerEmbedding(HashFormerConfig(variant="proj", d=2, hash=method, seed=seed)
                                        ).featurizer.token_code(["playing", "played"])
            flips.append(int((codes[0] != codes[1]).sum()))
        return np.mean(flips)

    assert abs(mean_flips("lsh") - expected) < 6
    assert abs(mean_flips("md5") - 64) < 6


def test_hashformers_are_dense():
    emb = HashFormerEmbedding(HashFormerConfig(variant="pool", d=4, bits=16, pool_bits=4))
    feats, out = run(emb, BATCH)
    out.sum().backward()
    assert emb.row_tables() == {} and emb.featurizer.rows_touched(feats) == {}
    assert all(p.grad is not None and not p.grad.is_sparse for p in emb.parameters())


@pytest.mark.parametrize("bad,key", [
    ({"hashformer_hash": "sha1"}, "hashformer_hash"), ({"hashformer_bits": 129}, "hashformer_bits"),
    ({"hashformer_pool_bits": 30}, "hashformer_pool_bits"),
])
def test_hashformer_config_errors(bad, key):
    with pytest.raises(ConfigError, match=key):
        EmbeddingConfig(scheme="hashformer-pool", **bad)
    with pytest.raises(ConfigError, match="hashformer-<variant>"):  # derived from the scheme: checked here
        HashFormerConfig(variant="emb")


# ---------------------------------------------------------------------------- plain dictionary

def test_plain_is_first_come_first_served_with_one_oov_row():
    emb = PlainEmbedding(PlainEmbeddingConfig(vocab=3, d=2))
    assert n_params(emb) == (3 + 1) * 2
    assert emb.featurizer.featurize([["b", "a"], ["b"]], 4)["ids"].tolist() == [[0, 1], [0, 0]]
    assert emb.featurizer.featurize([["c", "d", "a", 7, "7"]], 8)["ids"].tolist() == [[2, 3, 1, 3, 3]]
    assert len(emb.featurizer) == 3


def test_plain_grow_false_only_looks_up():
    emb = PlainEmbedding(PlainEmbeddingConfig(vocab=10, d=2))
    emb.featurizer.featurize([["seen"]], 4)
    assert emb.featurizer.featurize([["new", "seen"]], 4, grow=False)["ids"].tolist() == [[10, 0]]
    assert len(emb.featurizer) == 1


def test_plain_dictionary_matches_a_python_dict_on_a_zipf_stream():
    rng = np.random.default_rng(0)
    batches = [[[str(x) for x in rng.zipf(1.3, 40)] for _ in range(8)] for _ in range(20)]
    emb, ref = PlainEmbedding(PlainEmbeddingConfig(vocab=150, d=2)), {}
    for batch in batches:
        feats = emb.featurizer.featurize(batch, 64)
        for tokens in batch:
            for t in tokens:
                if t not in ref and len(ref) < 150:
                    ref[t] = len(ref)
        expected = pad(np.array([ref.get(t, 150) for tokens in batch for t in tokens]), feats["mask"])
        assert np.array_equal(feats["ids"], expected)


def test_plain_state_from_a_bigger_dictionary_is_refused():
    big = PlainEmbedding(PlainEmbeddingConfig(vocab=5, d=2))
    big.featurizer.featurize([["a", "b", "c"]], 4)
    small = PlainEmbedding(PlainEmbeddingConfig(vocab=2, d=2))
    with pytest.raises(StreamlearnError, match="plain_vocab=2"):
        small.load_state_dict(big.state_dict(), strict=False)


def test_plain_rows_touched_match_gradients():
    emb = PlainEmbedding(PlainEmbeddingConfig(vocab=4, d=2))
    feats, out = run(emb, BATCH)
    out.sum().backward()
    assert sparse_rows(emb.E) == emb.featurizer.rows_touched(feats)["E"].tolist() == [0, 1, 2, 3, 4]


# ---------------------------------------------------------------------------- build_embedding, all schemes

BUILT = {  # scheme: (class, parameter count) for the config below
    "hash": (HashEmbedding, 100 * 8 + 1000 * 2),
    "bloom": (BloomEmbedding, 100 * 8),
    "hashformer-pool": (HashFormerEmbedding, (math.ceil(32 / 4) + 2 ** 4) * 8),
    "hashformer-add": (HashFormerEmbedding, 2 * 32 * 8),
    "hashformer-proj": (HashFormerEmbedding, 32 * 8),
    "tfree": (TFreeEmbedding, 64 * 8),
    "hashing-trick": (HashingTrickEmbedding, 100 * 8),
    "plain": (PlainEmbedding, (20 + 1) * 8),
}


@pytest.mark.parametrize("scheme", SCHEMES)
def test_build_embedding_builds_every_scheme(scheme):
    assert scheme in BUILT, f"give scheme {scheme} its class and parameter count in BUILT"
    cls, count = BUILT[scheme]
    cfg = EmbeddingConfig(scheme=scheme, d=8, K=1000, B=100, k=2, m=2, hashformer_bits=32,
                          hashformer_pool_bits=4, tfree_rows=64, plain_vocab=20)
    featurizer, emb = build_embedding(cfg, seed=0)
    assert type(emb) is cls and n_params(emb) == count and featurizer is emb.featurizer
    _, out = run(emb, BATCH)
    assert out.shape == (3, 6, 8) == (3, 6, emb.out_dim)
    # The torch-free builder gives a featurizer with the same arrays.
    alone = build_featurizer(cfg, seed=0).featurize(BATCH, 16)
    ours = featurizer.featurize(BATCH, 16, grow=False)
    assert sorted(alone) == sorted(ours) and all(np.array_equal(alone[k], ours[k]) for k in ours)


def test_weighted_lookup_matches_embedding_bag_gradients():
    """The custom autograd path equals embedding_bag(per_sample_weights) exactly enough."""
    from streamlearn.embeddings.hash import WeightedLookup

    g = torch.Generator().manual_seed(0)
    E, P = torch.randn(30, 5, generator=g), torch.randn(40, 3, generator=g)
    d1, buckets = torch.randint(0, 40, (17,), generator=g), torch.randint(0, 30, (17, 3), generator=g)
    upstream = torch.randn(17, 5, generator=g)
    ours_E, ours_P = E.clone().requires_grad_(), P.clone().requires_grad_()
    (WeightedLookup.apply(ours_E, ours_P, d1, buckets) * upstream).sum().backward()
    ref_E, ref_P = E.clone().requires_grad_(), P.clone().requires_grad_()
    p = F.embedding(d1, ref_P)
    (F.embedding_bag(buckets, ref_E, per_sample_weights=p, mode="sum") * upstream).sum().backward()
    assert torch.allclose(ours_E.grad.to_dense(), ref_E.grad, atol=1e-5)
    assert torch.allclose(ours_P.grad.to_dense(), ref_P.grad, atol=1e-5)
