"""HashFormers' compressed embeddings (Xue & Aletras, section 3.4): no table indexed by
token at all; a token's T-bit code tau is turned into its vector by a few small
dense parameters shared by every token.

- Pool: split tau into n = ceil(T/k) codewords of k bits, look each up in one codebook
  C (2^k x d), and average them with per-dimension softmax weights W (n x d):
  ``e = sum_j softmax(W)[j] * C[c_j]``; (ceil(T/k) + 2^k) * d parameters.
- Add: T codebooks of two vectors each, one per bit value (T x 2 x d):
  ``e = sum_j C[j, tau_j] / sqrt(T)`` (the paper's gamma = sqrt(T)); 2*T*d parameters.
- Proj: T x d pseudo-axes W; ``e_j`` is the Pearson correlation of tau with column j
  of W; T*d parameters.

The code tau comes from keyed MD5 (the paper), keyed xxh3 (as random, much faster), or
LSH over the token's character 1..4-grams (section 3.5): the n-grams are feature-hashed
into ``lsh_features`` dimensions and bit j is ``x . r_j >= 0`` for T random hyperplanes
r_j. As in section 3.3, the hyperplanes are cyclic shifts of one N(0, 1) vector eta
drawn from the seed (r_j[i] = eta[(i + j) mod d_x]), so nothing is stored or learned.

These tables are small and every token reads most of them, so they are dense
parameters (``row_tables()`` is empty) updated by the dense optimizer.

>>> emb = HashFormerEmbedding(HashFormerConfig(variant="pool", d=4, bits=12, pool_bits=4))
>>> sum(p.numel() for p in emb.parameters()) == (3 + 2 ** 4) * 4
True
>>> emb.featurizer.featurize([["play"]], max_len=4)["codes"].shape
(1, 1, 3)
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ..featurize import E_STD, HashFormerConfig, char_ngrams, featurizer_for, lsh_bits
from .base import TensorFeats, TokenEmbedding, gather_valid, generator, scatter_valid, valid_index

__all__ = ["HashFormerConfig", "HashFormerEmbedding", "char_ngrams", "lsh_bits"]


class HashFormerEmbedding(TokenEmbedding):
    """Features: Pool ``codes`` int64 (N, T, ceil(T/k)); Add/Proj ``bits`` uint8 (N, T, T)."""

    def __init__(self, cfg: HashFormerConfig):
        super().__init__()
        self.cfg = cfg
        self.out_dim = cfg.d
        g = generator(cfg.seed, f"hashformer-{cfg.variant}")
        if cfg.variant == "pool":
            # C rows are averaged over n codewords; std 0.1 * sqrt(n) starts tokens at
            # about the same scale (std 0.1) as the other schemes. W = 0: a plain mean.
            n = cfg.n_codewords
            self.C = nn.Parameter(torch.randn(2 ** cfg.pool_bits, cfg.d, generator=g) * E_STD * n ** 0.5)
            self.W = nn.Parameter(torch.zeros(n, cfg.d))  # (n, d)
        elif cfg.variant == "add":
            # T vectors summed and divided by sqrt(T): std 0.1 per vector gives std 0.1.
            self.C = nn.Parameter(torch.randn(cfg.bits, 2, cfg.d, generator=g) * E_STD)  # (T, 2, d)
        else:
            self.W = nn.Parameter(torch.randn(cfg.bits, cfg.d, generator=g))  # (T, d)
        self.featurizer = featurizer_for(cfg)

    def forward(self, feats: TensorFeats) -> torch.Tensor:
        mask = feats["mask"]  # (N, T)
        index = valid_index(mask)  # (M,)
        if self.cfg.variant == "pool":
            e = self._pool(gather_valid(feats["codes"], index))
        elif self.cfg.variant == "add":
            e = self._add(gather_valid(feats["bits"], index).to(self.C.dtype))
        else:
            e = self._proj(gather_valid(feats["bits"], index).to(self.W.dtype))
        return scatter_valid(e, index, mask)  # (N, T, d)

    def _pool(self, codes: torch.Tensor) -> torch.Tensor:
        # Weigh the codebook once per codeword slot, table[j * 2^k + v] = softmax(W)[j] * C[v]
        # (n * 2^k rows: small), then one fused gather-and-sum. Same result as gathering
        # (M, n, d) and pooling, about 7x faster forward+backward on CPU.
        n, V = self.W.shape[0], self.C.shape[0]
        table = (self.C.unsqueeze(0) * torch.softmax(self.W, dim=0).unsqueeze(1)).reshape(n * V, -1)
        slots = torch.arange(n, device=codes.device) * V  # (n,) first row of each slot
        return F.embedding_bag(codes + slots, table, mode="sum")  # (M, d)

    def _add(self, tau: torch.Tensor) -> torch.Tensor:
        # sum_j C[j, tau_j] = sum_j C[j, 0] + tau @ (C[:, 1] - C[:, 0]): one matmul
        # instead of a (M, T, d) gather.
        C0, C1 = self.C[:, 0], self.C[:, 1]  # (T, d)
        return (C0.sum(0) + tau @ (C1 - C0)) / math.sqrt(self.cfg.bits)  # (M, d)

    def _proj(self, tau: torch.Tensor) -> torch.Tensor:
        t = tau - tau.mean(1, keepdim=True)  # (M, T)
        w = self.W - self.W.mean(0, keepdim=True)  # (T, d)
        # A constant code (all zeros or ones) has no correlation with anything: 0.
        t = t / t.norm(dim=1, keepdim=True).clamp_min(1e-12)
        w = w / w.norm(dim=0, keepdim=True).clamp_min(1e-12)
        return t @ w  # (M, d), each entry in [-1, 1]

    def row_tables(self) -> dict[str, nn.Parameter]:
        return {}
