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
>>> emb.featurize([["play"]], max_len=4)["codes"].shape
(1, 1, 3)
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view
import torch
import torch.nn.functional as F
from torch import nn

from ..exceptions import ConfigError
from ..hashing import canonical_id, derive_seed, hash64, token_bits
from .base import (
    Feats, TensorFeats, TokenEmbedding, check_choice, check_positive, flatten_batch, generator,
    gather_valid, guard_tokens, pad, scatter_valid, valid_index,
)
from .hash import E_STD

__all__ = ["HashFormerConfig", "HashFormerEmbedding", "lsh_bits"]

VARIANTS = ("pool", "add", "proj")
HASHES = ("md5", "xxh3", "lsh")
NGRAM_ORDERS = (1, 2, 3, 4)


@dataclass(frozen=True)
class HashFormerConfig:
    """``bits`` = T (at most 128); ``pool_bits`` = the Pool codeword length k."""

    variant: str = "pool"
    d: int = 64
    bits: int = 128
    pool_bits: int = 10
    hash: str = "md5"
    lsh_features: int = 1 << 16  # d_x: dimensions the character n-grams are hashed into
    seed: int = 0

    def __post_init__(self) -> None:
        check_positive(d=self.d, hashformer_bits=self.bits, hashformer_pool_bits=self.pool_bits,
                       lsh_features=self.lsh_features)
        if self.variant not in VARIANTS:
            raise ConfigError(f"HashFormer variant {self.variant!r}; choose one of {VARIANTS}"
                              " (embedding.scheme=hashformer-<variant>)")
        check_choice("hashformer_hash", self.hash, HASHES)
        if self.bits > 128:
            raise ConfigError(f"embedding.hashformer_bits={self.bits}; at most 128 (an MD5 digest)")
        if self.pool_bits > 16:
            raise ConfigError(f"embedding.hashformer_pool_bits={self.pool_bits} means a 2^k-row codebook;"
                              " use at most 16 (the paper uses 10)")

    @property
    def n_codewords(self) -> int:
        return math.ceil(self.bits / self.pool_bits)


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
        if cfg.hash == "lsh":
            rng = np.random.default_rng(derive_seed(cfg.seed, "lsh-eta"))
            self._eta = rng.standard_normal(cfg.lsh_features).astype(np.float32)  # (d_x,)
        self._powers = 1 << np.arange(cfg.pool_bits - 1, -1, -1, dtype=np.int64)  # MSB first

    def token_code(self, tokens: Sequence[str]) -> np.ndarray:
        """tau: the {0, 1} uint8 code (M, T) of each token."""
        cfg = self.cfg
        if cfg.hash == "lsh":
            return guard_tokens(lsh_bits, tokens, self._eta, cfg.bits, cfg.seed)
        return guard_tokens(token_bits, tokens, cfg.seed, cfg.hash, cfg.bits)

    def featurize(self, token_lists, max_len: int) -> Feats:
        flat, mask = flatten_batch(token_lists, max_len)
        tau = self.token_code(flat)  # (M, T)
        if self.cfg.variant == "pool":
            return {"mask": mask, "codes": pad(self.codewords(tau), mask)}
        return {"mask": mask, "bits": pad(tau, mask)}

    def codewords(self, tau: np.ndarray) -> np.ndarray:
        """Pool's codewords (eq. 1): (M, T) bits ``tau`` -> (M, n) integers of k bits each,
        most significant bit first; the last, shorter chunk is read as a number of its own
        bits (zero-padded on the left). ``featurize`` applies it to :meth:`token_code`."""
        k, n = self.cfg.pool_bits, self.cfg.n_codewords
        padded = np.zeros((len(tau), n * k), dtype=np.int64)
        padded[:, :tau.shape[1]] = tau
        last = tau.shape[1] - (n - 1) * k  # bits in the last chunk
        padded[:, (n - 1) * k:] = np.roll(padded[:, (n - 1) * k:], k - last, axis=1)
        return padded.reshape(len(tau), n, k) @ self._powers  # (M, n)

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

    def rows_touched(self, feats: Feats) -> dict[str, np.ndarray]:
        return {}


def char_ngrams(token: str) -> list[str]:
    """Character 1..4-grams of ``token``, with repeats (x counts n-gram frequency).

    >>> char_ngrams("abc")
    ['a', 'b', 'c', 'ab', 'bc', 'abc']
    """
    return [token[i:i + n] for n in NGRAM_ORDERS for i in range(len(token) - n + 1)]


def lsh_bits(tokens: Sequence[str], eta: np.ndarray, bits: int, seed: int) -> np.ndarray:
    """HashFormers-LSH code (M, bits) uint8: bit j = [x . r_j >= 0], x the token's
    n-gram counts hashed into len(eta) dimensions, r_j = eta cyclically shifted by j.

    Each token's dot products are summed over its own n-grams only, in a fixed order,
    so a token's bits do not depend on the rest of the batch.
    """
    grams = [char_ngrams(canonical_id(t)) for t in tokens]
    counts = np.fromiter(map(len, grams), dtype=np.int64, count=len(grams))
    flat = [g for gs in grams for g in gs]
    slot = (hash64(flat, derive_seed(seed, "lsh-ngram")) % np.uint64(len(eta))).astype(np.int64)  # (G,)
    # Row i of the windows is (eta[i], eta[i+1], ..., eta[i+bits-1]) cyclically, i.e.
    # r_j[i] for j = 0..bits-1: a view, so picking rows is one contiguous copy each.
    windows = sliding_window_view(np.concatenate([eta, eta[:bits - 1]]), bits)  # (d_x, bits)
    proj = windows[slot]  # (G, bits): r_j[slot(g)]
    dots = np.zeros((len(tokens), bits), dtype=np.float32)  # (M, bits); no n-grams: 0
    has = counts > 0
    if has.any():
        starts = np.cumsum(counts) - counts
        dots[has] = np.add.reduceat(proj, starts[has], axis=0)
    return (dots >= 0).astype(np.uint8)
