"""The standard embedding the papers compare against, made usable on a stream: a
bounded dictionary grown online, first come first served.

The first ``V = plain_vocab`` distinct tokens get rows 0..V-1 in the order the stream
shows them; every later new token shares the out-of-vocabulary row V. The table is
(V + 1) x d. The dictionary is keyed by a 64-bit xxh3 fingerprint of the token (two
tokens share a row only if their fingerprints collide: about V^2 / 2^65, 3e-10 for
V = 10^5), kept as an int64 tensor in the module's extra state, so it survives a
``state_dict`` round trip with the weights.

This is the one scheme whose ``featurize`` changes module state: while ``grow`` is
True it assigns rows to new tokens, so ids depend on the order batches are featurized
(deterministic for a given stream order; featurize batches in stream order). Set
``grow = False`` to look up without growing (e.g. when predicting).

>>> emb = PlainEmbedding(PlainEmbeddingConfig(vocab=2, d=3))
>>> emb.featurize([["a", "b", "a"], ["c"]], max_len=4)["ids"].tolist()
[[0, 1, 0], [2, 0, 0]]
>>> len(emb)
2
"""
from __future__ import annotations

import threading
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ..exceptions import StreamlearnError
from ..hashing import derive_seed, hash64
from .base import (
    Feats, TensorFeats, TokenEmbedding, flatten_batch, guard_tokens, normal_table,
    gather_valid, pad, scatter_valid, unique_rows, valid_index,
)
from .hash import E_STD

__all__ = ["PlainEmbedding", "PlainEmbeddingConfig"]


@dataclass(frozen=True)
class PlainEmbeddingConfig:
    """``vocab`` dictionary rows plus one out-of-vocabulary row, width d."""

    vocab: int = 100_000
    d: int = 64
    seed: int = 0


class PlainEmbedding(TokenEmbedding):
    """Features: ``ids`` int64 (N, T) in [0, vocab]; ``vocab`` is the OOV row."""

    def __init__(self, cfg: PlainEmbeddingConfig):
        super().__init__()
        self.cfg = cfg
        self.out_dim = cfg.d
        self.grow = True
        self.oov = cfg.vocab
        self.E = normal_table(cfg.vocab + 1, cfg.d, 0.0, E_STD, cfg.seed, "E")  # (V + 1, d)
        self._fp_seed = derive_seed(cfg.seed, "plain")
        self._lock = threading.Lock()  # featurize (data thread) vs state_dict (learner)
        self._set_keys(np.empty(0, dtype=np.uint64))

    def __len__(self) -> int:
        """Tokens in the dictionary (at most ``vocab``)."""
        return len(self._keys)

    def featurize(self, token_lists, max_len: int) -> Feats:
        flat, mask = flatten_batch(token_lists, max_len)
        keys = guard_tokens(hash64, flat, self._fp_seed)  # (M,) uint64 fingerprints
        with self._lock:
            if self.grow:
                self._add(keys)
            ids = self._lookup(keys)  # (M,)
        return {"mask": mask, "ids": pad(ids, mask)}

    def forward(self, feats: TensorFeats) -> torch.Tensor:
        mask = feats["mask"]  # (N, T)
        index = valid_index(mask)  # (M,)
        e = F.embedding(gather_valid(feats["ids"], index), self.E, sparse=True)  # (M, d)
        return scatter_valid(e, index, mask)  # (N, T, d)

    def row_tables(self) -> dict[str, nn.Parameter]:
        return {"E": self.E}

    def rows_touched(self, feats: Feats) -> dict[str, np.ndarray]:
        return {"E": unique_rows(feats["ids"][feats["mask"]])}

    # ------------------------------------------------------------------ dictionary

    def get_extra_state(self) -> torch.Tensor:
        """The fingerprints in row order, as int64 (the uint64 bits reinterpreted)."""
        with self._lock:
            return torch.from_numpy(self._keys.view(np.int64).copy())

    def set_extra_state(self, state: torch.Tensor) -> None:
        keys = np.asarray(state.cpu().numpy(), dtype=np.int64).view(np.uint64)
        if len(keys) > self.cfg.vocab or len(np.unique(keys)) != len(keys):
            raise StreamlearnError(
                f"plain dictionary state holds {len(keys)} keys (unique: {len(np.unique(keys))}) "
                f"but embedding.plain_vocab={self.cfg.vocab}; load it with the config it was saved with"
            )
        with self._lock:
            self._set_keys(keys.copy())

    def __getstate__(self) -> dict:
        # A lock cannot be pickled or deep-copied; the copy gets its own.
        state = self.__dict__.copy()
        del state["_lock"]
        return state

    def __setstate__(self, state: dict) -> None:
        super().__setstate__(state)
        self._lock = threading.Lock()

    def _set_keys(self, keys: np.ndarray) -> None:
        self._keys = keys  # (n,) uint64, row order
        order = np.argsort(keys, kind="stable")
        self._sorted_keys, self._sorted_rows = keys[order], order.astype(np.int64)

    def _lookup(self, keys: np.ndarray) -> np.ndarray:
        """Row of each key, ``oov`` when absent (a binary search, batched)."""
        if not len(self._sorted_keys):
            return np.full(len(keys), self.oov, dtype=np.int64)
        pos = np.minimum(np.searchsorted(self._sorted_keys, keys), len(self._sorted_keys) - 1)
        return np.where(self._sorted_keys[pos] == keys, self._sorted_rows[pos], self.oov)

    def _add(self, keys: np.ndarray) -> None:
        room = self.cfg.vocab - len(self._keys)
        if room <= 0 or not len(keys):
            return
        uniq, first = np.unique(keys, return_index=True)
        fresh = uniq[np.argsort(first, kind="stable")]  # distinct keys, first-seen order
        fresh = fresh[self._lookup(fresh) == self.oov][:room]
        rows = np.arange(len(self._keys), len(self._keys) + len(fresh), dtype=np.int64)
        order = np.argsort(fresh)
        # Merge into the sorted index in O(V) instead of re-sorting all V keys.
        at = np.searchsorted(self._sorted_keys, fresh[order])
        self._sorted_keys = np.insert(self._sorted_keys, at, fresh[order])
        self._sorted_rows = np.insert(self._sorted_rows, at, rows[order])
        self._keys = np.concatenate([self._keys, fresh])
