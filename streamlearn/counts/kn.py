"""The interpolated Kneser-Ney trigram (Chen & Goodman) on two hashed count tables,
learned a batch at a time and read for (slot, candidate) grids.

Statistics (records BOS-padded), each under its own 64-bit key:

    T3 (u, v, w)  c(u v w)                    C3 (u, v)  c(u v .), N1+(u v .)
    T2 (v, w)     N1+(. v w)                  C2 (v)     sum_w N1+(. v w), |{w: N1+(. v w) > 0}|
    T1 (w)        N1+(. w)                    stats      sum N1+(. w), |{w: N1+(. w) > 0}|,
                                                         counts-of-counts n1, n2 per order

    P1(w)       = max(N1+(.w) - D1, 0) / N1 + D1 |{w}| / N1 / n        (n: the candidates)
    P2(w | v)   = max(N1+(.vw) - D2, 0) / S(v) + D2 L(v) / S(v) P1(w)  (P1 if S(v) = 0)
    P3(w | u v) = max(c(uvw) - D3, 0) / c(uv.) + D3 N1+(uv.) / c(uv.) P2(w | v)

with D_k = n1 / (n1 + 2 n2) of order k. The trigram statistics (T3, C3: most keys) live
in the "big" table; the bigram and unigram ones in the "small" table, which T2 is read
from at every (slot, candidate) cell, so it is kept small enough to stay in cache. The
scalars live in a one-row ``stats`` table, so the three tables are the whole state: a
restored copy of their rows is the same count part.

Token hashes (uint64, xxh3 under a seed derived from ``hashing.seed``, BOS included) are
the inputs; a key mixes the statistic's tag and the hashes (splitmix64's finaliser). The
key's low 3 bits are the tag's id, so a scan (after halving) tells statistics apart.

:class:`KneserNey4` (``model.counts=kn4``) adds a 4-gram order on top, in a third
table (its docstring).

Bounded memory: a table about to pass its maximum load is halved (every statistic
halved and rounded down, the ones reaching 0 dropped) and rewritten in place; old counts
fade, recent ones dominate. A halving dirties every row of that table once.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable

import numpy as np
import torch

from .table import CountTable, distinct

if TYPE_CHECKING:
    from ..compiled_counts import CompiledCounts

__all__ = ["KneserNey3", "KneserNey4"]

# The keys' layout and the stats row's, public for the compiled counting
# (streamlearn.compiled_counts), which must build the same keys and write the same cells.
MIXERS = [np.uint64(c) for c in (0x9E3779B97F4A7C15, 0xC2B2AE3D27D4EB4F, 0x165667B19E3779F9, 0xD6E8FEB86659FD93)]
TAG_IDS = {"T3": 1, "C3": 2, "T2": 3, "C2": 4, "T1": 5, "T4": 6, "C4": 7}
TAGS = {name: np.uint64((i * 0x632BE59BD9B4E019) & ((1 << 64) - 1)) for name, i in TAG_IDS.items()}
LOW = np.uint64(7)  # a key's low bits: its tag's id
SPLITMIX = (np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB))  # _mix's multipliers
_BIG_TAGS = ("T3", "C3")
_QUAD_TAGS = ("T4", "C4")
# stats row: n1 of orders 1..3, n2 of orders 1..3, N1 (sum N1+(. w)), |{w}|; then n1, n2 of
# order 4 (KneserNey4; a trigram part leaves them 0)
_N1, _N2, TOTAL, TYPES = 0, 3, 6, 7
COUNTS_OF_COUNTS = {1: (0, 3), 2: (1, 4), 3: (2, 5), 4: (8, 9)}  # order -> where its n1, n2 sit
_TRIGRAM_STATS = 8  # the stats a trigram part's recount rewrites: [0, 8)


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser: a bijection on uint64 that spreads every input bit."""
    x = x ^ (x >> np.uint64(30))
    x = x * SPLITMIX[0]
    x = x ^ (x >> np.uint64(27))
    x = x * SPLITMIX[1]
    return x ^ (x >> np.uint64(31))


def key(tag: str, *parts: np.ndarray) -> np.ndarray:
    """64-bit key of an n-gram of token hashes (broadcasting). Every part but the last is
    mixed in fully (slot contexts: few); the last (often a (slot, candidate) grid) is
    multiplied by an odd constant and xor-ed in, one pass instead of seven: the token
    hashes are uniform, so keys stay uniform. The low 3 bits hold the tag's id (never 0:
    no key reads as an empty slot)."""
    return _finish(tag, _context(tag, *parts[:-1]), parts[-1], len(parts))


def _context(tag: str, *parts: np.ndarray):
    """:func:`key`'s mix of the tag and every part but the last."""
    with np.errstate(over="ignore"):
        acc = TAGS[tag]
        for m, p in zip(MIXERS, parts):
            acc = _mix(acc ^ (p * m))
        return acc


def _finish(tag: str, acc, last: np.ndarray, n: int) -> np.ndarray:
    """:func:`key` from its :func:`_context` ``acc`` and the last of its ``n`` parts."""
    with np.errstate(over="ignore"):
        return ((acc ^ (last * MIXERS[n - 1])) & ~LOW) | np.uint64(TAG_IDS[tag])


