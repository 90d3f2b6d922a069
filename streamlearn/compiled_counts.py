"""The Kneser-Ney count part's counting compiled (numba): a batch's n-grams into the
count tables in one call per table group.

:meth:`KneserNey3.learn <streamlearn.counts.kn.KneserNey3.learn>` counts a batch in
three table passes of batched numpy: keys mixed, ``np.unique`` of each statistic's keys,
a lock-step probe of the open-addressing table, bincounts and counts-of-counts. On a
depth-0 mlm step that was about 60 numpy calls of a few microseconds each around almost
no arithmetic, a quarter of the step (py-spy, War and Peace, batch 8). The kernels here
do the same passes over the tables' own memory, in the same order, with the same sorts,
so they leave the tables, the scalars and the reported rows **byte for byte** as the
numpy code does (tests/test_counts.py): the same keys land in the same slots, and a
learner may switch from one to the other mid-stream (a worker counts in numpy until
the kernels have loaded, :mod:`streamlearn.compiled_loading`).

Two facts make that exact:

- ``np.unique`` sorts ascending, and its ``return_index`` takes each key's first
  occurrence (a stable sort): here a stable merge sort and a scan.
- :meth:`CountTable._insert <streamlearn.counts.table.CountTable._insert>` claims empty
  slots in rounds, every new key starting from its home slot: each round every key still
  looking probes its current slot, the earliest claimant of an empty slot takes it, the
  rest move one slot on. Walking the keys in order within a round and claiming at once
  is the same: a slot taken earlier in the round reads as occupied, exactly the keys
  that were not its earliest claimant.

The halving of a full table, rare, stays in numpy (the caller halves before it counts).
"""
from __future__ import annotations

import numpy as np
from numba import njit

from .compiled_loading import loaded, start_loading
from .counts.kn import COUNTS_OF_COUNTS, LOW, MIXERS, SPLITMIX, TAG_IDS, TAGS, TOTAL, TYPES
from .counts.table import GOLDEN, ROW, CountTable, TableFullError

__all__ = ["CompiledCounts", "kn_quad_learn", "kn_trigram_learn", "load_count_kernels"]

_MIXERS = np.array(MIXERS, dtype=np.uint64)
_C1, _C2 = SPLITMIX
_S30, _S27, _S31 = np.uint64(30), np.uint64(27), np.uint64(31)
_NOT_LOW = ~LOW
_TAG = {name: (TAGS[name], np.uint64(TAG_IDS[name])) for name in TAG_IDS}
_T3, _T3_ID = _TAG["T3"]
_C3T, _C3_ID = _TAG["C3"]
_T2, _T2_ID = _TAG["T2"]
_C2T, _C2_ID = _TAG["C2"]
_T1, _T1_ID = _TAG["T1"]
_T4, _T4_ID = _TAG["T4"]
_C4T, _C4_ID = _TAG["C4"]
_N1_3, _N2_3 = COUNTS_OF_COUNTS[3]
_N1_2, _N2_2 = COUNTS_OF_COUNTS[2]
_N1_1, _N2_1 = COUNTS_OF_COUNTS[1]
_N1_4, _N2_4 = COUNTS_OF_COUNTS[4]


@njit(cache=True, nogil=True, inline="always")
def _mix(x):
    """splitmix64's finaliser (``streamlearn.counts.kn._mix``)."""
    x = x ^ (x >> _S30)
    x = x * _C1
    x = x ^ (x >> _S27)
    x = x * _C2
    return x ^ (x >> _S31)


@njit(cache=True, nogil=True)
def _keys(tag, tag_id, parts):
    """:func:`~streamlearn.counts.kn.key` of the n-grams whose token hashes are the
    columns of ``parts`` (P, n): every part but the last mixed in, the last xor-ed in."""
    P, n = parts.shape
    out = np.empty(n, np.uint64)
    for i in range(n):
        acc = tag
        for j in range(P - 1):
            acc = _mix(acc ^ (parts[j, i] * _MIXERS[j]))
        out[i] = ((acc ^ (parts[P - 1, i] * _MIXERS[P - 1])) & _NOT_LOW) | tag_id
    return out


