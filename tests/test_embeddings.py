"""Embedding schemes: shapes, parameter counts, the papers' special cases, sparse rows,
padding, and tiny hand-checked tensors."""
import numpy as np
import pytest
import torch
from torch import nn

from streamlearn.config import EmbeddingConfig
from streamlearn.embeddings import (
    HashEmbedding, HashEmbeddingConfig, HashingTrickConfig, HashingTrickEmbedding,
    build_embedding, to_tensors,
)
from streamlearn.exceptions import ConfigError, RecordError
from streamlearn.hashing import TokenHasher

BATCH = [["the", "cat", "sat"], [], ["on", "the", "mat", "again", "and", "again"]]


def n_params(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def run(emb, token_lists, max_len=16):
    feats = emb.featurize(token_lists, max_len)
    return feats, emb(to_tensors(feats))


def sparse_rows(param: nn.Parameter) -> list[int]:
    assert param.grad.is_sparse
    return param.grad.coalesce().indices()[0].tolist()


# ---------------------------------------------------------------------------- featurize contract

def test_mask_is_truncated_and_padded():
    emb = HashEmbedding(HashEmbeddingConfig(K=100, B=10, d=4))
    feats = emb.featurize(BATCH, max_len=4)
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
    a, b = emb.featurize([[42, 7]], 4), emb.featurize([["42", "7"]], 4)
    assert np.array_equal(a["d1"], b["d1"]) and np.array_equal(a["buckets"], b["buckets"])


@pytest.mark.parametrize("bad", ["a string", None, 5])
def test_a_list_that_is_not_a_token_list_is_a_record_error(bad):
    emb = HashEmbedding(HashEmbeddingConfig(K=100, B=10, d=4))
    with pytest.raises(RecordError, match="token list 1"):
        emb.featurize([["ok"], bad], 4)


def test_a_token_of_the_wrong_type_is_a_record_error():
    emb = HashEmbedding(HashEmbeddingConfig(K=100, B=10, d=4))
    with pytest.raises(RecordError, match="str or int"):
        emb.featurize([["ok", 1.5]], 4)


def test_max_len_below_one_is_a_config_error():
    emb = HashEmbedding(HashEmbeddingConfig(K=100, B=10, d=4))
    with pytest.raises(ConfigError, match="max_len"):
        emb.featurize([["a"]], 0)


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
    touched = emb.rows_touched(feats)
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
    with pytest.raises(ConfigError, match=f"embedding.{key}"):
        HashEmbeddingConfig(**bad)


def test_hash_featurize_matches_token_hasher():
    emb = HashEmbedding(HashEmbeddingConfig(K=1000, B=50, d=2, k=2, seed=9))
    feats = emb.featurize([["x", "y"], ["z"]], 4)
    d1, buckets = TokenHasher(K=1000, B=50, k=2, seed=9)(["x", "y", "z"])
    assert np.array_equal(feats["d1"][feats["mask"]], d1)
    assert np.array_equal(feats["buckets"][feats["mask"]], buckets)


# ---------------------------------------------------------------------------- hashing trick

def test_hashing_trick_parameter_count_and_rows():
    emb = HashingTrickEmbedding(HashingTrickConfig(B=64, d=6))
    assert n_params(emb) == 64 * 6
    feats, out = run(emb, BATCH)
    out.sum().backward()
    assert sparse_rows(emb.E) == emb.rows_touched(feats)["E"].tolist()


# ---------------------------------------------------------------------------- build_embedding

def test_build_embedding_maps_the_flat_config():
    cfg = EmbeddingConfig(scheme="hash", d=6, K=300, B=30, k=3, append_p=True, combine="concat", init="mean")
    emb = build_embedding(cfg, seed=4)
    assert emb.cfg == HashEmbeddingConfig(K=300, B=30, d=6, k=3, append_p=True, combine="concat",
                                          init="mean", seed=4)
    trick = build_embedding(EmbeddingConfig(scheme="hashing-trick", d=6, B=30), seed=4)
    assert trick.cfg == HashingTrickConfig(B=30, d=6, seed=4)


def test_build_embedding_rejects_unknown_schemes():
    with pytest.raises(ConfigError, match="embedding.scheme"):
        build_embedding(EmbeddingConfig(scheme="nope"), seed=0)
