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
>>> feats = emb.featurize([["Hello", "world", "!"]], max_len=8)
>>> feats["counts"].tolist()   # (5 + 5 + 1 trigrams) * m
[[10, 10, 2]]
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ..hashing import canonical_id, tfree_hashes
from .base import (
    Feats, TensorFeats, TokenEmbedding, flatten_batch, guard_tokens, normal_table,
    gather_valid, scatter_valid, unique_rows, valid_index,
)
from .hash import E_STD

__all__ = ["TFreeEmbedding", "TFreeEmbeddingConfig"]


@dataclass(frozen=True)
class TFreeEmbeddingConfig:
    """v rows of width d; m hashes per trigram."""

    v: int = 32_768
    d: int = 64
    m: int = 2
    seed: int = 0


class TFreeEmbedding(TokenEmbedding):
    """Features: ``ids`` int64 (L,) in [0, v) and ``counts`` int64 (N, T)."""

    def __init__(self, cfg: TFreeEmbeddingConfig):
        super().__init__()
        self.cfg = cfg
        self.out_dim = cfg.d
        self.E = normal_table(cfg.v, cfg.d, 0.0, E_STD, cfg.seed, "E")  # (v, d)

    def featurize(self, token_lists, max_len: int) -> Feats:
        flat, mask = flatten_batch(token_lists, max_len)
        words = guard_tokens(lambda ts: [canonical_id(t) for t in ts], flat)
        ids, offsets = tfree_hashes(words, self.cfg.m, self.cfg.v, self.cfg.seed)  # (L,), (M + 1,)
        counts = np.zeros(mask.shape, dtype=np.int64)
        counts[mask] = np.diff(offsets)
        return {"mask": mask, "ids": ids, "counts": counts}

    def forward(self, feats: TensorFeats) -> torch.Tensor:
        mask = feats["mask"]  # (N, T)
        index = valid_index(mask)  # (M,)
        counts = gather_valid(feats["counts"], index)  # (M,)
        offsets = torch.cumsum(counts, 0) - counts  # (M,) start of each word's bag
        e = F.embedding_bag(feats["ids"], self.E, offsets, mode="sum", sparse=True)  # (M, d)
        return scatter_valid(e, index, mask)  # (N, T, d)

    def row_tables(self) -> dict[str, nn.Parameter]:
        return {"E": self.E}

    def rows_touched(self, feats: Feats) -> dict[str, np.ndarray]:
        return {"E": unique_rows(feats["ids"])}