def _discount(n1, n2):
    """Chen & Goodman's D = n1 / (n1 + 2 n2) of an order's counts-of-counts (floats or
    float64 arrays); 0.5 before any count."""
    den = np.asarray(n1 + 2 * n2, np.float64)
    return np.where(den > 0, n1 / np.where(den > 0, den, 1), 0.5)


def _p1_of(c1: np.ndarray, D, total, types, n: int) -> np.ndarray:
    """P1(w) from N1+(. w) (c1), the discount, N1 and |{w}| (floats, or float64 per slot);
    uniform (1 / n) where nothing is counted yet. The discount's first use is in float32,
    as the float32 counts meet it; its second, D |{w}| / N1 / n, in float64."""
    D, total = np.asarray(D, np.float64), np.asarray(total, np.float64)
    seen = total > 0
    safe = np.where(seen, total, 1.0)
    p1 = np.maximum(c1 - D.astype(np.float32), 0) / safe.astype(np.float32) + (D * types / safe / n).astype(np.float32)
    if seen.all():  # after the first count: no uniform cell, and p1 is float32 (a replay's grids: two copies fewer)
        return p1.astype(np.float32, copy=False)
    return np.where(seen, p1, np.float32(1.0 / n)).astype(np.float32)


def _p2_of(c: np.ndarray, ctx2: np.ndarray, p1w: np.ndarray, D) -> np.ndarray:
    """P2(w | v) from N1+(. v w) (c), v's (S(v), L(v)) (ctx2 (..., 2)), P1(w) and the
    discount (a float, or float32 per slot)."""
    S, L = ctx2[..., 0], ctx2[..., 1]
    inv = np.where(S > 0, 1.0 / np.maximum(S, 1.0), 0.0).astype(np.float32)  # unseen context: P1
    lam = np.where(S > 0, D * L * inv, 1.0).astype(np.float32)
    return np.maximum(c - D, 0) * inv + lam * p1w


def _p3_of(c: np.ndarray, ctx: np.ndarray, p2w: np.ndarray, D) -> np.ndarray:
    """P3(w | u v) from c(u v w) (c), (u v)'s (c(u v .), N1+(u v .)) (ctx (..., 2)), P2(w | v)
    and the discount (a float, or float32 per slot)."""
    tot, nf = ctx[..., 0], ctx[..., 1]
    inv = np.where(tot > 0, 1.0 / np.maximum(tot, 1.0), 0.0).astype(np.float32)  # unseen context: P2
    lam = np.where(tot > 0, D * nf * inv, 1.0).astype(np.float32)
    return np.maximum(c - D, 0) * inv + lam * p2w


