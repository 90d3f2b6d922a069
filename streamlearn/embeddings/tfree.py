"""T-Free's trigram embedding (T-Free, "Text Encoding").

A word is padded with one space on each side and cut into its set of character
trigrams; each trigram is hashed by m functions into v rows of E (v x d), and the word's
vector is the sum of all those rows:

    e_w = sum_{g in trigrams(" w ")} sum_j E[h_j(g)]       (width d, v*d parameters)

so words that share spelling share rows ("play", "plays"), and any new word has a
vector. The features are CSR-like because the number of rows per word varies:
``ids`` int64 (L,) lists, for each valid position in row-major order, its trigram
hashes; ``counts`` int64 (N, T) says how many (0 at padding).

>>> emb = TFreeEmbedding(TFreeEmbeddingConfig(v=64, d=4, m=2))
>>> feats = emb.featurizer.featurize([["Hello", "world", "!"]], max_len=8)
>>> feats["counts"].tolist()   # (5 + 5 + 1 trigrams) * m
[[10, 10, 2]]
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..featurize import TFreeEmbeddingConfig
from .base import OneTableEmbedding, TensorFeats, gather_valid, scatter_valid, valid_index

__all__ = ["TFreeEmbedding", "TFreeEmbeddingConfig"]


class TFreeEmbedding(OneTableEmbedding):
    """Features: ``ids`` int64 (L,) in [0, v) and ``counts`` int64 (N, T)."""

    def __init__(self, cfg: TFreeEmbeddingConfig):
        super().__init__(cfg, cfg.v)

    def forward(self, feats: TensorFeats) -> torch.Tensor:
        mask = feats["mask"]  # (N, T)
        index = valid_index(mask)  # (M,)
        counts = gather_valid(feats["counts"], index)  # (M,)
        offsets = torch.cumsum(counts, 0) - counts  # (M,) start of each word's bag
        e = F.embedding_bag(feats["ids"], self.E, offsets, mode="sum", sparse=True)  # (M, d)
        return scatter_valid(e, index, mask)  # (N, T, d)
