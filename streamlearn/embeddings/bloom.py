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
>>> feats = emb.featurize([["item:1", "item:2"]], max_len=8)
>>> feats["ids"].shape
(1, 2, 3)
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ..hashing import multi_hash
from .base import (
    Feats, TensorFeats, TokenEmbedding, flatten_batch, guard_tokens, normal_table,
    gather_valid, pad, scatter_valid, unique_rows, valid_index,
)
from .hash import E_STD

__all__ = ["BloomEmbedding", "BloomEmbeddingConfig"]


@dataclass(frozen=True)
class BloomEmbeddingConfig:
    """B rows of width d; m hash functions per id (the paper uses m = 2)."""

    B: int = 100_000
    d: int = 64
    m: int = 2
    seed: int = 0


class BloomEmbedding(TokenEmbedding):
    """Features: ``ids`` int64 (N, T, m) in [0, B)."""

    def __init__(self, cfg: BloomEmbeddingConfig):
        super().__init__()
        self.cfg = cfg
        self.out_dim = cfg.d
        self.E = normal_table(cfg.B, cfg.d, 0.0, E_STD, cfg.seed, "E")  # (B, d)

    def hash_ids(self, tokens: Sequence[str]) -> np.ndarray:
        """The Bloom digest (M, m) of each token. A hashed output layer that ties its
        weights to E (identical input and output hashes, Superbloom section 2.3) must
        use this same function."""
        return guard_tokens(multi_hash, tokens, self.cfg.m, self.cfg.B, self.cfg.seed, "bloom")

    def featurize(self, token_lists, max_len: int) -> Feats:
        flat, mask = flatten_batch(token_lists, max_len)
        return {"mask": mask, "ids": pad(self.hash_ids(flat), mask)}

    def forward(self, feats: TensorFeats) -> torch.Tensor:
        mask = feats["mask"]  # (N, T)
        index = valid_index(mask)  # (M,)
        ids = gather_valid(feats["ids"], index)  # (M, m)
        e = F.embedding_bag(ids, self.E, mode="sum", sparse=True)  # (M, d)
        return scatter_valid(e, index, mask)  # (N, T, d)

    def row_tables(self) -> dict[str, nn.Parameter]:
        return {"E": self.E}

    def rows_touched(self, feats: Feats) -> dict[str, np.ndarray]:
        return {"E": unique_rows(feats["ids"][feats["mask"]])}
