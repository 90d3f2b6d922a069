"""A cache of the stream's last ``size`` learned tokens (next-token's second count feature).

P_recent(w) = (c(w) + a) / (filled + a n): c(w) the count of w among the last ``size``
learned tokens, n the candidates, a = 0.1. A novel repeats its names and topics within a
few hundred tokens, which a trigram forgets once they fall out of its contexts.

Storage: one float32 row table ``buf`` (rows, 256), read as uint64 words: word 0 the ring's
next write position, word 1 how many tokens it holds, words 2.. the ring of token hashes.
A step writes a few rows (the ring positions it wrote, and row 0); a restore copies them
back and the views read them. The counts are taken from the ring when scoring (a sort
of at most ``size`` hashes and one ``searchsorted`` of the candidates).

>>> r = RecentTokens(4)
>>> r.learn(np.array([7, 8, 7], dtype=np.uint64)).tolist()
[0]
>>> [round(float(p), 3) for p in np.exp(r.logp(np.array([7, 9], dtype=np.uint64), n=2))]  # (2 + .1) / 3.2
[0.656, 0.031]
"""
from __future__ import annotations

import numpy as np
import torch

__all__ = ["RecentTokens"]

_WORDS = 128  # uint64 words per stored row (256 float32)


class RecentTokens:
    """The last ``size`` learned tokens' hashes (module docstring)."""

    alpha = 0.1

    def __init__(self, size: int):
        self.size = size
        self.buf = torch.zeros(-(-(size + 2) // _WORDS), 2 * _WORDS)  # (rows, 256) float32
        self._words = self.buf.numpy().view(np.uint64).reshape(-1)  # a view: restored rows show here
        self._ring = self._words[2:2 + size]

    def learn(self, hashes: np.ndarray) -> np.ndarray:
        """Append the tokens (in stream order), evicting the oldest; the changed rows."""
        hashes = hashes[-self.size:]  # earlier ones would be evicted by these at once
        head, filled = int(self._words[0]), int(self._words[1])
        at = (head + np.arange(len(hashes))) % self.size
        self._ring[at] = hashes
        self._words[0] = (head + len(hashes)) % self.size
        self._words[1] = min(self.size, filled + len(hashes))
        return np.unique(np.concatenate([[0], (at + 2) // _WORDS]))

    def logp(self, w: np.ndarray, n: int) -> np.ndarray:
        """log P_recent of token hashes ``w`` (any shape), ``n`` candidates."""
        filled = int(self._words[1])
        keys, counts = np.unique(self._ring[:filled], return_counts=True)
        c = np.zeros(np.shape(w))
        if len(keys):
            at = np.minimum(np.searchsorted(keys, w), len(keys) - 1)
            c = np.where(keys[at] == w, counts[at], 0)
        return np.log((c + self.alpha) / (filled + self.alpha * n)).astype(np.float32)
