"""Every contract check in streamlearn.checks, over every embedding scheme."""
import pytest
import torch
import torch.nn.functional as F

from streamlearn import checks
from streamlearn.checks import yield_checks
from streamlearn.config import SCHEMES, EmbeddingConfig
from streamlearn.featurize import HashFeaturizer
from streamlearn.embeddings import (
    HashEmbedding, HashEmbeddingConfig, PlainEmbedding, PlainEmbeddingConfig, build_embedding,
)

SMALL = dict(d=6, K=1000, B=97, k=2, m=2, hashformer_bits=32, hashformer_pool_bits=4,
             tfree_rows=211, plain_vocab=12)
CASES = {scheme: EmbeddingConfig(scheme=scheme, **SMALL) for scheme in SCHEMES}
CASES["hash+concat+p+mean"] = EmbeddingConfig(scheme="hash", combine="concat", append_p=True, init="mean", **SMALL)
CASES["hashformer-pool+lsh"] = EmbeddingConfig(scheme="hashformer-pool", hashformer_hash="lsh", **SMALL)
CASES["hashformer-add+xxh3"] = EmbeddingConfig(scheme="hashformer-add", hashformer_hash="xxh3", **SMALL)
CASES["hashformer-proj+lsh"] = EmbeddingConfig(scheme="hashformer-proj", hashformer_hash="lsh", **SMALL)
CASES["plain+full"] = EmbeddingConfig(scheme="plain", **dict(SMALL, plain_vocab=3))  # OOV in use


@pytest.mark.parametrize("check", list(yield_checks()), ids=lambda c: c.__name__.removeprefix("check_"))
@pytest.mark.parametrize("case", sorted(CASES))
def test_embedding_contract(case, check):
    check(lambda: build_embedding(CASES[case], seed=7)[1])


def test_every_scheme_is_covered():
    assert set(SCHEMES) <= set(CASES)


# ---------------------------------------------------------------------------- the checks can fail
# Each check must reject a module that breaks exactly its contract.

CFG = HashEmbeddingConfig(K=1000, B=97, d=6, k=2, seed=7)


class ReadsPadding(HashEmbedding):
    """Looks up every cell and masks afterwards: zero output, but padding rows get gradient."""

    def forward(self, feats):
        p = F.embedding(feats["d1"], self.P, sparse=True)
        c = F.embedding(feats["buckets"], self.E, sparse=True)
        return (p.unsqueeze(-1) * c).sum(-2) * feats["mask"].unsqueeze(-1)


class NonZeroPadding(HashEmbedding):
    def forward(self, feats):
        return super().forward(feats) + 1.0


class Unseeded(HashEmbedding):
    def __init__(self, cfg):
        super().__init__(cfg)
        with torch.no_grad():
            self.E.normal_()


class SortingFeaturizer(HashFeaturizer):
    def featurize(self, token_lists, max_len, grow=True):
        for tokens in token_lists:
            if isinstance(tokens, list):
                tokens.sort(key=str)
        return super().featurize(token_lists, max_len, grow)


class MutatesInput(HashEmbedding):
    def __init__(self, cfg):
        super().__init__(cfg)
        self.featurizer = SortingFeaturizer(cfg)


class ForgetsDictionary(PlainEmbedding):
    def get_extra_state(self):
        return torch.zeros(0, dtype=torch.int64)


class BatchNormalised(HashEmbedding):
    def forward(self, feats):
        out = super().forward(feats)
        return out - out.mean(0, keepdim=True) * feats["mask"].unsqueeze(-1)


class DenseGradients(HashEmbedding):
    def forward(self, feats):
        mask = feats["mask"]
        p = F.embedding(feats["d1"][mask], self.P)
        c = F.embedding(feats["buckets"][mask], self.E)
        out = (p.unsqueeze(-1) * c).sum(1)
        return out.new_zeros(mask.shape + (self.out_dim,)).index_put((mask,), out)


class IntPrefixFeaturizer(HashFeaturizer):
    def featurize(self, token_lists, max_len, grow=True):
        return super().featurize([[f"int:{t}" if isinstance(t, int) else t for t in ts]
                                  for ts in token_lists], max_len, grow)


class IntsDiffer(HashEmbedding):
    def __init__(self, cfg):
        super().__init__(cfg)
        self.featurizer = IntPrefixFeaturizer(cfg)


class TorchFeaturizer(HashFeaturizer):
    """Hashes with a lookup tensor: ingest would need torch."""

    def __init__(self, cfg):
        super().__init__(cfg)
        self.offsets = torch.zeros(1, dtype=torch.int64)


class HoldsTorch(HashEmbedding):
    def __init__(self, cfg):
        super().__init__(cfg)
        self.featurizer = TorchFeaturizer(cfg)


BROKEN = [
    pytest.param(make, check, id=f"{name}-{check.__name__}") for name, make, check in [
        ("reads-padding", lambda: ReadsPadding(CFG), checks.check_rows_touched_equal_sparse_gradients),
        ("nonzero-padding", lambda: NonZeroPadding(CFG), checks.check_padding_is_zero_and_gets_no_gradient),
        ("unseeded", lambda: Unseeded(CFG), checks.check_same_seed_same_output),
        ("mutates-input", lambda: MutatesInput(CFG), checks.check_input_not_mutated),
        ("forgets-dictionary", lambda: ForgetsDictionary(PlainEmbeddingConfig(vocab=50, d=4)),
         checks.check_state_dict_round_trip),
        ("batch-normalised", lambda: BatchNormalised(CFG), checks.check_batch_order_independence),
        ("dense-gradients", lambda: DenseGradients(CFG), checks.check_rows_touched_equal_sparse_gradients),
        ("ints-differ", lambda: IntsDiffer(CFG), checks.check_unseen_tokens_work),
        ("holds-torch", lambda: HoldsTorch(CFG), checks.check_featurizer_is_pure),
    ]
]


@pytest.mark.parametrize("make,check", BROKEN)
def test_each_check_catches_a_broken_scheme(make, check):
    with pytest.raises(AssertionError):
        check(make)
