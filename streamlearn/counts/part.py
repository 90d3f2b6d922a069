"""The count part as a token task hosts it: token hashing, the KN tables as named row
tables, and count scores for (example, candidate) grids.

Token hashes are xxh3 under ``derive_seed(hashing.seed, "counts")`` (never Python's
``hash()``: the tables are persisted and read by other processes). Contexts are
BOS-padded with ``objectives.BOS_TOKEN``'s hash, as the replay's n-gram baseline pads.
The ingest stage computes every hash (:func:`ngrams`, :func:`contexts`); the task
reads the scores (:meth:`CountPart.next_token`, :meth:`CountPart.chain`) and counts
the batch after its step (:meth:`CountPart.learn`).

Replicas (several workers training one model) merge count parts by replaying, not by
adding tables: the trigram counts add up, but the statistics KN derives from them do not
(two replicas that each see a trigram type for the first time would both add 1 to its
N1+ continuation counts, and the counts-of-counts behind the discounts would drift), and
the tables' slots hold keys, which no sum or average keeps. So a replica keeps the
trigram batches it counted since the last merge (:meth:`CountPart.keep_log`), and a
merge (:meth:`CountPart.merge`) puts the tables back as they were at the last merge and
counts every replica's batches, in rank order: every replica ends bit-equal, with the
counts one learner would have of the same records (exactly, while no table halves).
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from ..compiled_loading import WhenLoaded
from ..exceptions import StreamlearnError
from ..hashing import derive_seed, hash64
from ..objectives import BOS_TOKEN
from .kn import KneserNey3, KneserNey4
from .recent import RecentPairs, RecentTokens
from .table import distinct

__all__ = ["PREFIX", "CountPart", "contexts", "count_order", "count_seed", "ngrams", "trigrams"]

PREFIX = "lm"  # store names: "lm.kn3", "lm.kn12", "lm.stats", "lm.kn4", "lm.recent", "lm.pairs"


def count_seed(seed: int) -> int:
    """The token-hash seed of the count part under ``hashing.seed``."""
    return derive_seed(seed, "counts")


def count_order(counts: str) -> int:
    """n of the n-grams the count part ``model.counts`` counts (4 for ``kn4``, else 3)."""
    return 4 if counts == "kn4" else 3


def _padded(lists: Sequence[Sequence[str]], seed: int, left: int, right: int) -> tuple[np.ndarray, np.ndarray]:
    """Token hashes of every list BOS-padded (``left`` before, ``right`` after), flat, and
    each list's start in the flat array (the first padding's index)."""
    bos = hash64([BOS_TOKEN], seed)[0]
    flat = hash64([t for ts in lists for t in ts], seed)
    lengths = np.array([len(ts) for ts in lists], dtype=np.int64)
    sizes = lengths + left + right
    starts = np.cumsum(sizes) - sizes  # (L,) each padded list's start
    out = np.full(int(sizes.sum()), bos, dtype=np.uint64)
    own = np.repeat(starts + left - (np.cumsum(lengths) - lengths), lengths) + np.arange(len(flat))
    out[own] = flat
    return out, starts


def ngrams(lists: Sequence[Sequence[str]], seed: int, n: int = 3) -> np.ndarray:
    """(M, n) uint64: the hashes of every position of every list with the n - 1 before it,
    BOS-padded, row-major (next-token: position i's context and answer).

    >>> grams = ngrams([["a", "b"]], 0, 4)  # (2, 4): BOS BOS BOS a, BOS BOS a b
    >>> grams[:, -1].tolist() == hash64(["a", "b"], 0).tolist(), bool(grams[1, 2] == grams[0, 3])
    (True, True)
    """
    padded, starts = _padded(lists, seed, n - 1, 0)
    lengths = np.array([len(ts) for ts in lists], dtype=np.int64)
    at = np.repeat(starts, lengths) + np.arange(int(lengths.sum())) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    return np.stack([padded[at + j] for j in range(n)], 1)  # (M, n)


def trigrams(lists: Sequence[Sequence[str]], seed: int) -> np.ndarray:
    """(M, 3): :func:`ngrams` of n = 3."""
    return ngrams(lists, seed, 3)


def contexts(lists: Sequence[Sequence[str]], rows: np.ndarray, cols: np.ndarray, seed: int) -> np.ndarray:
    """(n, 6) uint64 of the slots (rows[i], cols[i]): the hashes of the two tokens before
    and the two after (BOS-padded), then 1/0 for "the list has a token 1 / 2 after"."""
    padded, starts = _padded(lists, seed, 2, 2)
    lengths = np.array([len(ts) for ts in lists], dtype=np.int64)
    j = starts[rows] + cols + 2
    after = lengths[rows] - cols - 1
    return np.stack([padded[j - 2], padded[j - 1], padded[j + 1], padded[j + 2],
                     (after >= 1).astype(np.uint64), (after >= 2).astype(np.uint64)], 1)


def _compiled_counts():
    from ..compiled_counts import CompiledCounts  # imports numba: only where it runs
    return CompiledCounts()


class CountPart:
    """The KN trigram count part of a token task (:class:`~.kn.KneserNey3`; ``order=4``:
    with a 4-gram order on top, :class:`~.kn.KneserNey4`) and, with ``recent`` > 0, the
    cache of the last ``recent`` tokens (:class:`~.recent.RecentTokens`): score column 0
    is the KN model's, column 1 the cache's. With ``pairs`` > 0 (next-token), the cache
    of the last ``pairs`` (previous token, token) pairs (:class:`~.recent.RecentPairs`)
    is mixed into column 0's distribution. ``compiled``: the KN model counts through
    the compiled kernels (:mod:`streamlearn.compiled_counts`: the same bytes as its numpy
    passes) once they are loaded (``learner.compiled``)."""

    def __init__(self, slots: int, seed: int, recent: int = 0, order: int = 3, compiled: bool = False,
                 pairs: int = 0):
        self.kn = KneserNey4(slots, slots // 2) if order == 4 else KneserNey3(slots, slots // 2)
        if compiled:
            self.kn.compiled = WhenLoaded(_compiled_counts)
        self.recent = RecentTokens(recent) if recent else None
        self.pairs = RecentPairs(pairs) if pairs else None
        self.seed = count_seed(seed)
        self._cands = np.empty(0, dtype=np.uint64)  # hashes of the candidate index's first tokens
        self._weights = _UnigramWeights(self.kn)  # the proposal's N1+(. w)^0.75 per candidate
        # replicas (module docstring): the tables at the last merge, and the batches since
        self._base: dict[str, torch.Tensor] | None = None
        self._log: list[np.ndarray] | None = None

    @staticmethod
    def features(recent: int) -> int:
        """Score columns per (example, candidate) of a part with cache size ``recent``."""
        return 1 + (recent > 0)

    @property
    def columns(self) -> int:
        return self.features(0 if self.recent is None else self.recent.size)

    def tables(self) -> dict[str, torch.Tensor]:
        own = {} if self.recent is None else {f"{PREFIX}.recent": self.recent.buf}
        if self.pairs is not None:
            own[f"{PREFIX}.pairs"] = self.pairs.buf
        return {**self.kn.tables(PREFIX), **own}

    def word_tables(self) -> frozenset[str]:
        """The tables whose float32 words hold bits (keys, token hashes), not numbers."""
        return self.kn.word_tables(PREFIX) | (frozenset(self.tables()) & {f"{PREFIX}.recent", f"{PREFIX}.pairs"})

    def learn(self, grams: np.ndarray) -> dict[str, np.ndarray]:
        """Count n-grams (M, order) (their last tokens, in stream order, enter the cache);
        the changed rows by store name."""
        if not len(grams):
            return {}
        if self._log is not None:
            self._log.append(grams)
        out = {}
        if self.pairs is not None:  # an EM step reads P_KN of the answers before they are counted
            ctx, v, w = grams[:, :-1], grams[:, -2], grams[:, -1]
            p_kn = self.kn.score(_columns(ctx), w[:, None], max(self.kn.types, 1))[:, 0] if self.pairs.due else None
            out[f"{PREFIX}.pairs"] = self.pairs.learn(v, w, p_kn)
        before = (self.kn.continuations, self.kn.halvings)
        rows = self.kn.learn(*grams.T)  # the big, the small (and the quad) table's
        self._weights.learned(self.kn.raised, before)
        out.update(zip((name for name in self.kn.tables(PREFIX) if name != f"{PREFIX}.stats"), rows))
        out[f"{PREFIX}.stats"] = np.zeros(1, np.int64)
        if self.recent is not None:
            out[f"{PREFIX}.recent"] = self.recent.learn(grams[:, -1])
        return out

    # ------------------------------------------------------------ replicas (module docstring)

    def keep_log(self, on: bool = True) -> None:
        """Start keeping the batches counted from now on, the tables as they are now being
        the base a :meth:`merge` goes back to (a copy: memory of one more set of tables);
        ``on=False`` stops and frees both."""
        self._base = {n: t.clone() for n, t in self.tables().items()} if on else None
        self._log = [] if on else None

    def log(self) -> list[np.ndarray]:
        """The n-gram batches (M, order) counted since the last merge, in order."""
        if self._log is None:
            raise StreamlearnError("the count part keeps no log: call keep_log() when the replicas are equal")
        return list(self._log)

    def merge(self, logs: Sequence[Sequence[np.ndarray]]) -> dict[str, np.ndarray]:
        """The tables go back to the base and count every replica's :meth:`log` (``logs``
        in rank order, this replica's among them); the merged tables are the next base.
        Returns the rows that differ from the base, by store name."""
        if self._base is None:
            raise StreamlearnError("the count part keeps no log: call keep_log() when the replicas are equal")
        for name, table in self.tables().items():
            table.copy_(self._base[name])  # in place: the tables' numpy views read these bytes
        self._log, changed = None, {}
        for grams in (t for log in logs for t in log):
            for name, rows in self.learn(grams).items():
                changed.setdefault(name, []).append(rows)
        self.keep_log()
        return {name: distinct(np.concatenate(rows)) for name, rows in changed.items()}

    def _with_recent(self, scores: np.ndarray, cands: np.ndarray, n: int) -> np.ndarray:
        """(N, C) KN scores -> (N, F, C) with the cache's (the same for every example);
        ``cands`` (C,) or (N, C)."""
        if self.recent is None:
            return scores[:, None]
        recent = np.broadcast_to(self.recent.logp(cands, max(n, 1)), scores.shape)
        return np.stack([scores, recent], 1)

    def candidates(self, index) -> np.ndarray:
        """Hashes (n,) of the candidate index's tokens, in its order (it is append-only:
        only new ones are hashed; a smaller index is a new one, hashed again)."""
        n, have = len(index), len(self._cands)
        if n < have:
            self._cands, have = self._cands[:0], 0
        if n > have:
            self._cands = np.concatenate([self._cands, hash64(index.new_since(have), self.seed)])
        return self._cands[:n]

    def proposal(self, cands: np.ndarray) -> tuple[np.ndarray, float]:
        """The negatives' proposal Q over the candidates (C,) (token hashes): 0.9 of it
        proportional to N1+(. w)^0.75 (the KN unigram's counts, word2vec's power), 0.1
        uniform; returns (Q (C,), the power's normaliser, for :meth:`q_of`)."""
        n = len(cands)
        weight = self._weights.of(cands)
        total = float(weight.sum())
        if total == 0:
            return np.full(n, 1.0 / n), 0.0
        return 0.9 * weight / total + 0.1 / n, total

    def q_of(self, hashes: np.ndarray, total: float, n: int) -> np.ndarray:
        """Q (as :meth:`proposal`) of any tokens' hashes, ``n`` candidates."""
        if total == 0:
            return np.full(len(hashes), 1.0 / n)
        return 0.9 * self.kn.continuation_counts(hashes).astype(np.float64) ** 0.75 / total + 0.1 / n

    def next_token(self, ctx: np.ndarray, cands: np.ndarray, n: int) -> np.ndarray:
        """(N, F, C) float32 log P_KN(w | context) (and log P_recent(w)): contexts ctx
        (N, order - 1) hashes, candidates (C,) shared by every example or (N, C) each
        example's own."""
        if not cands.size or not len(ctx):
            return np.zeros((len(ctx), self.columns, cands.shape[-1]), np.float32)
        p = self.kn.score(_columns(ctx), _grid(cands), max(n, 1))
        logp = np.log(np.maximum(p, 1e-30)).astype(np.float32)
        if self.pairs is not None:
            self.pairs.mix(logp, ctx[:, -1], cands)
        return self._with_recent(logp, cands, n)

    def chain(self, ctx: np.ndarray, cands: np.ndarray, n: int) -> np.ndarray:
        """(N, F, C) float32 mlm chain scores (and log P_recent(w)): contexts ctx (N, 6)
        of :func:`contexts`, candidates as :meth:`next_token`'s."""
        if not cands.size or not len(ctx):
            return np.zeros((len(ctx), self.columns, cands.shape[-1]), np.float32)
        c = [ctx[:, i:i + 1] for i in range(4)]
        has1, has2 = ctx[:, 4:5] == 1, ctx[:, 5:6] == 1
        return self._with_recent(self.kn.chain(*c, has1, has2, _grid(cands), max(n, 1)), cands, n)

    @property
    def stages(self) -> bool:
        """Whether :meth:`next_token_in_order` can score a batch (not with the recent-token
        cache, which has no staged view)."""
        return self.recent is None

    def next_token_in_order(self, ctx: np.ndarray, cands: np.ndarray, n: int, grams: np.ndarray,
                            records: np.ndarray) -> np.ndarray:
        """:meth:`next_token` of a training batch's examples, each scored with the batch's
        records before its own counted too, as a baseline learning record by record has
        them (``records`` (N,): each example's record, ascending; ``grams`` (N, order): each
        example's n-gram; :meth:`KneserNey3.next_token_in_order
        <.kn.KneserNey3.next_token_in_order>`). The tables do not change: :meth:`learn`
        counts the batch after its step, so a skipped step leaves them as they were."""
        if not cands.size or not len(ctx):
            return np.zeros((len(ctx), self.columns, cands.shape[-1]), np.float32)
        (p,) = self.kn.score_in_order(_columns(ctx), [_grid(cands)], max(n, 1), grams, records)
        logp = np.log(np.maximum(p, 1e-30)).astype(np.float32)
        if self.pairs is not None:  # each record's cache holds the batch's records before it
            starts = np.searchsorted(records, records, "left")
            self.pairs.mix(logp, ctx[:, -1], cands, starts, grams[:, -2:])
        return logp[:, None]


class _UnigramWeights:
    """N1+(. w)^0.75 of every candidate (C,), in the candidates' order, kept in step with
    the counts without reading every candidate each step (profile: 5% of a next-token
    step read 8k-20k candidates' statistics). After a learn only the N1+(. w) of the
    tokens that ended a new bigram type (v, w) changed (``KneserNey3.raised``), so only
    those are read again, and new candidates once. Any other change of the tables (a
    restore, a replicas' merge, a halving) shows as a sum of N1+(. w) other than the
    one seen, and then every candidate is read again."""

    def __init__(self, kn: KneserNey3):
        self.kn = kn
        self.weight = np.empty(0)  # (C,) float64
        self.seen = -1.0  # kn.continuations that self.weight (with self.touched) stands for
        self.touched: list[np.ndarray] = []  # hashes whose N1+(. w) may have changed since
        self.sorted = np.empty(0, dtype=np.uint64)  # the candidates' hashes, sorted
        self.ids = np.empty(0, dtype=np.int64)  # their positions among the candidates

    def _read(self, hashes: np.ndarray) -> np.ndarray:
        return self.kn.continuation_counts(hashes).astype(np.float64) ** 0.75

    def learned(self, w: np.ndarray, before: tuple[float, int]) -> None:
        """The tables just counted trigrams ending in ``w``; ``before``: the fingerprint
        (continuations, halvings) before they did."""
        if before == (self.seen, self.kn.halvings) and sum(map(len, self.touched)) < max(len(self.weight), 4096):
            self.touched.append(w)
            self.seen = self.kn.continuations
        else:  # changed outside learn, halved, or unread for long (bounded memory): read everything next time
            self.seen, self.touched = -1.0, []

    def of(self, cands: np.ndarray) -> np.ndarray:
        """The weights (C,) of ``cands`` (the count part's candidates: append-only)."""
        n, have = len(cands), len(self.weight)
        if self.seen != self.kn.continuations or n < have:
            self.weight, self.touched, self.seen = self._read(cands), [], self.kn.continuations
            self.ids = np.argsort(cands, kind="stable")
            self.sorted = cands[self.ids]
            return self.weight
        if n > have:
            fresh = cands[have:]
            self.weight = np.concatenate([self.weight, self._read(fresh)])
            order = np.argsort(fresh, kind="stable")
            at = np.searchsorted(self.sorted, fresh[order])
            self.sorted = np.insert(self.sorted, at, fresh[order])
            self.ids = np.insert(self.ids, at, have + order)
        if self.touched and n:
            hashes = distinct(np.concatenate(self.touched))
            at = np.minimum(np.searchsorted(self.sorted, hashes), len(self.sorted) - 1)
            known = self.sorted[at] == hashes
            self.weight[self.ids[at[known]]] = self._read(hashes[known])
            self.touched = []
        return self.weight


def _columns(ctx: np.ndarray) -> tuple[np.ndarray, ...]:
    """Contexts (N, k) as k arrays (N, 1), one per place."""
    return tuple(ctx[:, j:j + 1] for j in range(ctx.shape[1]))


def _grid(cands: np.ndarray) -> np.ndarray:
    """Candidates as the (examples, candidates) grid's second axis: (C,) -> (1, C)."""
    return cands[None] if cands.ndim == 1 else cands
