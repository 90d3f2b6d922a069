"""The standard embedding the papers compare against, made usable on a stream: a
bounded dictionary grown online, first come first served.

The dictionary lives in the scheme's featurizer (:class:`~streamlearn.featurize.PlainFeaturizer`):
the first ``V = plain_vocab`` distinct tokens get rows 0..V-1 in the order the stream
shows them; every later new token shares the out-of-vocabulary row V. The table is
(V + 1) x d. The module keeps the featurizer's fingerprints as its extra state (int64),
so the dictionary survives a ``state_dict`` round trip with the weights.

>>> emb = PlainEmbedding(PlainEmbeddingConfig(vocab=2, d=3))
>>> emb.featurizer.featurize([["a", "b", "a"], ["c"]], max_len=4)["ids"].tolist()
[[0, 1, 0], [2, 0, 0]]
>>> len(emb.featurizer)
2
"""
from __future__ import annotations

import numpy as np
import torch

from ..featurize import PlainEmbeddingConfig
from .base import OneTableEmbedding, TensorFeats

__all__ = ["PlainEmbedding", "PlainEmbeddingConfig"]


class PlainEmbedding(OneTableEmbedding):
    """Features: ``ids`` int64 (N, T) in [0, vocab]; ``vocab`` is the OOV row."""

    def __init__(self, cfg: PlainEmbeddingConfig):
        super().__init__(cfg, cfg.vocab + 1)

    def forward(self, feats: TensorFeats) -> torch.Tensor:
        return self.lookup(feats, "ids")

    def get_extra_state(self) -> torch.Tensor:
        """The dictionary's fingerprints in row order, as int64 (the uint64 bits reinterpreted)."""
        return torch.from_numpy(self.featurizer.keys().view(np.int64))

    def set_extra_state(self, state: torch.Tensor) -> None:
        self.featurizer.load_keys(np.asarray(state.cpu().numpy(), dtype=np.int64).view(np.uint64))
