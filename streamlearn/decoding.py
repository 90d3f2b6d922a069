"""Top-k decoding over the tokens the stream has shown.

Hashed output heads never see a vocabulary: Superbloom's head gives m log-softmax rows
over a hash space of ``size`` buckets, T-Free's head gives v sigmoid activations. Turning
either back into tokens needs a list of candidates, and that list is the
:class:`CandidateIndex` (or, for T-Free, the :class:`PatternIndex`): every token the
stream has shown, grown online, used for decoding only and never for training.

- :func:`beam_topk` is Superbloom's Algorithm 1 (a threshold algorithm over the m sorted
  lists) with its exactness certificate; :func:`exhaustive_topk` scores every candidate.
- :func:`exhaustive_topk_many` scores every candidate for a whole batch at once (one
  gather and sum over (N, m, n)), optionally excluding candidates per position (a user's
  already-rated items): cheaper than beam search whenever the beam would cover the lists.
- :func:`tfree_topk` scores every candidate word's trigram pattern (a sparse mat-vec).

Ties are broken by candidate order (the order tokens were first added), so every result
is deterministic. See docs/decoding.md for the algorithm and why the certificate is sound.

>>> index = CandidateIndex.superbloom(m=2, size=8, seed=0)
>>> index.add(["cat", "dog", "cat", 7])
3
>>> logp = np.log(np.full((2, 8), 1 / 8))
>>> top = beam_topk(logp, index, k=2, beam=8)
>>> top.tokens, top.exact, top.visited  # all tied: only a full scan certifies the order
(['cat', 'dog'], True, 3)
>>> logp[1, index.hashes[1, 1]] += 1.0  # favour dog's second-hash bucket
>>> beam_topk(logp, index, k=1, beam=1).tokens
['dog']
"""
from __future__ import annotations

import numbers
import threading
from dataclasses import dataclass
from functools import partial
from typing import Any, Callable, Sequence

import numpy as np

from .exceptions import StreamlearnError
from .hashing import canonical_id, multi_hash, tfree_hashes

Hasher = Callable[[Sequence[str]], np.ndarray]
PatternHasher = Callable[[Sequence[str]], "tuple[np.ndarray, np.ndarray]"]

# A query scans the not-yet-merged tail linearly; merging rewrites the whole inverse map.
# Merging once the tail exceeds 1/32 of the merged part keeps both costs bounded: a query
# pays at most n/32 extra lookups and each added token pays ~32 element moves amortised.
_TAIL_MIN = 2048
_TAIL_FRACTION = 32
_PROB_EPS = 1e-7  # activations are clipped to [eps, 1 - eps] before taking logits


class DecodingError(StreamlearnError, ValueError):
    """Decoding input (scores, tokens, k, beam, a hasher's output) is invalid."""


@dataclass(frozen=True)
class TopK:
    """The best candidates, best first.

    ``scores`` (len(tokens),) float64 are exact scores of the returned tokens.
    ``exact``: the result is certified equal to :func:`exhaustive_topk`'s (same tokens,
    order and scores, ties broken by candidate order).
    ``visited``: how many candidates were scored.
    """

    tokens: list[str]
    scores: np.ndarray
    exact: bool
    visited: int


# ---------------------------------------------------------------------------- candidate log

