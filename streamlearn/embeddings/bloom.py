"""Superbloom's Bloom-digest input layer (Superbloom, section 2.1).

Each id s is hashed by m functions into B rows of one table E (B x d); its vector is
the sum of those m rows:

    e_s = sum_j E[h_j(s)]                      (width d, B*d parameters)

Superbloom feeds the m rows as m separate, position-free inputs to the transformer. We
sum them instead, for three reasons: the model contract is one vector per token, so a
sum keeps the width d whatever m is and the sequence length n (not m*n, which would
multiply attention cost by m^2); the paper treats the digest as an unordered set (no
position embeddings), and a sum is the order-free pooling of a set; and a sum of m
random rows still identifies a token unless all m hashes collide (the Bloom property).

>>> emb = BloomEmbedding(BloomEmbeddingConfig(B=50, d=4, m=3))
>>> feats = emb.featurizer.featurize([["item:1", "item:2"]], max_len=8)
>>> feats["ids"].shape
(1, 2, 3)
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..featurize import BloomEmbeddingConfig
from .base import OneTableEmbedding, TensorFeats, gather_valid, scatter_valid, valid_index

__all__ = ["BloomEmbedding", "BloomEmbeddingConfig"]


class BloomEmbedding(OneTableEmbedding):
    """Features: ``ids`` int64 (N, T, m) in [0, B)."""

    def __init__(self, cfg: BloomEmbeddingConfig):
        super().__init__(cfg, cfg.B)

    def forward(self, feats: TensorFeats) -> torch.Tensor:
        mask = feats["mask"]  # (N, T)
        index = valid_index(mask)  # (M,)
        ids = gather_valid(feats["ids"], index)  # (M, m)
        e = F.embedding_bag(ids, self.E, mode="sum", sparse=True)  # (M, d)
        return scatter_valid(e, index, mask)  # (N, T, d)
