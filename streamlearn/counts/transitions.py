"""next-item's count part: what followed a key's last item and its last two items, counted.

A network of bounded rank cannot memorise tens of thousands of transitions from a single
sighting each in one pass; counts can. This part counts, for each context c of order o
(o = 1: the last item; o = 2: the last two), the items that followed it, and estimates
the next item by interpolated Witten-Bell backoff (Witten & Bell 1991, the estimator of
n-gram language models): with n_o(c, i) the count of item i after c, n_o(c) its total
and T_o(c) the number of distinct items seen after it,

    q0(i)    = popularity
    q_o(i|c) = (n_o(c, i) + T_o(c) q_{o-1}(i)) / (n_o(c) + T_o(c))       (o = 1, 2)

A context never seen backs off entirely; one whose successors are many and spread
(large T) backs off more than one that always leads to the same item. Nothing to tune.
The head adds lam log Q to the network's logits (a product of experts), lam read from each
context's evidence, log(1 + n_o(c)) and log(1 + T_o(c))
(:class:`~streamlearn.tasks.next_item.TransitionHead`).
The research branch ``streams`` measured this design: Markov world 1k 0.99x of
Markov-1, routes 1.58x, where the network alone reached 0.80x and 0.55x.

The hashed output predicts buckets, not items: slot j's bucket b gets the mass of the
items hashed there, Q_j(b | c) = sum over i with eta_j(i) = b of q_2(i | c), so a
successor is stored as its output code (eta_1(i), ..., eta_m(i)): items the head cannot
tell apart are one successor here too. Q is a dense popularity term, pop_j(b) =
(n_j(b) + 1/2) / (N + size / 2) times the mass every order backed off, plus each held
successor's mass (sparse).

Storage (row tables, checkpointed by dirty rows, read whole by snapshots):

- ``ni.ctx``: a :class:`~.table.CountTable` over 64-bit context keys (xxh3 of the
  context's items under the count seed, tagged with the order), values
  (n_o(c), T_o(c));
- ``ni.succ`` (slots, S (m + 1)) float32: row s holds the successors of the context in
  slot s of ``ni.ctx``: S output codes (int32 bit patterns) then their S counts
  (0 = free). A context keeps at most S successors: a new one takes a free place, else
  the place of the least counted one with that count plus its own (Space-Saving,
  Metwally et al. 2005), so the heavy successors stay exact;
- ``ni.pop`` (m, size) float32: n_j(b), every event's item counted;
- ``ni.stats`` (1, 8) float32: word 0 N, the events counted for popularity.

Bounded memory: before ``ni.ctx`` would pass its maximum load, every context's counts
are halved and rounded down, the contexts left without events dropped, and both tables
rewritten (every row dirty once); old transitions fade, recent ones stay.

>>> import numpy as np
>>> t = Transitions(m=2, size=8, slots=256, successors=4)
>>> ctx = np.array([[11, 0], [11, 0], [11, 0]], dtype=np.uint64)  # three events after context 11
>>> codes = np.array([[1, 2], [1, 2], [3, 4]], dtype=np.int64)
>>> _ = t.learn(ctx, codes, codes)
>>> pop, base, at, value, evidence = t.components(ctx[:1])
>>> at.tolist(), [round(float(v), 3) for v in value]  # slot 0: buckets 1, 3 (2 and 1 of 3 events); slot 1: 2, 4
([1, 10, 3, 12], [0.4, 0.4, 0.2, 0.2])
>>> round(float(base[0]), 3)  # T / (n + T) = 2 / 5 backs off to popularity
0.4
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from ..hashing import hash64
from .table import CountTable

__all__ = ["ORDERS", "PREFIX", "Transitions", "context_keys"]

PREFIX = "ni"  # store names: "ni.ctx", "ni.succ", "ni.pop", "ni.stats"
ORDERS = 2  # contexts: the last item, the last two


def context_keys(histories: Sequence[Sequence[str]], seed: int) -> np.ndarray:
    """(n, ORDERS) uint64: each history's (oldest first) context key of order 1 and 2, 0
    where it holds too few items. The order is part of the hashed text, so the keys of
    the two orders never meet; "\\x00" cannot occur inside a canonical id."""
    n = len(histories)
    out = np.zeros((n, ORDERS), dtype=np.uint64)
    for o in range(1, ORDERS + 1):
        rows = [i for i, h in enumerate(histories) if len(h) >= o]
        if rows:
            texts = [f"{o}\x00" + "\x00".join(histories[i][-o:]) for i in rows]
            out[rows, o - 1] = np.maximum(hash64(texts, seed), np.uint64(1))  # 0 = no context
    return out


class Transitions:
    """The next-item count part (module docstring): ``m`` output slots of ``size``
    buckets, ``slots`` contexts at most (a power of two), ``successors`` (S) per context."""

    def __init__(self, m: int, size: int, slots: int, successors: int, max_load: float = 0.5):
        self.m, self.size, self.S = m, size, successors
        self.ctx = CountTable(slots, max_load)
        self.succ = torch.zeros(slots, successors * (m + 1))  # (slots, S (m + 1)) float32
        self.pop = torch.zeros(m, size)  # (m, size) float32
        self.stats = torch.zeros(1, 8)  # word 0: N
        # numpy views: a restore copies rows into the tensors and these read them
        whole = self.succ.numpy()
        self._codes = whole[:, :successors * m].view(np.int32).reshape(slots, successors, m)  # (slots, S, m)
        self._counts = whole[:, successors * m:]  # (slots, S)
        self._pop = self.pop.numpy()
        self._stats = self.stats.numpy()[0]

    def tables(self) -> dict[str, torch.Tensor]:
        return {f"{PREFIX}.ctx": self.ctx.buf, f"{PREFIX}.succ": self.succ, f"{PREFIX}.pop": self.pop,
                f"{PREFIX}.stats": self.stats}

    def word_tables(self) -> frozenset[str]:
        """The tables whose float32 words hold bits (context keys, output codes), not numbers."""
        return frozenset({f"{PREFIX}.ctx", f"{PREFIX}.succ"})

    # ------------------------------------------------------------------ scores

    def components(self, ctx: np.ndarray,
                   in_order: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None) -> tuple[np.ndarray, ...]:
        """Q_j(b | c) of examples with context keys ``ctx`` (n, ORDERS) (the module
        docstring's Witten-Bell backoff) as a shared dense term plus sparse entries:

        - ``pop`` (m, size) float32: pop_j(b) (shared by every example) and ``base`` (n,)
          float32 its weight in each example's Q (the mass every order backed off);
        - ``at`` (E,) int64 the flat index example * m * size + j * size + b of each held
          successor's bucket, ``value`` (E,) float32 its mass (two successors sharing a
          bucket are two entries: they add up);
        - ``evidence`` (n, 2 ORDERS) float32: log(1 + n_o(c)), log(1 + T_o(c)), 0 if unseen.

        ``in_order`` = (``codes`` (n, m), ``every`` (M, m), ``before`` (n,)) for a training
        batch predicted before it is learned: the examples' answers, every event's item
        and the number of events before each example. Example i's Q then counts what the
        batch holds before it, as a baseline learning record by record does: the
        transitions of the examples before it (:meth:`_batch_prefix`) and the items of
        the events before it.
        """
        n, m, size = len(ctx), self.m, self.size
        flat = ctx.reshape(-1)
        slot = np.where(flat != 0, self.ctx.find(flat), -1)  # (n * ORDERS,)
        vals = np.where((slot >= 0)[:, None], self.ctx.get(flat), 0.0)  # (n * ORDERS, 2)
        counts = np.where((slot >= 0)[:, None], self._counts[np.maximum(slot, 0)], 0.0)  # (n ORDERS, S)
        held = counts.sum(1)  # n_o(c): Space-Saving keeps the sum of the counts equal to the events
        types = np.where(held > 0, np.maximum(vals[:, 1], 1.0), 0.0)  # T_o(c)
        if in_order is not None:
            answers, every, before = in_order
            events, new_types, (ex, earlier, order) = self._batch_prefix(ctx, slot, answers)
            held, types = held + events, types + new_types
            vals = vals + np.stack([events, new_types], 1)
        evidence = np.log1p(vals).astype(np.float32).reshape(n, 2 * ORDERS)
        keep = (held / np.maximum(held + types, 1.0)).reshape(n, ORDERS)  # the mass an order keeps
        backed = np.where(held > 0, types / np.maximum(held + types, 1.0), 1.0).reshape(n, ORDERS)
        # highest order first: order o's entries get the mass the orders above backed off
        above = np.concatenate([np.cumprod(backed[:, ::-1], 1)[:, ::-1][:, 1:], np.ones((n, 1))], 1)  # (n, ORDERS)
        scale = (above * keep / np.maximum(held.reshape(n, ORDERS), 1.0)).reshape(-1)  # per count
        e, place = np.nonzero(counts > 0)  # (E',) the (example, order) and the place of every successor held
        value = (counts[e, place] * scale[e]).astype(np.float32)
        codes = self._codes[slot[e], place].astype(np.int64)  # (E', m)
        rows = e // ORDERS  # (E',) each entry's example
        N = float(self._stats[0])
        pop = ((self._pop + 0.5) / (N + 0.5 * size)).astype(np.float32)
        base = backed.prod(1)  # (n,)
        if in_order is not None:
            # the batch's transitions before each example: one entry per earlier example
            prefix = ex * ORDERS + order
            value = np.concatenate([value, scale[prefix].astype(np.float32)])
            codes = np.concatenate([codes, answers[earlier].astype(np.int64)])
            rows = np.concatenate([rows, ex])
            # popularity with the events before each example counted: the shared term at
            # N / (N + before) of its weight, the earlier events' items as entries
            before = np.asarray(before, dtype=np.float64)
            weight = base / (N + 0.5 * size + before)  # (n,) one event's mass in example i's Q
            base = base * (N + 0.5 * size) / (N + 0.5 * size + before)
            i, k = np.nonzero(np.arange(len(every))[None, :] < before[:, None])  # (example, earlier event)
            value = np.concatenate([value, weight[i].astype(np.float32)])
            codes = np.concatenate([codes, every[k].astype(np.int64)])
            rows = np.concatenate([rows, i])
        at = ((rows[:, None] * m + np.arange(m)) * size + codes).reshape(-1)  # (E m,)
        return pop, base.astype(np.float32), at, np.repeat(value, m), evidence

    def _batch_prefix(self, ctx: np.ndarray, slot: np.ndarray, codes: np.ndarray):
        """What the examples before each one add to its contexts' counts (n examples,
        ``ctx`` (n, ORDERS), their slots ``slot`` (n * ORDERS,), answers ``codes`` (n, m)):
        events (n * ORDERS,) and new successor types (n * ORDERS,) per (example, order),
        and (example, earlier example, order) of every earlier example with the same
        context. A successor is new unless the context holds it (counted) or an earlier
        example of the batch already added it."""
        n = len(ctx)
        earlier = np.arange(n)[:, None] > np.arange(n)[None, :]  # (i, j): j before i
        same = (ctx[:, None, :] == ctx[None, :, :]) & (ctx[None, :, :] != 0) & earlier[:, :, None]  # (i, j, o)
        where = np.maximum(slot, 0).reshape(n, ORDERS)
        held = ((self._codes[where] == codes[:, None, None, :]).all(-1)
                & (self._counts[where] > 0)).any(-1) & (slot.reshape(n, ORDERS) >= 0)  # (n, o)
        repeat = (same & (codes[:, None, :] == codes[None, :, :]).all(-1)[:, :, None]).any(1)  # (n, o)
        new = ~held & ~repeat
        events = same.sum(1).reshape(-1).astype(np.float64)
        new_types = (same & new[None, :, :]).sum(1).reshape(-1).astype(np.float64)
        return events, new_types, np.nonzero(same)

    # ------------------------------------------------------------------ counting

    def learn(self, ctx: np.ndarray, codes: np.ndarray, every: np.ndarray) -> dict[str, np.ndarray]:
        """Count each example's transition (context keys ``ctx`` (n, ORDERS) -> its item's
        output code ``codes`` (n, m)) and every event's item ``every`` (M, m) for
        popularity; returns the changed rows by store name."""
        out: dict[str, np.ndarray] = {}
        if len(every):
            for j in range(self.m):
                self._pop[j] += np.bincount(every[:, j], minlength=self.size).astype(np.float32)
            self._stats[0] += len(every)
            out[f"{PREFIX}.pop"] = np.arange(self.m)
            out[f"{PREFIX}.stats"] = np.zeros(1, dtype=np.int64)
        keys = ctx.reshape(-1)
        have = np.nonzero(keys != 0)[0]
        if not len(have):
            return out
        keys, codes = keys[have], np.repeat(codes, ORDERS, axis=0)[have]  # (k,), (k, m)
        ukeys = np.unique(keys)
        halved = self._halve_if_full(len(ukeys))
        succ_rows, ctx_rows = self._count(keys, codes.astype(np.int32), ukeys)
        if halved:  # every context moved
            succ_rows, ctx_rows = np.arange(self.ctx.slots), np.arange(self.ctx.rows)
        out[f"{PREFIX}.ctx"], out[f"{PREFIX}.succ"] = ctx_rows, succ_rows
        return out

    def _count(self, keys: np.ndarray, codes: np.ndarray, ukeys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Add the (context, successor) pairs; returns the changed rows of ``succ`` and
        of ``ctx``."""
        pair = np.concatenate([keys.view(np.int32).reshape(-1, 2), codes], 1)  # (k, 2 + m) int32
        upair, count = np.unique(pair, axis=0, return_counts=True)
        pkeys = np.ascontiguousarray(upair[:, :2]).view(np.uint64).reshape(-1)  # (p,)
        pcodes = upair[:, 2:]  # (p, m)
        total = np.zeros(len(ukeys), dtype=np.float32)
        np.add.at(total, np.searchsorted(ukeys, pkeys), count)
        delta = np.stack([total, np.zeros_like(total)], 1)
        _, ctx_rows = self.ctx.add_unique(ukeys, delta)
        slot = self.ctx.find(pkeys)  # (p,) every context has a slot now
        held = self._codes[slot]  # (p, S, m)
        match = (held == pcodes[:, None]).all(-1) & (self._counts[slot] > 0)  # (p, S)
        found = match.any(1)
        at = match.argmax(1)
        np.add.at(self._counts, (slot[found], at[found]), count[found].astype(np.float32))
        self._place(slot[~found], pcodes[~found], count[~found].astype(np.float32))
        types = np.zeros(len(ukeys), dtype=np.float32)
        np.add.at(types, np.searchsorted(ukeys, pkeys[~found]), 1.0)
        new_types = np.stack([np.zeros_like(types), types], 1)
        _, more = self.ctx.add_unique(ukeys, new_types)
        return np.unique(slot), np.union1d(ctx_rows, more)

    def _place(self, slot: np.ndarray, codes: np.ndarray, count: np.ndarray) -> None:
        """New successors of contexts ``slot``: each takes its context's least counted place
        (a free one first) with that place's count added (Space-Saving); one per context per
        round, so two new successors of one context never take the same place."""
        while len(slot):
            _, first = np.unique(slot, return_index=True)
            s = slot[first]
            at = self._counts[s].argmin(1)
            self._counts[s, at] += count[first]
            self._codes[s, at] = codes[first]
            rest = np.ones(len(slot), dtype=bool)
            rest[first] = False
            slot, codes, count = slot[rest], codes[rest], count[rest]

    def _halve_if_full(self, adding: int) -> bool:
        """Halve until ``adding`` new contexts fit under the table's maximum load."""
        halved = False
        while self.ctx.used + adding > self.ctx.max_load * self.ctx.slots and self.ctx.used:
            self._halve()
            halved = True
        return halved

    def _halve(self) -> None:
        """Every count halved and rounded down; contexts left without successors dropped;
        both tables rewritten (the context slots move)."""
        occ = np.nonzero(self.ctx.keys != 0)[0]
        keys = self.ctx.keys[occ].copy()
        vals = self.ctx.get(keys).copy()
        codes, counts = self._codes[occ].copy(), np.floor(self._counts[occ] / 2)
        types = (counts > 0).sum(1).astype(np.float32)
        keep = types > 0
        vals = np.stack([np.floor(vals[:, 0] / 2), np.minimum(vals[:, 1], types)], 1)[keep]
        self.ctx.clear()
        self.succ.zero_()
        if keep.any():
            self.ctx.add_unique(keys[keep], vals)
            slot = self.ctx.find(keys[keep])
            self._codes[slot] = codes[keep]
            self._counts[slot] = counts[keep]