class _CandidateLog:
    """Order-preserving, duplicate-free token list with checkpoint marks.

    Subclasses hash each batch of new tokens once (``_append_codes``). Mutations hold a
    lock and readers take a consistent view, so a service thread can decode while the
    learner adds tokens.
    """

    def __init__(self) -> None:
        self._tokens: list[str] = []
        self._pos: dict[str, int] = {}
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._tokens)

    def __contains__(self, token: object) -> bool:
        try:
            return canonical_id(token) in self._pos  # type: ignore[arg-type]
        except TypeError:
            return False

    @property
    def tokens(self) -> list[str]:
        """A copy of the candidates in insertion order."""
        return self._tokens[:len(self)]

    @property
    def mark(self) -> int:
        """A counter for :meth:`new_since`: the number of candidates so far."""
        return len(self._tokens)

    def ids(self, tokens: Sequence[str | int]) -> np.ndarray:
        """(len(tokens),) int64 candidate id of each token (its position in :attr:`tokens`),
        -1 for a token not in the index."""
        pos = self._pos
        return np.fromiter((pos.get(t, -1) for t in _canonical(tokens)), dtype=np.int64, count=len(tokens))

    def new_since(self, mark: int) -> list[str]:
        """The candidates added after ``mark`` (from :attr:`mark`), in order; a checkpoint
        stores only these, and :meth:`extend` replays them."""
        if not 0 <= mark <= len(self):
            raise DecodingError(f"mark {mark} is outside [0, {len(self)}]: pass a value of index.mark")
        return self._tokens[mark:]

    def add(self, tokens: Sequence[str | int]) -> int:
        """Add the tokens not yet present (ints map to their decimal string, as in
        hashing.canonical_id); hash them in one call. Returns how many were new."""
        return self._append(list(dict.fromkeys(_canonical(tokens))), strict=False)

    def extend(self, tokens: Sequence[str | int]) -> int:
        """Restore tokens saved by :meth:`new_since`, in order. Strict: a token already
        present means the checkpoints being replayed do not chain, so it raises rather
        than silently yield an index that differs from the one saved."""
        toks = _canonical(tokens)
        if len(set(toks)) != len(toks):
            dup = next(t for t in toks if toks.count(t) > 1)
            raise DecodingError(f"extend: token {dup!r} is already in the index; restore each "
                                "checkpoint's new_since() list once, in checkpoint order")
        return self._append(toks, strict=True)

    def _append(self, toks: list[str], strict: bool) -> int:
        with self._lock:  # the membership test too: two adders must not both add a token
            fresh = [t for t in toks if t not in self._pos]
            if strict and len(fresh) != len(toks):
                dup = next(t for t in toks if t in self._pos)
                raise DecodingError(f"extend: token {dup!r} is already in the index; restore each "
                                    "checkpoint's new_since() list once, in checkpoint order")
            if not fresh:
                return 0
            self._append_codes(fresh)
            base = len(self._tokens)
            self._pos.update(zip(fresh, range(base, base + len(fresh))))
            self._tokens.extend(fresh)
        return len(fresh)

    def _append_codes(self, fresh: list[str]) -> None:
        raise NotImplementedError


def _canonical(tokens: Sequence[str | int]) -> list[str]:
    if isinstance(tokens, (str, bytes)):
        raise DecodingError("add/extend take a sequence of tokens, got a single string: wrap it in a list")
    try:
        return [t if type(t) is str else canonical_id(t) for t in tokens]
    except TypeError as exc:
        raise DecodingError(f"candidate tokens must be str or int: {exc}") from exc


def _grow(buf: np.ndarray, used: int, rows: np.ndarray) -> np.ndarray:
    """Append ``rows`` after ``buf[:used]``, doubling capacity when full (amortised O(1);
    views of the old buffer taken by readers stay valid)."""
    need = used + len(rows)
    if need > len(buf):
        new = np.empty((max(need, 2 * len(buf), 64),) + buf.shape[1:], dtype=buf.dtype)
        new[:used] = buf[:used]
        buf = new
    buf[used:need] = rows
    return buf


# ---------------------------------------------------------------------------- Superbloom index

@dataclass(frozen=True)
class _View:
    """An immutable snapshot of a :class:`CandidateIndex` for one query (or batch)."""

    tokens: list[str]  # shared, append-only: entries [0, n) never change
    hashes: np.ndarray  # (n, m) bucket of each candidate under each hash
    indptr: np.ndarray  # (m * size + 1,) CSR over global buckets j * size + h
    members: np.ndarray  # (n_base * m,) candidate ids, ascending within each bucket
    tail_keys: np.ndarray  # (n - n_base, m) global buckets of the unmerged tail

    @property
    def n(self) -> int:
        return len(self.hashes)

    def in_buckets(self, buckets: np.ndarray, visited: np.ndarray | None) -> np.ndarray:
        """Candidate ids in the global ``buckets`` (may repeat). ``visited`` (m * size,)
        marks every bucket visited so far (these included); it finds tail members."""
        starts = self.indptr[buckets]
        found = _gather_ranges(self.members, starts, self.indptr[buckets + 1] - starts)
        if not len(self.tail_keys):
            return found
        hit = np.flatnonzero(visited[self.tail_keys].any(axis=1))
        return np.concatenate([found, hit + (self.n - len(self.tail_keys))])


def _gather_ranges(arr: np.ndarray, starts: np.ndarray, lens: np.ndarray) -> np.ndarray:
    """``concatenate([arr[s:s + l] for s, l in zip(starts, lens)])`` without the loop."""
    total = int(lens.sum())
    if total == 0:
        return np.empty(0, dtype=arr.dtype)
    shift = np.repeat(starts - (np.cumsum(lens) - lens), lens)
    return arr[shift + np.arange(total)]