class KneserNey3:
    """The KN trigram count part (module docstring); ``tables()`` are its row tables."""

    def __init__(self, slots: int, small_slots: int, max_load: float = 0.5):
        self.big = CountTable(slots, max_load)
        self.small = CountTable(small_slots, max_load)
        self.stats = torch.zeros(1, 64)  # (1, 64) float32: the scalars (module docstring)
        self._s = self.stats.numpy()[0]  # a view
        self.halvings = 0
        # hashes of the tokens w whose N1+(. w) the last learn raised (a new bigram type (v, w))
        self.raised = np.empty(0, dtype=np.uint64)
        # the counting passes compiled (streamlearn.compiled_counts: the same bytes), where the
        # task sets it (learner.compiled): called, it answers the kernels or None (numpy's passes)
        self.compiled: Callable[[], CompiledCounts | None] | None = None

    def tables(self, prefix: str) -> dict[str, torch.Tensor]:
        return {f"{prefix}.kn3": self.big.buf, f"{prefix}.kn12": self.small.buf, f"{prefix}.stats": self.stats}

    def word_tables(self, prefix: str) -> frozenset[str]:
        """The tables whose float32 words hold key bits (:class:`CountTable`), not numbers."""
        return frozenset({f"{prefix}.kn3", f"{prefix}.kn12"})

    # ------------------------------------------------------------ counting

    def learn(self, u: np.ndarray, v: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Count the trigrams (u[i], v[i], w[i]) (token hashes, BOS-padded) in three table
        passes (what each adds depends on which types the previous one found new); the
        result equals counting them one by one. Returns the touched rows of the big and
        the small table."""
        n = len(u)
        self.raised = np.empty(0, dtype=np.uint64)
        halved = [self._halve_if_full(t, 3 * n) for t in (self.big, self.small)]
        if any(halved):
            self._recount()
        fast = self.compiled() if self.compiled is not None else None
        if fast is not None:
            rows_big, rows_small, self.raised = fast.trigrams(self.big, self.small, self._s, u, v, w)
        else:
            rows_big, fresh = self._count_occurrences(self.big, 3, (u, v), w)
            rows_small = np.empty(0, np.int64)
            if len(fresh):
                rows_big, parts = self._learn_fresh(u[fresh], v[fresh], w[fresh], rows_big)
                rows_small = distinct(np.concatenate(parts))
        return tuple(np.arange(t.rows) if h else r for t, h, r in
                     zip((self.big, self.small), halved, (rows_big, rows_small)))

    def _learn_fresh(self, u, v, w, rows_big):
        """Passes 2 and 3 over the new trigram types: N1+(u v .), N1+(. v w), v's
        continuation totals and N1+(. w)."""
        rows2 = self._count_new_types(self.big, 3, (u, v))
        uk2, first2, cnt2 = np.unique(key("T2", v, w), return_index=True, return_counts=True)
        old, rows2s = self._add(self.small, [uk2], [cnt2, 0 * cnt2])
        old2 = old[:, 0]
        self._count_of_counts(2, old2, old2 + cnt2)
        ukv, inv = np.unique(key("C2", v[first2]), return_inverse=True)
        inv = inv.reshape(-1)  # whole counts: bincount's float64 sums are exact, as np.add.at's (slower) were
        dv = np.stack([np.bincount(inv, cnt2, len(ukv)), np.bincount(inv, old2 == 0, len(ukv))], 1).astype(np.float32)
        self.raised = w[first2][old2 == 0]
        uk1, cnt1 = np.unique(key("T1", self.raised), return_counts=True)
        old, rows3 = self._add(self.small, [ukv, uk1], [dv[:, 0], dv[:, 1]], [cnt1, 0 * cnt1])
        old1 = old[len(ukv):, 0]
        self._count_of_counts(1, old1, old1 + cnt1)
        self._s[TOTAL] += float(cnt1.sum())
        self._s[TYPES] += float(np.count_nonzero(old1 == 0))
        return distinct(np.concatenate([rows_big, rows2])), [rows2s, rows3]

    def _count_occurrences(self, table: CountTable, order: int, ctx: tuple[np.ndarray, ...],
                           w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The first pass of an order counted by occurrence (the top one: 3, or 3 and 4):
        c(ctx w) and c(ctx .) in one pass over ``table``, and the order's counts-of-counts.
        Returns the touched rows and the occurrences standing for the types new in this
        batch (the first of each)."""
        ukt, first, cnt = np.unique(key(f"T{order}", *ctx, w), return_index=True, return_counts=True)
        ukc, cntc = np.unique(key(f"C{order}", *ctx), return_counts=True)
        old, rows = self._add(table, [ukt, ukc], [cnt, 0 * cnt], [cntc, 0 * cntc])
        old = old[:len(ukt), 0]
        self._count_of_counts(order, old, old + cnt)
        return rows, first[old == 0]

    def _count_new_types(self, table: CountTable, order: int, ctx: tuple[np.ndarray, ...]) -> np.ndarray:
        """N1+(ctx .) of the new types' contexts ``ctx`` (one per new type); the touched rows."""
        ukf, cntf = np.unique(key(f"C{order}", *ctx), return_counts=True)
        return self._add(table, [ukf], [0 * cntf, cntf])[1]

    def _count_of_counts(self, order: int, old: np.ndarray, new: np.ndarray) -> None:
        n1, n2 = COUNTS_OF_COUNTS[order]
        self._s[n1] += np.count_nonzero(new == 1) - np.count_nonzero(old == 1)
        self._s[n2] += np.count_nonzero(new == 2) - np.count_nonzero(old == 2)

    @property
    def continuations(self) -> float:
        """sum_w N1+(. w): changes whenever any N1+(. w) does (a fingerprint for caches of them)."""
        return float(self._s[TOTAL])

    @property
    def types(self) -> int:
        """|{w: N1+(. w) > 0}|: the tokens counted so far."""
        return int(self._s[TYPES])

    def D(self, order: int) -> float:
        return float(_discount(*(float(self._s[i]) for i in COUNTS_OF_COUNTS[order])))

    @staticmethod
    def _halve_if_full(table: CountTable, adding: int) -> bool:
        """Halve ``table`` in place if ``adding`` new keys could pass its load (module
        docstring). Approximate: a context's totals are halved as a whole while its
        dropped entries cannot be found from it (keys are hashes), so its distribution
        loses the dropped entries' mass."""
        if table.used + adding <= table.max_load * table.slots:
            return False
        keys, vals = table.entries()
        vals = np.floor(vals / 2)
        keep = (vals != 0).any(1)
        table.clear()
        table.add_unique(keys[keep], vals[keep])
        return True

    def _recount(self) -> None:
        """Counts-of-counts and unigram totals from the tables (after a halving)."""
        self._s[:_TRIGRAM_STATS] = 0
        self.halvings += 1
        for order, (table, tag) in {3: (self.big, "T3"), 2: (self.small, "T2"), 1: (self.small, "T1")}.items():
            keys, vals = table.entries()
            c = vals[(keys & LOW) == np.uint64(TAG_IDS[tag]), 0]
            self._count_of_counts(order, np.zeros(0), c)
            if order == 1:
                self._s[TOTAL], self._s[TYPES] = float(c.sum()), float(np.count_nonzero(c))

    @staticmethod
    def _add(table: CountTable, keys: list[np.ndarray], *deltas: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        """One table pass over distinct key groups (distinct tags: no key in two groups);
        deltas: per group, its two value columns."""
        d = np.concatenate([np.stack([a, b], 1) for a, b in deltas]).astype(np.float32)
        return table.add_unique(np.concatenate(keys), d)

    # ------------------------------------------------------------ probabilities
    # Each lookup is made at the natural broadcast shape of the tokens it depends on. On a
    # (slot, candidate) grid only N1+(. v w) is read everywhere: c(u v w) can be non-zero
    # only where N1+(. v w) is, and a context (x w) has statistics only where N1+(. x w) > 0.

    def _get(self, tag: str, *parts: np.ndarray, where: np.ndarray | None = None) -> np.ndarray:
        """Values (..., 2) at the broadcast shape of the parts; ``where``: only there (zeros elsewhere)."""
        table = self._table(tag)
        if where is None:
            k = key(tag, *parts)
            return table.get(k.ravel()).reshape(*k.shape, 2)
        out = np.zeros((*where.shape, 2), dtype=np.float32)
        cells = np.nonzero(where)
        if len(cells[0]):
            out[cells] = table.get(self._keys_at(tag, parts, cells, where.shape))
        return out

    def _table(self, tag: str) -> CountTable:
        return self.big if tag in _BIG_TAGS else self.small

    @staticmethod
    def _keys_at(tag: str, parts: tuple[np.ndarray, ...], cells: tuple[np.ndarray, ...],
                 grid: tuple[int, ...]) -> np.ndarray:
        """The keys of the parts broadcast to ``grid`` at ``cells`` (np.nonzero's indices).
        When only the last part spans a grid axis the others do not (a slot's context
        against shared candidates), the context is mixed once per slot and the key
        finished at the cells alone (py-spy, next-token replay: building the key for
        every cell of the grid and masking it was about 4% of the replay, now under 1%);
        otherwise each part is gathered at the cells first."""
        if len(grid) == 2 and all(np.ndim(p) == 2 and np.shape(p)[1] == 1 for p in parts[:-1]):
            rows, cols = cells
            acc = np.broadcast_to(_context(tag, *parts[:-1]), (grid[0], 1))[rows, 0]
            return _finish(tag, acc, np.broadcast_to(parts[-1], grid)[rows, cols], len(parts))
        return key(tag, *(np.broadcast_to(p, grid)[cells] for p in parts))

    def continuation_counts(self, w: np.ndarray) -> np.ndarray:
        """N1+(. w) of token hashes ``w`` (any shape)."""
        return self._get("T1", w)[..., 0]

    def token_stats(self, w: np.ndarray) -> np.ndarray:
        """(..., 3): N1+(. w), and w's statistics as a bigram context (S(w), L(w))."""
        return np.concatenate([self._get("T1", w)[..., :1], self._get("C2", w)], -1)

    def _p1(self, c1: np.ndarray, n: int) -> np.ndarray:
        return _p1_of(c1, self.D(1), float(self._s[TOTAL]), float(self._s[TYPES]), n)

    def _p2(self, v, w, p1w: np.ndarray, ctx2: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(P2(w | v), N1+(. v w)); ctx2 (..., 2) = v's (S(v), L(v))."""
        c = self._t2(v, w)
        return _p2_of(c, ctx2, p1w, self.D(2)), c

    def _t2(self, v, w) -> np.ndarray:
        """N1+(. v w); for slots' v (S, 1) against shared candidates w (1, K), read once per
        distinct v (a batch's slots share many previous tokens)."""
        if np.ndim(v) == 2 and np.shape(v)[1] == 1 and np.ndim(w) == 2 and np.shape(w)[0] == 1 and np.shape(w)[1] > 1:
            uv, inv = np.unique(v[:, 0], return_inverse=True)
            return self._get("T2", uv[:, None], w)[..., 0][inv.reshape(-1)]
        return self._get("T2", v, w)[..., 0]

    def _p3(self, u, v, w, p2w: np.ndarray, c2: np.ndarray, ctx_seen: np.ndarray | None = None,
            with_c3: bool = False):
        """P3(w | u v) given P2(w | v) and N1+(. v w) (c2); ``ctx_seen``: where N1+(. u v) > 0;
        ``with_c3``: (P3, c(u v w))."""
        ctx = self._get("C3", u, v, where=ctx_seen)
        tot = ctx[..., 0]
        grid = np.broadcast_shapes(np.shape(c2), np.shape(tot))
        c = self._get("T3", u, v, w, where=np.broadcast_to((c2 > 0) & (tot > 0), grid))[..., 0]
        p3 = _p3_of(c, ctx, p2w, self.D(3))
        return (p3, c) if with_c3 else p3

    def next_token(self, u: np.ndarray, v: np.ndarray, w: np.ndarray, n: int, with_c2: bool = False,
                   with_c3: bool = False):
        """P3(w | u v) of slots' contexts u, v (S, 1) and candidates w (S or 1, C);
        ``n``: the number of candidates (P1's uniform share). ``with_c2``: also N1+(. v w)
        and w's :meth:`token_stats`; ``with_c3``: also c(u v w)."""
        w_stats = self.token_stats(w)
        p2, c2 = self._p2(v, w, self._p1(w_stats[..., 0], n), self._get("C2", v))
        p3, c3 = self._p3(u, v, w, p2, c2, with_c3=True)
        return (p3, c2, w_stats) if with_c2 else (p3, c3) if with_c3 else p3

    def score(self, ctx: tuple[np.ndarray, ...], w: np.ndarray, n: int) -> np.ndarray:
        """The top order's P(w | context) of slots' contexts ``ctx`` ((u, v) here, each
        (S, 1)) and candidates w (S or 1, C)."""
        return self.next_token(*ctx, w, n)

    def score_in_order(self, ctx: tuple[np.ndarray, ...], ws: list[np.ndarray], n: int,
                       grams: np.ndarray, records: np.ndarray) -> list[np.ndarray]:
        """:meth:`score` as :meth:`next_token_in_order` scores (``grams`` (S, 3): each
        slot's context and answer)."""
        return self.next_token_in_order(*ctx, ws, n, grams, records)

    def next_token_in_order(self, u: np.ndarray, v: np.ndarray, ws: list[np.ndarray], n: int,
                            tri: np.ndarray, records: np.ndarray) -> list[np.ndarray]:
        """:meth:`next_token` of a training batch's slots for each candidate array of ``ws``
        (each (1, C) shared by the slots or (S, C) a slot's own), every slot scored as if
        the batch's records before its own had been counted: ``records`` (S,) each slot's
        record, 0, 1, ... ascending; ``tri`` (S, 3) each slot's trigram (its context is
        ``u``, ``v``). Exactly :meth:`next_token` after :meth:`learn` of those records one
        at a time, while no halving falls between; the tables do not change.

        The tables are read once, as :meth:`next_token` reads them. What the batch's earlier
        records add (:class:`_InOrder`) falls only on the batch's own n-grams: the slots'
        contexts, and the candidates that some trigram of the batch ends with; the
        discounts and the unigram totals become per-slot values."""
        add = _InOrder(self, tri, records)
        contexts = self._in_order_contexts(add, u, v, records)
        return [self._p3_in_order(add, contexts, u, v, w, n, records)[0] for w in ws]

    def _in_order_contexts(self, add: "_InOrder", u, v, records: np.ndarray):
        """The slots' context statistics and scalars with the batch's earlier records added."""
        ctx2 = self._get("C2", v) + add.middles(records)  # (S, 1, 2)
        ctx3 = self._get("C3", u, v) + add.contexts(records)  # (S, 1, 2)
        return ctx2, ctx3, add.scalars(records)  # scalars: (S, 1) each

    def _p3_in_order(self, add: "_InOrder", contexts, u, v, w: np.ndarray, n: int, records: np.ndarray):
        """(P3 (S, C), c(u v w) (S, C), the columns of ``w`` the batch's own trigrams end
        with) of one candidate array, as :meth:`next_token_in_order` scores it."""
        ctx2, ctx3, (D1, D2, D3, total, types) = contexts
        c2 = self._t2(v, w)
        c3 = self._get("T3", u, v, w, where=np.broadcast_to((c2 > 0) & (ctx3[..., 0] > 0), c2.shape))[..., 0]
        c1 = np.broadcast_to(self._get("T1", w)[..., 0], c2.shape).copy()
        cols = add.ended(w)
        if len(cols):
            wc = w[:, cols]
            c1[:, cols] += add.tokens(wc, records)
            c2[:, cols] += add.pairs(v, wc, records)
            c3[:, cols] += add.trigrams(u, v, wc, records)
        return _p3_of(c3, ctx3, _p2_of(c2, ctx2, _p1_of(c1, D1, total, types, n), D2), D3), c3, cols

    def chain(self, l2, l1, r1, r2, has_r1, has_r2, w, n: int) -> np.ndarray:
        """mlm: log P3(w | l2 l1) + [log P3(r1 | l1 w)] + [log P3(r2 | w r1)] of slots'
        context (S, 1) and candidates w (S or 1, C); the bracketed terms only where the
        record has r1, r2 (``has_r1``, ``has_r2`` (S, 1) bool)."""
        left, c2_l1w, w_stats = self.next_token(l2, l1, w, n, with_c2=True)
        out = np.log(np.maximum(left, 1e-30))
        r1_stats = self.token_stats(r1)
        p2_mid, c2_wr1 = self._p2(w, r1, self._p1(r1_stats[..., 0], n), w_stats[..., 1:])
        mid = self._p3(l1, w, r1, p2_mid, c2_wr1, ctx_seen=np.broadcast_to(c2_l1w > 0, np.shape(c2_wr1)))
        p2_r2, c2_r1r2 = self._p2(r1, r2, self._p1(self._get("T1", r2)[..., 0], n), r1_stats[..., 1:])
        right = self._p3(w, r1, r2, p2_r2, c2_r1r2, ctx_seen=c2_wr1 > 0)
        out = out + np.where(has_r1, np.log(np.maximum(mid, 1e-30)), 0.0)
        out = out + np.where(has_r2, np.log(np.maximum(right, 1e-30)), 0.0)
        return out.astype(np.float32)


def _cumulative(inv: np.ndarray, after: np.ndarray, n: int, width: int) -> np.ndarray:
    """(n, width): per key (``inv``: each occurrence's key), its occurrences in the records
    before each record (``after``: each occurrence's record + 1)."""
    counts = np.bincount(inv * width + after, minlength=n * width).reshape(n, width)
    return np.cumsum(counts, 1, dtype=np.float32)


def _sum_rows(rows: np.ndarray, into: np.ndarray, n: int, width: int) -> np.ndarray:
    """(n, width): ``rows`` (k, width) summed into the rows ``into`` (k,) name (one
    bincount: whole counts, exact in float64)."""
    at = (into[:, None] * width + np.arange(width)).ravel()
    return np.bincount(at, rows.ravel(), n * width).reshape(n, width).astype(np.float32)


def _discounts_after(stats: np.ndarray, order: int, base: np.ndarray, add: np.ndarray) -> np.ndarray:
    """D (R + 1,) of ``order`` before each record of a batch: the stored counts-of-counts
    (``stats``, float64) changed by what the batch's earlier records add to keys counted
    ``base`` (k,) in the tables (``add`` (k, R + 1)); the changes telescope per key."""
    now, was = base[:, None] + add, base[:, None]
    i1, i2 = COUNTS_OF_COUNTS[order]
    return _discount(stats[i1] + (now == 1).sum(0) - (was == 1).sum(0),
                     stats[i2] + (now == 2).sum(0) - (was == 2).sum(0))


def _at(keys: np.ndarray, table_keys: np.ndarray, values: np.ndarray, records: np.ndarray) -> np.ndarray:
    """values[key's row, slot's record] at each cell of ``keys`` (S or 1, K), looked up
    at the keys' own shape; 0 for keys the batch lacks (``table_keys`` sorted). (S, K)."""
    at = np.minimum(np.searchsorted(table_keys, keys), len(table_keys) - 1)
    at = np.where(table_keys[at] == keys, at, len(table_keys))  # a miss reads the zero row
    values = np.concatenate([values, np.zeros((1, values.shape[1]), values.dtype)])
    return values[np.broadcast_to(at, (len(records), keys.shape[1])), records[:, None]]


class _InOrder:
    """What a batch's trigrams add to every statistic before each of its records, as
    :meth:`KneserNey3.learn` counts them one record at a time (``tri`` (S, 3), ``records``
    (S,) 0, 1, ... ascending), without touching the tables: per distinct key of the batch
    and record r, the increment its records before r make (matrices (keys, R + 1), column
    r for record r).

    The rules are :meth:`KneserNey3.learn`'s. c(u v w) and c(u v .) count occurrences. A
    trigram type is new if the tables lack it; from its first record on it adds 1 to
    N1+(u v .), N1+(. v w) and S(v). A pair (v, w) whose N1+(. v w) was 0 becomes a type
    when its first new trigram arrives; from then on it adds 1 to L(v) and N1+(. w). The
    counts-of-counts behind the discounts and the unigram totals follow from the values
    before and after (the changes telescope per key)."""

    def __init__(self, kn: KneserNey3, tri: np.ndarray, records: np.ndarray):
        u, v, w = tri[:, 0], tri[:, 1], tri[:, 2]
        self.R = int(records[-1]) + 1 if len(records) else 0
        after = records + 1  # a record's own occurrences count from the next record on
        width = self.R + 1
        self.k3, first3, inv3 = np.unique(key("T3", u, v, w), return_index=True, return_inverse=True)
        self.kc, invc = np.unique(key("C3", u, v), return_inverse=True)
        self.k2, first2, inv2 = np.unique(key("T2", v, w), return_index=True, return_inverse=True)
        self.kv, invv = np.unique(key("C2", v), return_inverse=True)
        self.k1, inv1 = np.unique(key("T1", w), return_inverse=True)
        self._slot = {"C3": invc.reshape(-1), "C2": invv.reshape(-1)}
        inv3, invc, inv2, invv, inv1 = (a.reshape(-1) for a in (inv3, invc, inv2, invv, inv1))
        b3, b2, b1 = kn.big.get(self.k3)[:, 0], kn.small.get(self.k2)[:, 0], kn.small.get(self.k1)[:, 0]
        self.c3 = _cumulative(inv3, after, len(self.k3), width)  # c(u v w)
        cc = _cumulative(invc, after, len(self.kc), width)  # c(u v .)
        new = (b3 == 0)[:, None] & (np.arange(self.R + 1) > records[first3][:, None])  # (types, R + 1)
        self.c2 = _sum_rows(new, inv2[first3], len(self.k2), width)  # N1+(. v w)
        nf = _sum_rows(new, invc[first3], len(self.kc), width)  # N1+(u v .)
        S = _sum_rows(new, invv[first3], len(self.kv), width)
        pair_new = (b2 == 0)[:, None] & (self.c2 > 0)  # (pairs, R + 1)
        L = _sum_rows(pair_new, invv[first2], len(self.kv), width)
        self.c1 = _sum_rows(pair_new, inv1[first2], len(self.k1), width)  # N1+(. w)
        self.ctx3 = np.stack([cc, nf], -1)  # (contexts, R + 1, 2)
        self.ctx2 = np.stack([S, L], -1)  # (middles, R + 1, 2)
        self.ends = np.unique(w)
        st = kn.stats.numpy()[0].astype(np.float64)
        self.D = [_discounts_after(st, order, base, add)  # (R + 1,) each
                  for order, base, add in ((1, b1, self.c1), (2, b2, self.c2), (3, b3, self.c3))]
        self.total = st[TOTAL] + self.c1.sum(0)
        self.types = st[TYPES] + ((b1 == 0)[:, None] & (self.c1 > 0)).sum(0)

    def contexts(self, records: np.ndarray) -> np.ndarray:
        """(S, 1, 2): each slot's (c(u v .), N1+(u v .)) increment (the slots are the batch's)."""
        return self.ctx3[self._slot["C3"], records][:, None]

    def middles(self, records: np.ndarray) -> np.ndarray:
        """(S, 1, 2): each slot's (S(v), L(v)) increment."""
        return self.ctx2[self._slot["C2"], records][:, None]

    def scalars(self, records: np.ndarray):
        """Per slot (S, 1): D1 (float64, as :func:`_p1_of` takes it), D2, D3 (float32, as
        the tables' float discounts enter the float32 formulas), N1 and the token-type
        count (float64)."""
        r = records[:, None]
        D1, D2, D3 = (d[r] for d in self.D)
        return D1, D2.astype(np.float32), D3.astype(np.float32), self.total[r], self.types[r]

    def ended(self, w: np.ndarray) -> np.ndarray:
        """The columns of candidates ``w`` (S or 1, C) that some trigram of the batch ends
        with (the only ones its earlier records' counts can change)."""
        at = np.minimum(np.searchsorted(self.ends, w), len(self.ends) - 1)
        return np.flatnonzero((self.ends[at] == w).any(0))

    def tokens(self, w: np.ndarray, records: np.ndarray) -> np.ndarray:
        return _at(key("T1", w), self.k1, self.c1, records)

    def pairs(self, v: np.ndarray, w: np.ndarray, records: np.ndarray) -> np.ndarray:
        return _at(key("T2", v, w), self.k2, self.c2, records)

    def trigrams(self, u: np.ndarray, v: np.ndarray, w: np.ndarray, records: np.ndarray) -> np.ndarray:
        return _at(key("T3", u, v, w), self.k3, self.c3, records)


class KneserNey4(KneserNey3):
    """:class:`KneserNey3` with a 4-gram order on top (``model.counts=kn4``):

        P4(w | x u v) = max(c(xuvw) - D4, 0) / c(xuv.) + D4 N1+(xuv.) / c(xuv.) P3(w | u v)

    (P3 where c(xuv.) = 0): interpolated absolute discounting over the trigram model, whose
    orders count as they do alone (a 4-gram order makes no continuation counts of the
    trigrams; measured against that in the research, 2026-11-27: the same recall to the
    third digit, for a third more table passes). Its statistics live in a third table of
    the big one's size, ``quad``: T4 (x, u, v, w) c(x u v w), C4 (x, u, v) (c(x u v .),
    N1+(x u v .)); D4 = n1 / (n1 + 2 n2) of the 4-gram counts-of-counts (stats 8 and 9).
    The quad table halves on its own (module docstring), which recounts order 4 alone.

    On a (slot, candidate) grid c(x u v w) is read only where c(u v w) > 0 (a 4-gram
    implies its trigram; after the big table halved a 4-gram whose trigram it dropped is
    read as unseen until the trigram comes back) and the slot's 4-gram context was seen.
    """

    def __init__(self, slots: int, small_slots: int, max_load: float = 0.5):
        super().__init__(slots, small_slots, max_load)
        self.quad = CountTable(slots, max_load)

    def tables(self, prefix: str) -> dict[str, torch.Tensor]:
        return {**super().tables(prefix), f"{prefix}.kn4": self.quad.buf}

    def word_tables(self, prefix: str) -> frozenset[str]:
        return super().word_tables(prefix) | {f"{prefix}.kn4"}

    def _table(self, tag: str) -> CountTable:
        return self.quad if tag in _QUAD_TAGS else super()._table(tag)

    def learn(self, x: np.ndarray, u: np.ndarray, v: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, ...]:
        """Count the 4-grams (x[i], u[i], v[i], w[i]) (token hashes, 3 BOS before each record)
        and their trigrams (:meth:`KneserNey3.learn`); the touched rows of the big, the
        small and the quad table."""
        big, small = super().learn(u, v, w)
        return big, small, self._learn_quad(x, u, v, w)

    def _learn_quad(self, x, u, v, w) -> np.ndarray:
        """Two passes, as the trigrams' first two: c(x u v w) and c(x u v .), then N1+(x u v .)
        of the 4-gram types new in this batch."""
        halved = self._halve_if_full(self.quad, 2 * len(x))
        if halved:
            self._recount_quad()
        fast = self.compiled() if self.compiled is not None else None
        if fast is not None:
            rows = fast.quad(self.quad, self._s, x, u, v, w)
            return np.arange(self.quad.rows) if halved else rows
        rows, fresh = self._count_occurrences(self.quad, 4, (x, u, v), w)
        if len(fresh):
            rows = distinct(np.concatenate([rows, self._count_new_types(self.quad, 4, (x[fresh], u[fresh], v[fresh]))]))
        return np.arange(self.quad.rows) if halved else rows

    def _recount_quad(self) -> None:
        """Order 4's counts-of-counts from the quad table (after it halved)."""
        for i in COUNTS_OF_COUNTS[4]:
            self._s[i] = 0
        keys, vals = self.quad.entries()
        self._count_of_counts(4, np.zeros(0), vals[(keys & LOW) == np.uint64(TAG_IDS["T4"]), 0])

    # ------------------------------------------------------------ probabilities

    def next_token4(self, x, u, v, w: np.ndarray, n: int) -> np.ndarray:
        """P4(w | x u v) of slots' contexts x, u, v (S, 1) and candidates w (S or 1, C)."""
        p3, c3 = self.next_token(u, v, w, n, with_c3=True)
        return self._p4(x, u, v, w, p3, c3, self._get("C4", x, u, v), self.D(4))

    def _p4(self, x, u, v, w, p3: np.ndarray, c3: np.ndarray, ctx4: np.ndarray, D4,
            add: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None) -> np.ndarray:
        """P4 from P3 and c(u v w) (S, C), the slots' (c(x u v .), N1+(x u v .)) (S, 1, 2)
        and D4, in place on ``p3``; ``add``: (rows, columns, counts) of cells whose c(x u v w)
        grows first (in order: the batch's own 4-grams).

        :func:`_p3_of`'s formula, computed where it can differ from P3: a slot whose 4-gram
        context was seen gets lam P3 everywhere, and its cells with a 4-gram count the
        discounted count on top (the same floats as the formula over the whole grid, where
        every other cell adds 0 * inv). Profile (py-spy, next-token replay): the grid-wide
        form, its keys built for every cell and its zero-filled grids, was 7% of a replay."""
        tot, nf = ctx4[..., 0], ctx4[..., 1]  # (S, 1) each
        rows = np.flatnonzero(tot[:, 0] > 0)
        if not len(rows):
            return p3
        inv = np.where(tot > 0, 1.0 / np.maximum(tot, 1.0), 0.0).astype(np.float32)
        lam = np.where(tot > 0, D4 * nf * inv, 1.0).astype(np.float32)
        r, k = np.nonzero(c3[rows] > 0)  # a 4-gram implies its trigram
        r = rows[r]
        c = self.quad.get(key("T4", x[r, 0], u[r, 0], v[r, 0], np.broadcast_to(w, p3.shape)[r, k]))[:, 0]
        if add is not None and len(add[0]):
            width = p3.shape[1]
            cells, at = np.unique(np.concatenate([r * width + k, add[0] * width + add[1]]), return_inverse=True)
            c = np.bincount(at.reshape(-1), np.concatenate([c, add[2]]), len(cells)).astype(np.float32)
            r, k = cells // width, cells % width
        counted = c > 0
        r, k, c = r[counted], k[counted], c[counted]
        p3[rows] *= lam[rows]
        D = D4 if np.ndim(D4) == 0 else D4[r, 0]
        p3[r, k] = np.maximum(c - D, 0) * inv[r, 0] + p3[r, k]
        return p3

    def score(self, ctx: tuple[np.ndarray, ...], w: np.ndarray, n: int) -> np.ndarray:
        """P4(w | x u v) of slots' contexts ``ctx`` = (x, u, v), each (S, 1)."""
        return self.next_token4(*ctx, w, n)

    def score_in_order(self, ctx: tuple[np.ndarray, ...], ws: list[np.ndarray], n: int,
                       grams: np.ndarray, records: np.ndarray) -> list[np.ndarray]:
        """:meth:`score` of a training batch's slots with the batch's records before each
        slot's own counted (``grams`` (S, 4): each slot's context and answer), as
        :meth:`KneserNey3.next_token_in_order` scores trigrams: exactly :meth:`score` after
        :meth:`learn` of those records one at a time, while no table halves between; the
        tables do not change."""
        x, u, v = ctx
        add, add4 = _InOrder(self, grams[:, 1:], records), _InOrder4(self, grams, records)
        contexts = self._in_order_contexts(add, u, v, records)
        ctx4 = self._get("C4", x, u, v) + add4.contexts(records)  # (S, 1, 2)
        D4 = add4.D[records][:, None].astype(np.float32)
        out = []
        for w in ws:
            p3, c3, cols = self._p3_in_order(add, contexts, u, v, w, n, records)
            extra = None
            if len(cols):
                own = add4.quads(x, u, v, w[:, cols], records)  # (S, cols)
                at, j = np.nonzero(own)
                extra = (at, cols[j], own[at, j])
            out.append(self._p4(x, u, v, w, p3, c3, ctx4, D4, extra))
        return out


class _InOrder4:
    """:class:`_InOrder` of the 4-gram order (:meth:`KneserNey4.learn`'s rules): c(x u v w)
    and c(x u v .) count occurrences, a 4-gram type the tables lack adds 1 to N1+(x u v .)
    from its first record on; D4 per record from the counts-of-counts before and after."""

    def __init__(self, kn: KneserNey4, grams: np.ndarray, records: np.ndarray):
        x, u, v, w = grams.T
        R = int(records[-1]) + 1 if len(records) else 0
        after, width = records + 1, R + 1
        self.k4, first4, inv4 = np.unique(key("T4", x, u, v, w), return_index=True, return_inverse=True)
        kc, invc = np.unique(key("C4", x, u, v), return_inverse=True)
        self._slot = invc.reshape(-1)
        b4 = kn.quad.get(self.k4)[:, 0]
        self.c4 = _cumulative(inv4.reshape(-1), after, len(self.k4), width)  # c(x u v w)
        new = (b4 == 0)[:, None] & (np.arange(width) > records[first4][:, None])  # (types, R + 1)
        self.ctx4 = np.stack([_cumulative(self._slot, after, len(kc), width),  # c(x u v .)
                              _sum_rows(new, self._slot[first4], len(kc), width)], -1)  # N1+(x u v .)
        self.D = _discounts_after(kn.stats.numpy()[0].astype(np.float64), 4, b4, self.c4)  # (R + 1,)

    def contexts(self, records: np.ndarray) -> np.ndarray:
        """(S, 1, 2): each slot's (c(x u v .), N1+(x u v .)) increment."""
        return self.ctx4[self._slot, records][:, None]

    def quads(self, x, u, v, w: np.ndarray, records: np.ndarray) -> np.ndarray:
        return _at(key("T4", x, u, v, w), self.k4, self.c4, records)