@njit(cache=True, nogil=True)
def _unique(keys):
    """``np.unique(keys, return_index=True, return_inverse=True, return_counts=True)``:
    the distinct keys ascending, each one's first occurrence, each key's place, counts."""
    n = len(keys)
    order = np.argsort(keys, kind="mergesort")  # stable: the first occurrence comes first
    groups = 0
    for j in range(n):
        if j == 0 or keys[order[j]] != keys[order[j - 1]]:
            groups += 1
    uniq = np.empty(groups, np.uint64)
    first = np.empty(groups, np.int64)
    counts = np.zeros(groups, np.int64)
    inverse = np.empty(n, np.int64)
    g = -1
    for j in range(n):
        i = order[j]
        if j == 0 or keys[i] != keys[order[j - 1]]:
            g += 1
            uniq[g] = keys[i]
            first[g] = i
        counts[g] += 1
        inverse[i] = g
    return uniq, first, counts, inverse


@njit(cache=True, nogil=True, inline="always")
def _log2(x):
    b = 0
    while (1 << (b + 1)) <= x:
        b += 1
    return b


@njit(cache=True, nogil=True)
def _add(tk, tv, th, max_used, full, keys, d0, d1, old0, old1):
    """:meth:`CountTable.add_unique <streamlearn.counts.table.CountTable.add_unique>` of
    distinct ``keys`` into the table of keys ``tk``, float32 values ``tv`` (two per slot)
    and header ``th``: values += (d0, d1), the old values into old0/old1; returns the
    touched rows (key rows, value rows, the header row), or an empty array with
    ``full[0] = 1`` where the table would pass ``max_used`` occupied slots."""
    slots = len(tk)
    mask = slots - 1
    shift = np.uint64(64 - _log2(slots))
    n = len(keys)
    slot = np.empty(n, np.int64)
    pending = np.empty(n, np.int64)
    at = np.empty(n, np.int64)
    new = 0
    for i in range(n):  # find
        k = keys[i]
        home = np.int64((k * GOLDEN) >> shift)
        idx = home
        while True:
            t = tk[idx]
            if t == k:
                slot[i] = idx
                break
            if t == 0:  # absent: its claim starts over from its home, as numpy's rounds do
                slot[i] = -1
                pending[new] = i
                at[new] = home
                new += 1
                break
            idx = (idx + 1) & mask
    if new:
        if np.float64(th[0] + np.uint64(new)) > max_used:
            full[0] = 1
            return np.empty(0, np.int64)
        th[0] += np.uint64(new)
    while new:  # claim empty slots in rounds (module docstring)
        left = 0
        for j in range(new):
            i, idx = pending[j], at[j]
            if tk[idx] == 0:
                tk[idx] = keys[i]
                slot[i] = idx
            else:
                pending[left] = i
                at[left] = (idx + 1) & mask
                left += 1
        new = left
    for i in range(n):
        s = slot[i]
        a, b = tv[2 * s], tv[2 * s + 1]
        old0[i], old1[i] = a, b
        tv[2 * s] = a + d0[i]
        tv[2 * s + 1] = b + d1[i]
    rows = np.unique(slot // ROW)
    r = len(rows)
    out = np.empty(2 * r + 1, np.int64)
    out[:r] = rows
    out[r:2 * r] = rows + slots // ROW
    out[2 * r] = 2 * (slots // ROW)
    return out


@njit(cache=True, nogil=True)
def _counts_of_counts(s, n1, n2, old, add):
    """s[n1] += #(old + add == 1) - #(old == 1), and alike for 2 (float32, as numpy's)."""
    d1 = 0
    d2 = 0
    for i in range(len(old)):
        new = old[i] + np.float32(add[i])
        d1 += int(new == 1) - int(old[i] == 1)
        d2 += int(new == 2) - int(old[i] == 2)
    s[n1] += np.float32(d1)
    s[n2] += np.float32(d2)


@njit(cache=True, nogil=True)
def _occurrences(tk, tv, th, max_used, full, s, n1, n2, kt, kc):
    """The first pass of an order counted by occurrence (``KneserNey3._count_occurrences``):
    c(ctx w) and c(ctx .), the order's counts-of-counts; (touched rows, the index of the
    first occurrence of each type new in this batch)."""
    ukt, first, cnt, _ = _unique(kt)
    ukc, _, cntc, _ = _unique(kc)
    t, c = len(ukt), len(ukc)
    keys = np.concatenate((ukt, ukc))
    d0 = np.empty(t + c, np.float32)
    d0[:t] = cnt
    d0[t:] = cntc
    old0 = np.empty(t + c, np.float32)
    old1 = np.empty(t + c, np.float32)
    rows = _add(tk, tv, th, max_used, full, keys, d0, np.zeros(t + c, np.float32), old0, old1)
    if full[0]:
        return rows, np.empty(0, np.int64)
    _counts_of_counts(s, n1, n2, old0[:t], cnt)
    fresh = 0
    for i in range(t):
        fresh += int(old0[i] == 0)
    out = np.empty(fresh, np.int64)
    j = 0
    for i in range(t):
        if old0[i] == 0:
            out[j] = first[i]
            j += 1
    return rows, out


@njit(cache=True, nogil=True)
def _new_types(tk, tv, th, max_used, full, kf):
    """N1+(ctx .) of the new types' contexts (``KneserNey3._count_new_types``): touched rows."""
    ukf, _, cntf, _ = _unique(kf)
    n = len(ukf)
    d1 = np.empty(n, np.float32)
    d1[:] = cntf
    return _add(tk, tv, th, max_used, full, ukf, np.zeros(n, np.float32), d1, np.empty(n, np.float32),
                np.empty(n, np.float32))


@njit(cache=True, nogil=True)
def kn_trigram_learn(bk, bv, bh, big_max, sk, sv, sh, small_max, full, s, u, v, w):
    """``KneserNey3.learn``'s three passes after its halving check: the big table's
    (keys, float32 values, header) ``bk, bv, bh`` and its most occupied slots, the small
    table's, the scalars ``s`` and the trigrams (u, v, w). Returns (big rows, small
    rows, the raised tokens' hashes); ``full[0]`` set where a table would pass its load."""
    no_rows, no_tokens = np.empty(0, np.int64), np.empty(0, np.uint64)
    rows_big, fresh = _occurrences(bk, bv, bh, big_max, full, s, _N1_3, _N2_3,
                                   _keys(_T3, _T3_ID, np.vstack((u, v, w))), _keys(_C3T, _C3_ID, np.vstack((u, v))))
    if full[0] or not len(fresh):
        return rows_big, no_rows, no_tokens
    u, v, w = u[fresh], v[fresh], w[fresh]
    rows2 = _new_types(bk, bv, bh, big_max, full, _keys(_C3T, _C3_ID, np.vstack((u, v))))
    if full[0]:
        return rows_big, no_rows, no_tokens
    uk2, first2, cnt2, _ = _unique(_keys(_T2, _T2_ID, np.vstack((v, w))))
    n2 = len(uk2)
    d0 = np.empty(n2, np.float32)
    d0[:] = cnt2
    old2 = np.empty(n2, np.float32)
    rows2s = _add(sk, sv, sh, small_max, full, uk2, d0, np.zeros(n2, np.float32), old2, np.empty(n2, np.float32))
    if full[0]:
        return rows_big, no_rows, no_tokens
    _counts_of_counts(s, _N1_2, _N2_2, old2, cnt2)
    ukv, _, _, inv = _unique(_keys(_C2T, _C2_ID, v[first2].reshape(1, len(first2))))
    nv = len(ukv)
    dv0 = np.zeros(nv, np.float64)  # bincount's float64 sums, then float32 (numpy's order)
    dv1 = np.zeros(nv, np.float64)
    raised_n = 0
    for i in range(n2):
        dv0[inv[i]] += cnt2[i]
        if old2[i] == 0:
            dv1[inv[i]] += 1.0
            raised_n += 1
    raised = np.empty(raised_n, np.uint64)
    j = 0
    for i in range(n2):
        if old2[i] == 0:
            raised[j] = w[first2[i]]
            j += 1
    uk1, _, cnt1, _ = _unique(_keys(_T1, _T1_ID, raised.reshape(1, len(raised))))
    n1 = len(uk1)
    keys = np.concatenate((ukv, uk1))
    a = np.empty(nv + n1, np.float32)
    b = np.zeros(nv + n1, np.float32)
    a[:nv] = dv0
    b[:nv] = dv1
    a[nv:] = cnt1
    old0 = np.empty(nv + n1, np.float32)
    rows3 = _add(sk, sv, sh, small_max, full, keys, a, b, old0, np.empty(nv + n1, np.float32))
    if full[0]:
        return rows_big, no_rows, raised
    old1 = old0[nv:]
    _counts_of_counts(s, _N1_1, _N2_1, old1, cnt1)
    s[TOTAL] += np.float32(np.float64(cnt1.sum()))
    types = 0
    for i in range(n1):
        types += int(old1[i] == 0)
    s[TYPES] += np.float32(types)
    return np.unique(np.concatenate((rows_big, rows2))), np.unique(np.concatenate((rows2s, rows3))), raised


@njit(cache=True, nogil=True)
def kn_quad_learn(qk, qv, qh, quad_max, full, s, x, u, v, w):
    """``KneserNey4._learn_quad``'s two passes after its halving check: the quad table's
    touched rows (``full[0]`` set where it would pass its load)."""
    rows, fresh = _occurrences(qk, qv, qh, quad_max, full, s, _N1_4, _N2_4,
                               _keys(_T4, _T4_ID, np.vstack((x, u, v, w))), _keys(_C4T, _C4_ID, np.vstack((x, u, v))))
    if full[0] or not len(fresh):
        return rows
    more = _new_types(qk, qv, qh, quad_max, full, _keys(_C4T, _C4_ID, np.vstack((x[fresh], u[fresh], v[fresh]))))
    return np.unique(np.concatenate((rows, more)))


class CompiledCounts:
    """The kernels as a :class:`~streamlearn.counts.kn.KneserNey3` (or 4) calls them,
    with its own tables and scalars: :meth:`trigrams` and :meth:`quad`, where the task
    set it (``learner.compiled``), after its own halving check. They leave what its numpy
    passes would, byte for byte."""

    def __init__(self):
        start_loading()

    @staticmethod
    def trigrams(big: CountTable, small: CountTable, stats: np.ndarray, u: np.ndarray, v: np.ndarray,
                 w: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(big rows, small rows, raised) of ``KneserNey3.learn``'s passes over its big and
        small tables and its scalars ``stats`` (float32, in place)."""
        loaded()
        full = np.zeros(1, np.int64)
        out = kn_trigram_learn(big.keys, big.vals.view(np.float32), big.header, big.max_load * big.slots,
                               small.keys, small.vals.view(np.float32), small.header, small.max_load * small.slots,
                               full, stats, *(np.ascontiguousarray(a, dtype=np.uint64) for a in (u, v, w)))
        if full[0]:
            raise TableFullError("a count table would pass its maximum load: raise model.count_slots")
        return out

    @staticmethod
    def quad(quad: CountTable, stats: np.ndarray, x: np.ndarray, u: np.ndarray, v: np.ndarray,
             w: np.ndarray) -> np.ndarray:
        """The rows of ``KneserNey4``'s 4-gram passes over its quad table and scalars
        ``stats`` (in place)."""
        loaded()
        full = np.zeros(1, np.int64)
        rows = kn_quad_learn(quad.keys, quad.vals.view(np.float32), quad.header, quad.max_load * quad.slots,
                             full, stats, *(np.ascontiguousarray(a, dtype=np.uint64) for a in (x, u, v, w)))
        if full[0]:
            raise TableFullError("a count table would pass its maximum load: raise model.count_slots")
        return rows


def load_count_kernels() -> None:
    """Compile both kernels (or load them from numba's cache) for the types the count
    part passes, on tables of one row (:func:`streamlearn.compiled.load_kernels` calls it)."""
    tables = [np.zeros(2 * ROW + 1, np.uint64) for _ in range(3)]
    views = [(t[:ROW], t[ROW:2 * ROW].view(np.float32), t[2 * ROW:]) for t in tables]
    one = np.ones(1, np.uint64)
    s, full = np.zeros(64, np.float32), np.zeros(1, np.int64)
    kn_trigram_learn(*views[0], 64.0, *views[1], 64.0, full, s, one, one, one)
    kn_quad_learn(*views[2], 64.0, full, s, one, one, one, one)