class CandidateIndex(_CandidateLog):
    """Superbloom's candidates with their m output hashes and the inverse maps
    bucket -> candidates (one CSR over all m * size global buckets).

    ``hasher(tokens)`` must return int64 (N, m) ids in [0, size), e.g.
    ``partial(hashing.multi_hash, n=m, size=size, seed=seed, purpose="out")``
    (:meth:`superbloom`). New candidates land in an append-only tail that queries scan
    directly; the tail is merged into the CSR lazily, at query time, once it exceeds
    ``max(merge_min, merged / 32)`` candidates.
    """

    merge_min: int = _TAIL_MIN

    def __init__(self, m: int, size: int, hasher: Hasher):
        super().__init__()
        if m < 1 or size < 1:
            raise DecodingError(f"CandidateIndex needs m >= 1 and size >= 1, got m={m}, size={size}")
        self.m, self.size, self._hasher = m, size, hasher
        self._hashes = np.empty((0, m), dtype=np.int64)
        self._indptr = np.zeros(m * size + 1, dtype=np.int64)
        self._members = np.empty(0, dtype=np.int64)
        self._n_base = 0

    @classmethod
    def superbloom(cls, m: int, size: int, seed: int, purpose: str = "out") -> "CandidateIndex":
        """An index over hashing.multi_hash(tokens, m, size, seed, purpose)."""
        return cls(m, size, partial(multi_hash, n=m, size=size, seed=seed, purpose=purpose))

    @property
    def hashes(self) -> np.ndarray:
        """(n, m) int64: candidate i's bucket under hash j (a read-only view)."""
        out = self._hashes[:len(self)]
        out.flags.writeable = False
        return out

    def _append_codes(self, fresh: list[str]) -> None:
        h = np.asarray(self._hasher(fresh))
        if h.shape != (len(fresh), self.m) or h.dtype.kind not in "iu":
            raise DecodingError(f"hasher returned {h.dtype} {h.shape}; expected int (N, m) = "
                                f"({len(fresh)}, {self.m})")
        if len(h) and (h.min() < 0 or h.max() >= self.size):
            raise DecodingError(f"hasher returned ids outside [0, {self.size}): hash into the index's size")
        self._hashes = _grow(self._hashes, len(self._tokens), h.astype(np.int64))

    def view(self) -> _View:
        """A consistent snapshot for queries, merging the tail first if it is large."""
        with self._lock:
            n = len(self._tokens)
            if n - self._n_base > max(self.merge_min, self._n_base // _TAIL_FRACTION):
                self._merge(n)
            offsets = np.arange(self.m, dtype=np.int64) * self.size
            return _View(self._tokens, self._hashes[:n], self._indptr, self._members,
                         self._hashes[self._n_base:n] + offsets)

    def _merge(self, n: int) -> None:
        # The merged part's keys are already sorted, so the stable sort is one long run
        # plus the tail (timsort merges them in ~linear time); stability keeps ids
        # ascending within each bucket, which is what makes ties break by candidate order.
        G = self.m * self.size
        old_keys = np.repeat(np.arange(G, dtype=np.int64), np.diff(self._indptr))
        tail = self._hashes[self._n_base:n] + np.arange(self.m, dtype=np.int64) * self.size
        keys = np.concatenate([old_keys, tail.ravel()])
        ids = np.concatenate([self._members, np.repeat(np.arange(self._n_base, n), self.m)])
        order = np.argsort(keys, kind="stable")
        indptr = np.zeros(G + 1, dtype=np.int64)
        np.cumsum(np.bincount(keys, minlength=G), out=indptr[1:])
        self._members, self._indptr, self._n_base = ids[order], indptr, n


# ---------------------------------------------------------------------------- beam search

def _rowsum(x: np.ndarray) -> np.ndarray:
    """Sum over the last axis left to right. One fixed order for candidate scores and
    certificate bounds: IEEE addition is monotone, so a bound summed the same way is
    still an upper bound after rounding."""
    out = x[..., 0].copy()
    for j in range(1, x.shape[-1]):
        out += x[..., j]
    return out


def _score(logp: np.ndarray, hashes: np.ndarray) -> np.ndarray:
    """sum_j logp[j, h_j(x)] for each row of ``hashes`` (c, m) -> (c,)."""
    return _rowsum(logp[np.arange(logp.shape[0]), hashes])


def _best(ids: np.ndarray, scores: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The k best (score descending, then id ascending), best first."""
    if len(scores) > 2 * k:
        kth = np.partition(scores, len(scores) - k)[len(scores) - k]
        keep = scores >= kth  # keeps every tie at the k-th score, so the tie-break is exact
        ids, scores = ids[keep], scores[keep]
    order = np.lexsort((ids, -scores))[:k]
    return ids[order], scores[order]


def _as_scores(x, shape: tuple[int, ...], what: str) -> np.ndarray:
    """:func:`_as_array` as float64, value-checked."""
    a = _as_array(x, shape, what).astype(np.float64, copy=False)
    if np.isnan(a).any() or np.isposinf(a).any():
        raise DecodingError(f"{what} contains NaN or +inf: check the model output (log-probabilities are <= 0)")
    return a


def check_k(k: Any) -> int:
    """``k`` (answers per query) as an int; DecodingError unless it is an integer >= 1
    (one rule for every task and verb: top-k, explanations)."""
    if isinstance(k, bool) or not isinstance(k, numbers.Integral) or k < 1:
        raise DecodingError(f"k must be an int >= 1, got {k!r}")
    return int(k)


def check_beam(beam: Any) -> int | None:
    """``beam`` (the hashed head's search width) as an int, or None (the model's
    ``learner.beam``, at least k); DecodingError unless it is an integer >= 1 or None."""
    if beam is None:
        return None
    if isinstance(beam, bool) or not isinstance(beam, numbers.Integral) or beam < 1:
        raise DecodingError(f"beam must be an int >= 1 or None (the model's learner.beam), got {beam!r}")
    return int(beam)


def _check_k(k: int, beam: int = 1) -> None:
    def positive_int(x) -> bool:
        return isinstance(x, (int, np.integer)) and not isinstance(x, bool) and x >= 1

    if not (positive_int(k) and positive_int(beam)):
        raise DecodingError(f"k and beam must be integers >= 1, got k={k}, beam={beam}")


def _sorted_lists(logp: np.ndarray, width: int) -> tuple[np.ndarray, np.ndarray]:
    """Each list j sorted descending, to depth ``width``: ``order`` (..., m, width) bucket
    ids and ``top`` (..., m, width + 1) their log-probs; ``top[..., width]`` is the best
    value left unvisited at full depth (-inf when width == size)."""
    size = logp.shape[-1]
    t = min(width + 1, size)
    if t < size:
        part = np.argpartition(-logp, t - 1, axis=-1)[..., :t]
    else:
        part = np.broadcast_to(np.arange(size), logp.shape)
    vals = np.take_along_axis(logp, part, axis=-1)
    o = np.argsort(-vals, axis=-1, kind="stable")
    part, vals = np.take_along_axis(part, o, axis=-1), np.take_along_axis(vals, o, axis=-1)
    if t == width:  # width == size: nothing is left unvisited
        vals = np.concatenate([vals, np.full(vals.shape[:-1] + (1,), -np.inf)], axis=-1)
    return part[..., :width], vals


def _search(logp: np.ndarray, order: np.ndarray, top: np.ndarray, view: _View, k: int) -> TopK:
    """Algorithm 1 for one position: logp (m, size), order (m, width), top (m, width + 1)."""
    m, size = logp.shape
    width = order.shape[1]
    offsets = (np.arange(m, dtype=np.int64) * size)[:, None]
    scored = np.zeros(view.n, dtype=bool)
    visited = np.zeros(m * size, dtype=bool) if len(view.tail_keys) else None
    ids, scores = np.empty(0, np.int64), np.empty(0)
    depth, count, exact = 0, 0, view.n == 0
    while depth < width and not exact:
        # The beam doubles each round (the paper's "increase the beam width"): log2(beam)
        # rounds of numpy work instead of one Python iteration per depth.
        nxt = min(width, max(1, 2 * depth))
        buckets = (order[:, depth:nxt] + offsets).ravel()
        if visited is not None:
            visited[buckets] = True
        cand = np.unique(view.in_buckets(buckets, visited))
        cand = cand[~scored[cand]]
        scored[cand] = True
        count += len(cand)
        ids, scores = _best(np.concatenate([ids, cand]),
                            np.concatenate([scores, _score(logp, view.hashes[cand])]), k)
        depth = nxt
        bound = _rowsum(top[:, depth])  # no unscored candidate can score above this
        # Strict: with ">=" (the paper's test) an unscored candidate tied at the k-th
        # score could precede a returned one in candidate order; ">" certifies the exact
        # exhaustive answer, tie-break included, and differs only on exact float ties.
        exact = bool(count == view.n or (len(ids) == k and scores[-1] > bound))
    return TopK([view.tokens[i] for i in ids], scores, exact, count)


def beam_topk(logp, index: CandidateIndex, k: int, beam: int) -> TopK:
    """Superbloom's beam search for the k candidates maximising sum_j logp[j, h_j(x)].

    ``logp`` (m, size), numpy or torch: row j is a log-softmax over hash space j. Walks
    the m lists from their best buckets, at most ``beam`` buckets deep per list, scoring
    every candidate of each visited bucket exactly, and stops as soon as the k-th best
    score exceeds the sum over j of the best unvisited log-prob (the certificate; then
    ``exact=True``). Without the certificate after ``beam`` levels, ``exact=False``.
    ``beam >= size`` is exhaustive. Fewer than k candidates: all of them, exact.
    """
    _check_k(k, beam)
    lp = _as_scores(logp, (index.m, index.size), "logp")
    if lp.ndim != 2:
        raise DecodingError(f"logp has shape {lp.shape}; pass one position (m, size), or use beam_topk_many")
    return beam_topk_many(lp[None], index, k, beam)[0]


def beam_topk_many(logp, index: CandidateIndex, k: int, beam: int) -> list[TopK]:
    """:func:`beam_topk` for N positions, logp (N, m, size): one sort for all N, one
    consistent view of the index."""
    _check_k(k, beam)
    lp = _as_scores(logp, (index.m, index.size), "logp")
    if lp.ndim != 3:
        raise DecodingError(f"logp has shape {lp.shape}; expected (N, m, size)")
    view = index.view()
    order, top = _sorted_lists(lp, min(int(beam), index.size))
    return [_search(lp[i], order[i], top[i], view, int(k)) for i in range(len(lp))]


def exhaustive_topk(logp, index: CandidateIndex, k: int) -> TopK:
    """Score every candidate: the reference for :func:`beam_topk`, O(n m)."""
    _check_k(k)
    lp = _as_scores(logp, (index.m, index.size), "logp")
    if lp.ndim != 2:
        raise DecodingError(f"logp has shape {lp.shape}; expected (m, size)")
    view = index.view()
    ids, scores = _best(np.arange(view.n), _score(lp, view.hashes), int(k))
    return TopK([view.tokens[i] for i in ids], scores, True, view.n)


def exhaustive_topk_many(logp, index: CandidateIndex, k: int,
                         exclude: Sequence[np.ndarray] | None = None, fresh: Fresh | None = None) -> list[TopK]:
    """:func:`exhaustive_topk` for N positions, logp (N, m, size), batched: every
    candidate's score for every position is one gather and sum over (N, m, n), and the k
    best from one lexsort over the entries at or above a bound on each row's k-th best
    (:func:`_best_many`). Results equal :func:`exhaustive_topk`'s
    row by row (same tokens, order, scores, tie-break), all ``exact``. Only the buckets
    of candidates are read, so only there are NaN and +inf an error.

    ``exclude``: per position, candidate ids (:meth:`CandidateIndex.ids`; -1 and ids
    past the candidates are ignored) that may not be returned, e.g. the items a user already
    had. A position then gets its k best allowed candidates (fewer if fewer are allowed).

    ``fresh``: candidates not in the index yet (:class:`Fresh`), after its n: ids n, n + 1,
    ... in ``exclude``, and ties broken after every indexed candidate.
    """
    _check_k(k)
    lp = _as_array(logp, (index.m, index.size), "logp")
    if lp.ndim != 3:
        raise DecodingError(f"logp has shape {lp.shape}; expected (N, m, size)")
    if exclude is not None and len(exclude) != len(lp):
        raise DecodingError(f"exclude has {len(exclude)} entries for {len(lp)} positions: pass one id array per position")
    view = index.view()
    hashes, tokens = view.hashes, view.tokens
    if fresh is not None:
        hashes, tokens = np.concatenate([hashes, fresh.hashes]), tokens[:view.n] + list(fresh.tokens)
    scores = _score_many(lp, hashes)  # (N, n) float64
    if not (scores < np.inf).all():  # NaN compares False
        raise DecodingError("logp contains NaN or +inf: check the model output (log-probabilities are <= 0)")
    banned = _ban(scores, exclude) if exclude is not None else None
    if fresh is not None:  # a fresh candidate is barred from the rows before its first
        rows, cols = np.nonzero(np.arange(len(lp))[:, None] < np.asarray(fresh.since)[None, :])
        cols = cols + view.n
        scores[rows, cols] = -np.inf
        banned = (rows, cols) if banned is None else (np.concatenate([banned[0], rows]), np.concatenate([banned[1], cols]))
    return [TopK([tokens[i] for i in ids.tolist()], s, True, len(tokens)) for ids, s in _best_many(scores, int(k), banned)]


@dataclass(frozen=True)
class Fresh:
    """Candidates a batch brings before the index holds them (a training batch predicted
    before it is learned, its records in stream order): ``tokens`` (F,), their output
    hashes ``hashes`` (F, m), and ``since`` (F,) the first position (row) each may be
    answered at: the positions after the record that first showed it."""

    tokens: Sequence[str]
    hashes: np.ndarray
    since: np.ndarray


def candidate_topk_many(scores, index: CandidateIndex, k: int,
                        exclude: Sequence[np.ndarray] | None = None) -> list[TopK]:
    """The k best candidates per position from their scores given directly, ``scores``
    (N, n) for the index's n candidates in order (a head that scores candidates itself:
    the sampled-softmax head's log-probabilities over the candidates). Exact, ties by
    candidate id, ``exclude`` as :func:`exhaustive_topk_many`'s."""
    _check_k(k)
    scores = np.array(scores, dtype=np.float64)  # a copy: excluded entries are set to -inf
    n = len(index)
    if scores.ndim != 2 or scores.shape[1] != n:
        raise DecodingError(f"scores have shape {scores.shape}; expected (N, {n}) for the index's {n} candidates")
    if not (scores < np.inf).all():
        raise DecodingError("scores contain NaN or +inf: check the model output")
    if exclude is not None and len(exclude) != len(scores):
        raise DecodingError(f"exclude has {len(exclude)} entries for {len(scores)} positions")
    if not n:
        return [TopK([], np.empty(0), True, 0) for _ in range(len(scores))]
    banned = _ban(scores, exclude) if exclude is not None else None
    tokens = index.tokens
    return [TopK([tokens[i] for i in ids.tolist()], s, True, n) for ids, s in _best_many(scores, int(k), banned)]


def _as_array(x, shape: tuple[int, ...], what: str) -> np.ndarray:
    """numpy view of a numpy array or torch tensor, shape-checked, in its own numeric
    dtype (no copy: batched callers check values where they read them)."""
    if hasattr(x, "detach"):
        x = x.detach().cpu().numpy()
    try:
        a = np.asarray(x)
    except (TypeError, ValueError) as exc:
        raise DecodingError(f"{what} must be a numeric array or tensor: {exc}") from exc
    if a.dtype.kind not in "fiu":
        raise DecodingError(f"{what} must be a numeric array or tensor, got dtype {a.dtype}")
    if a.ndim < len(shape) or a.shape[a.ndim - len(shape):] != shape:
        raise DecodingError(f"{what} has shape {a.shape}; expected (..., {', '.join(map(str, shape))}) "
                            "to match the index")
    return a


def _score_many(lp: np.ndarray, hashes: np.ndarray) -> np.ndarray:
    """:func:`_score` for every row of ``lp`` (N, m, size) -> (N, n) float64: one
    (N, n) gather per hash, summed in :func:`_rowsum`'s order (float32 inputs widen
    exactly, so scores equal :func:`_score`'s on the float64 copy)."""
    out = np.take(lp[:, 0], hashes[:, 0], axis=1).astype(np.float64)
    for j in range(1, hashes.shape[1]):
        out += np.take(lp[:, j], hashes[:, j], axis=1)
    return out


def _ban(scores: np.ndarray, exclude: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Set ``scores[i, c]`` to -inf for every excluded candidate c of position i (in
    place); returns the (rows, cols) set."""
    lens = np.fromiter((len(e) for e in exclude), dtype=np.int64, count=len(exclude))
    if not lens.sum():
        return np.empty(0, np.int64), np.empty(0, np.int64)
    cols = np.concatenate(exclude).astype(np.int64, copy=False)
    rows = np.repeat(np.arange(len(exclude)), lens)
    ok = (cols >= 0) & (cols < scores.shape[1])  # not (yet) a candidate: nothing to exclude
    rows, cols = rows[ok], cols[ok]
    scores[rows, cols] = -np.inf
    return rows, cols


_BLOCK = 64  # columns per block of _at_most_kth


def _at_most_kth(scores: np.ndarray, k: int) -> np.ndarray:
    """Per row of ``scores`` (N, n), n > k, a value with at least k entries at or above it,
    so at most the row's k-th best: the k-th best of its blocks' maxima (k blocks have an
    entry that high), or the k-th best itself where there are too few blocks. A partition
    of the blocks' maxima instead of every entry: 2 against 44 ms for 312 rows of 12,000
    candidates (a next-token replay's batch; the whole top-k 11 against 44 ms), and the
    entries kept stay few, at most those of the blocks whose maxima reach the bound."""
    n = scores.shape[1]
    if n < 4 * k * _BLOCK:
        return np.partition(scores, n - k, axis=1)[:, n - k]
    maxima = np.maximum.reduceat(scores, np.arange(0, n, _BLOCK), axis=1)  # (N, blocks)
    return np.partition(maxima, maxima.shape[1] - k, axis=1)[:, maxima.shape[1] - k]


def _best_many(scores: np.ndarray, k: int,
               banned: tuple[np.ndarray, np.ndarray] | None) -> list[tuple[np.ndarray, np.ndarray]]:
    """:func:`_best` for every row of ``scores`` (N, n), whose ``banned`` (rows, cols)
    entries (already -inf) may not be returned.

    A bound at or below each row's k-th best score (:func:`_at_most_kth`) keeps every entry
    at or above it (the k best and their ties, so the tie-break by candidate id is exact)
    and one lexsort orders the kept entries by (row, score descending, id). A row whose
    bound is -inf keeps all its entries, banned ones too (a banned -inf and a true -inf
    look alike): those are dropped by their (row, col) before ranking."""
    N, n = scores.shape
    if n > k:
        kth = _at_most_kth(scores, k)  # (N,) at most each row's k-th best score
        rows, cols = np.nonzero(scores >= kth[:, None])  # row-major: ids ascending per row
        deep = banned is not None and len(banned[0]) and (kth == -np.inf).any()
    else:
        rows, cols = np.repeat(np.arange(N), n), np.tile(np.arange(n), N)
        deep = banned is not None and len(banned[0])
    if deep:
        mask = np.zeros(scores.shape, dtype=bool)
        mask[banned] = True
        keep = ~mask[rows, cols]
        rows, cols = rows[keep], cols[keep]
    vals = scores[rows, cols]
    order = np.lexsort((cols, -vals, rows))
    rows, cols, vals = rows[order], cols[order], vals[order]
    ends = np.cumsum(np.bincount(rows, minlength=N))
    starts = ends - np.bincount(rows, minlength=N)
    return [(cols[a:min(b, a + k)], vals[a:min(b, a + k)]) for a, b in zip(starts.tolist(), ends.tolist())]


# ---------------------------------------------------------------------------- T-Free

class PatternIndex(_CandidateLog):
    """T-Free's candidate words with their sparse activation patterns: the *distinct*
    rows in [0, size) hit by the m hashes of the word's trigrams (the paper's binary
    word-activation matrix A, one CSR row per word).

    ``hasher(words)`` returns CSR ``(ids (M,), offsets (N + 1,))`` like
    hashing.tfree_hashes (:meth:`tfree`); repeated rows within a word are dropped.
    """

    def __init__(self, size: int, hasher: PatternHasher):
        super().__init__()
        if size < 1:
            raise DecodingError(f"PatternIndex needs size >= 1, got {size}")
        self.size, self._hasher = size, hasher
        self._rows = np.empty(0, dtype=np.int64)  # (E,) pattern rows, word by word
        self._owner = np.empty(0, dtype=np.int64)  # (E,) the word of each entry
        self._offsets = np.zeros(1, dtype=np.int64)  # (n + 1,)

    @classmethod
    def tfree(cls, m: int, v: int, seed: int) -> "PatternIndex":
        """An index over hashing.tfree_hashes(words, m, v, seed)."""
        return cls(v, partial(tfree_hashes, m=m, v=v, seed=seed))

    def pattern(self, token: str) -> np.ndarray:
        """The sorted distinct rows of a candidate's pattern."""
        if token not in self:
            raise DecodingError(f"{token!r} is not in the index: add() it first")
        i = self._pos[canonical_id(token)]
        return self._rows[self._offsets[i]:self._offsets[i + 1]].copy()

    def _append_codes(self, fresh: list[str]) -> None:
        rows, owner = _dedupe_csr(*self._checked(fresh))
        n = len(self._tokens)
        used = int(self._offsets[n])  # the buffer has spare capacity: [-1] is not the end
        counts = np.bincount(owner, minlength=len(fresh))
        self._rows = _grow(self._rows, used, rows)
        self._owner = _grow(self._owner, used, owner + n)
        self._offsets = _grow(self._offsets, n + 1, used + np.cumsum(counts))

    def _checked(self, fresh: list[str]) -> tuple[np.ndarray, np.ndarray]:
        ids, offsets = (np.asarray(a) for a in self._hasher(fresh))
        ok = (ids.ndim == 1 and offsets.shape == (len(fresh) + 1,) and ids.dtype.kind in "iu"
              and offsets[0] == 0 and offsets[-1] == len(ids) and (np.diff(offsets) >= 0).all())
        if not ok:
            raise DecodingError("pattern hasher must return CSR (ids (M,), offsets (N + 1,)) "
                                "like hashing.tfree_hashes")
        if len(ids) and (ids.min() < 0 or ids.max() >= self.size):
            raise DecodingError(f"pattern hasher returned rows outside [0, {self.size}): hash into v = size")
        return ids.astype(np.int64), offsets.astype(np.int64)

    def view(self) -> tuple[list[str], np.ndarray, np.ndarray]:
        """(tokens, rows (E,), owner (E,)) consistent with each other."""
        with self._lock:
            used = int(self._offsets[len(self._tokens)])
            return self._tokens, self._rows[:used], self._owner[:used]


def _dedupe_csr(ids: np.ndarray, offsets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Distinct ids per CSR row, sorted: (rows (E,), owner (E,))."""
    owner = np.repeat(np.arange(len(offsets) - 1), np.diff(offsets))
    order = np.lexsort((ids, owner))
    ids, owner = ids[order], owner[order]
    keep = np.ones(len(ids), dtype=bool)
    keep[1:] = (ids[1:] != ids[:-1]) | (owner[1:] != owner[:-1])
    return ids[keep], owner[keep]


def tfree_topk(act, index: PatternIndex, k: int, kind: str = "logits", rule: str = "bce") -> TopK:
    """The k candidate words whose T-Free pattern best explains the head's output.

    ``act`` (v,): the head's logits (``kind="logits"``) or sigmoid activations
    (``kind="probs"``, clipped to [1e-7, 1 - 1e-7]). Rules, over each word's distinct
    pattern rows P(w):

    - ``"bce"`` (default): sum_{r in P(w)} logit_r. This is log P(pattern = P(w)) under
      the independent sigmoids the head is trained with (multi-label BCE), minus the
      word-independent log P(no row on): rows a word needs on count for it and rows the
      head turned on that the word does not use are not rewarded, so neither long words
      nor words whose pattern is a subset of another's win by construction.
    - ``"paper"``: z = A sigmoid(s), then z / sum(z) and a softmax over the candidates
      (both monotone, so the ranking is that of z); scores are those probabilities. z
      favours long words: a word containing another's pattern scores at least as high.

    Every candidate is scored (a sparse mat-vec, O(E)), so the result is always exact.
    """
    _check_k(k)
    if kind not in ("logits", "probs"):
        raise DecodingError(f"kind must be 'logits' or 'probs', got {kind!r}")
    a = _as_scores(act, (index.size,), "act") if kind == "logits" else _probs(act, index.size)
    if a.ndim != 1:
        raise DecodingError(f"act has shape {a.shape}; expected (v,) = ({index.size},)")
    tokens, rows, owner = index.view()
    n = len(tokens)
    scores = _pattern_scores(a, kind, rule, rows, owner, n)
    ids, best = _best(np.arange(n), scores, int(k))
    return TopK([tokens[i] for i in ids], best, True, n)


def _probs(act, size: int) -> np.ndarray:
    p = _as_scores(act, (size,), "act")
    if (p < 0).any() or (p > 1).any():
        raise DecodingError("act has values outside [0, 1]; pass kind='logits' for raw head outputs")
    return np.clip(p, _PROB_EPS, 1 - _PROB_EPS)


def _pattern_scores(a: np.ndarray, kind: str, rule: str, rows: np.ndarray,
                    owner: np.ndarray, n: int) -> np.ndarray:
    if rule == "bce":
        logits = a if kind == "logits" else np.log(a) - np.log1p(-a)
        return np.bincount(owner, weights=logits[rows], minlength=n)
    if rule == "paper":
        sig = 1 / (1 + np.exp(-a)) if kind == "logits" else a
        z = np.bincount(owner, weights=sig[rows], minlength=n)
        z = z / max(z.sum(), np.finfo(float).tiny)
        e = np.exp(z - z.max(initial=0.0))
        return e / e.sum()
    raise DecodingError(f"rule must be 'bce' or 'paper', got {rule!r}")
