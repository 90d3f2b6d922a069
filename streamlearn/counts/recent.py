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

from .table import GOLDEN

__all__ = ["RecentPairs", "RecentTokens"]

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
        at = _advance(self._words, self.size, len(hashes))
        self._ring[at] = hashes
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


class RecentPairs:
    """A cache of the stream's last ``size`` learned (previous token, token) pairs, mixed
    into next-token's Kneser-Ney distribution (Kuhn & De Mori's cache model, conditioned
    on the previous token):

        P(w | ctx) = (1 - lam) P_KN(w | ctx) + lam c(v w) / c(v .)

    v the token before the answer, c the counts among the cached pairs (where v has none,
    P_KN alone). A novel repeats its names and phrases within a few hundred words; a
    stream of unrelated messages does not, and there the cache only adds noise. So lam is
    learned as a mixture weight is by online EM: after each batch it moves toward the
    mean share of the answers' probability the cache accounts for,
    lam c(v w) / c(v .) / P(w | ctx), at ``rate`` per example, between ``LOW`` and ``HIGH``.

    Storage: one float32 row table ``buf`` (rows, 256), read as uint64 words: word 0 the
    ring's next write position, word 1 how many pairs it holds, word 2 lam (float64 bits),
    word 3 unused; words 4.. the ring, two words (v, w) per pair. A learn writes the rows
    of the ring it wrote and row 0.

    >>> c = RecentPairs(4, start=0.5)
    >>> c.due  # the first batch is an EM batch: learn needs P_KN of its answers
    True
    >>> c.learn(np.array([1, 1, 2], np.uint64), np.array([7, 8, 7], np.uint64), np.full(3, 0.1)).tolist()
    [0]
    >>> ids, cols, p = c.cached(np.array([1, 3], np.uint64), np.array([7, 8, 9], np.uint64))
    >>> ids.tolist(), cols.tolist(), p.tolist()  # example 0 (v = 1) saw 7 and 8 once each
    ([0, 0], [0, 1], [0.5, 0.5])
    """

    LOW, HIGH = 0.001, 0.5  # lam's bounds: never quite off (it could not come back), never the whole
    EVERY = 8  # batches per EM step

    def __init__(self, size: int, start: float = 0.1, rate: float = 0.008):
        self.size, self.start, self.rate = size, start, rate
        self.buf = torch.zeros(-(-(2 * size + 4) // _WORDS), 2 * _WORDS)  # (rows, 256) float32
        self._words = self.buf.numpy().view(np.uint64).reshape(-1)  # a view: restored rows show here
        self._ring = self._words[4:4 + 2 * size].reshape(size, 2)  # (size, 2): v, w
        self._lam = self._words[2:3].view(np.float64)
        if self.filled == 0 and self._lam[0] == 0:
            self._lam[0] = start

    @property
    def filled(self) -> int:
        return int(self._words[1])

    @property
    def due(self) -> bool:
        """Whether the next :meth:`learn` takes an EM step (and so needs P_KN)."""
        return int(self._words[3]) % self.EVERY == 0

    @property
    def lam(self) -> float:
        """The cache's mixture weight (``start`` while the table holds none: a fresh table)."""
        return float(self._lam[0]) if self._lam[0] > 0 else self.start

    @lam.setter
    def lam(self, value: float) -> None:
        self._lam[0] = value

    def pairs(self) -> np.ndarray:
        """The cached pairs (filled, 2), oldest first."""
        head, filled = int(self._words[0]), self.filled
        if filled < self.size:
            return self._ring[:filled]
        return np.concatenate([self._ring[head:], self._ring[:head]])

    def cached(self, v: np.ndarray, cands: np.ndarray, starts: np.ndarray | None = None,
               later: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The cache's P(w | v) > 0 of examples with previous tokens ``v`` (N,) over the
        candidates ``cands`` (C,), shared, or (N, C), each example's own: example ids,
        candidate columns and probabilities, one per cell the cache holds (others: 0; an
        example whose v the cache lacks has no cell; a token twice in an example's row
        gets its first cell). ``later`` (M, 2): pairs after the ring's (a batch's, in
        order), and ``starts`` (N,): each example reads the ``size`` pairs before
        position ``starts`` of them (its record's first), as a cache learning record by
        record holds them."""
        pairs = self.pairs() if later is None else np.concatenate([self.pairs(), later])
        ends = np.full(len(v), len(pairs), np.int64) if starts is None else self.filled + starts
        lows = np.maximum(ends - self.size, 0)
        order = np.argsort(pairs[:, 0], kind="stable")
        keys = pairs[order, 0]
        lo, hi = np.searchsorted(keys, v, "left"), np.searchsorted(keys, v, "right")  # (N,)
        span = hi - lo
        example = np.repeat(np.arange(len(v)), span)
        at = order[np.arange(span.sum()) - np.repeat(np.cumsum(span) - span, span) + np.repeat(lo, span)]
        inside = (at >= lows[example]) & (at < ends[example])
        example, at = example[inside], at[inside]
        totals = np.bincount(example, minlength=len(v))  # c(v .) of each example's window
        width = max(cands.shape[-1], 1)
        if cands.ndim == 1:  # a cell: the token's column, in the example's row
            grid, wanted, base = cands, pairs[at, 1], example.astype(np.int64) * width
        else:  # a cell: (example, token) among the flattened rows
            rows = np.repeat(np.arange(len(cands), dtype=np.uint64), cands.shape[1])
            grid, wanted, base = _pair_keys(rows, cands.reshape(-1)), _pair_keys(example.astype(np.uint64),
                                                                                  pairs[at, 1]), 0
        sorter = np.argsort(grid, kind="stable")
        ordered = grid[sorter]
        spot = np.minimum(np.searchsorted(ordered, wanted), max(grid.size - 1, 0))
        known = ordered[spot] == wanted if grid.size else np.zeros(len(wanted), bool)
        cells = (base + sorter[spot])[known] if cands.ndim == 1 else sorter[spot[known]]
        cells, counts = np.unique(cells, return_counts=True)
        ids, cols = np.divmod(cells, width)
        return ids, cols, counts / totals[ids]

    def mix(self, logp: np.ndarray, v: np.ndarray, cands: np.ndarray, starts: np.ndarray | None = None,
            later: np.ndarray | None = None) -> np.ndarray:
        """Log-probabilities (N, C) of P_KN mixed with the cache, in place, up to a
        constant per example (log(1 - lam) is left out: every score that reads them is
        a softmax or a ranking of one example's candidates): log(P_KN + lam / (1 - lam)
        P_cache) where the cache holds the cell. Arguments as :meth:`cached`'s."""
        ids, cols, p = self.cached(v, cands, starts, later)
        if len(ids):
            odds = self.lam / (1 - self.lam)
            logp[ids, cols] = np.log(np.exp(logp[ids, cols].astype(np.float64)) + odds * p)
        return logp

    def learn(self, v: np.ndarray, w: np.ndarray, p_kn: np.ndarray | None) -> np.ndarray:
        """Append the pairs (v, w) (in stream order), first moving lam by an EM step on
        them where :attr:`due` (``p_kn`` (M,): P_KN of each w, before the batch is
        counted; None otherwise). The shares read the cache as it was before the batch,
        not as each pair's record would find it. Returns the changed rows."""
        if self.due:
            if p_kn is None:
                raise ValueError("an EM batch (RecentPairs.due) needs P_KN of its answers")
            self._em(v, w, p_kn)
        self._words[3] += np.uint64(1)
        v, w = v[-self.size:], w[-self.size:]
        at = _advance(self._words, self.size, len(v))
        self._ring[at, 0], self._ring[at, 1] = v, w
        return np.unique(np.concatenate([[0], (4 + 2 * at) // _WORDS, (5 + 2 * at) // _WORDS]))

    def _em(self, v: np.ndarray, w: np.ndarray, p_kn: np.ndarray) -> None:
        held, p_cache = self._answers(v, w)
        if held.any():
            lam = self.lam
            cache = lam * p_cache[held]
            share = cache / ((1 - lam) * p_kn[held] + cache)
            step = min(1.0, self.rate * len(share))
            self._lam[0] = float(np.clip((1 - step) * lam + step * share.mean(), self.LOW, self.HIGH))

    def _answers(self, v: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Whether the cache holds each v_i (N,), and P_cache(w_i | v_i) (N,; 0 where not)."""
        pairs = self.pairs()
        if not len(pairs):
            return np.zeros(len(v), bool), np.zeros(len(v))
        firsts, both = np.sort(pairs[:, 0]), np.sort(_pair_keys(pairs[:, 0], pairs[:, 1]))
        totals = np.searchsorted(firsts, v, "right") - np.searchsorted(firsts, v, "left")
        keys = _pair_keys(v, w)
        counts = np.searchsorted(both, keys, "right") - np.searchsorted(both, keys, "left")
        return totals > 0, counts / np.maximum(totals, 1)


def _advance(words: np.ndarray, size: int, n: int) -> np.ndarray:
    """Move a ring's next write position (word 0) and fill count (word 1) past ``n`` new
    entries (n <= size); returns the ring slots they take, in order."""
    head, filled = int(words[0]), int(words[1])
    words[0] = (head + n) % size
    words[1] = min(size, filled + n)
    return (head + np.arange(n)) % size


def _pair_keys(v: np.ndarray, w: np.ndarray) -> np.ndarray:
    """One uint64 per (v, w) pair of token hashes (uniform hashes: collisions about 2^-64)."""
    with np.errstate(over="ignore"):
        return v * GOLDEN ^ w
