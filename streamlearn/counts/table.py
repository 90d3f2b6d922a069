"""A fixed-size open-addressing table: uint64 keys -> two float32 values, batched numpy ops.

Keys are 64-bit hashes of n-grams (0 is reserved for "empty"), so two different n-grams
share a slot only if their 64-bit hashes collide (about n^2 / 2^65: never, at these
sizes): the counts are exact until the table fills, and the owner halves it before that
(:meth:`KneserNey3.learn <streamlearn.counts.kn.KneserNey3.learn>`).

Linear probing from the top bits of the key; a batch of lookups probes in lock-step (one
``take`` of keys per round, only the unresolved keys go on). Measured in the research
prototype (66k lookups, half present, 2 CPU cores): 1.2 ms at load 0.21, 2.8 ms at 0.43;
so the table refuses to pass ``max_load``.

Storage: one float32 tensor ``buf`` (rows, 256) of 1 KB rows, the stored row table: its
first half holds the keys (128 uint64 per row), its second half the values (two float32
packed per uint64, 128 slots per row), and a last header row the count of occupied slots. Keys and values are each contiguous, so a batched
``np.take`` reads them in place (on a strided view numpy copies the whole array per call:
measured 1.2 ms a lookup on 2^21 slots, most of a step). A checkpoint writes the rows a
batch touched (:meth:`add_unique` returns them) and a restore copies rows back into
``buf``: the numpy views read the restored bytes. The float32 words holding key bits are
never used as numbers (a key can read as NaN; only its bytes are copied).

>>> t = CountTable(slots=128)
>>> keys = np.array([5, 7, 5], dtype=np.uint64)
>>> t.add(keys, np.ones((3, 2), np.float32)).tolist()  # a key row, its value row, the header row
[0, 1, 2]
>>> t.get(np.array([5, 7, 9], dtype=np.uint64))[:, 0].tolist()
[2.0, 1.0, 0.0]
"""
from __future__ import annotations

import numpy as np
import torch

from ..exceptions import StreamlearnError

__all__ = ["ROW", "CountTable", "TableFullError", "distinct"]

ROW = 128  # slots per stored row of keys or of values (checkpoint granularity: 1 KB)
GOLDEN = np.uint64(0x9E3779B97F4A7C15)  # a key's home slot: the top bits of key * GOLDEN


def distinct(values: np.ndarray) -> np.ndarray:
    """Sorted distinct values of a 1-d array: np.unique without its flags takes numpy
    2's hash path, measured 60 us on 900 row ids against 4 us for this sort (it was half
    of a table pass's time)."""
    s = np.sort(values)
    return s[np.concatenate([[True], s[1:] != s[:-1]])] if len(s) else s


def _first_of_each(values: np.ndarray) -> np.ndarray:
    """Index of the first occurrence of each distinct value (np.unique's return_index,
    without its bookkeeping: a quarter of an insert's time)."""
    order = np.argsort(values, kind="stable")
    s = values[order]
    return order[np.concatenate([[True], s[1:] != s[:-1]])] if len(s) else order


class TableFullError(StreamlearnError):
    """A count table would pass its maximum load."""


class CountTable:
    """``slots`` (a power of two, a multiple of :data:`ROW`) slots of (key, 2 x float32)."""

    def __init__(self, slots: int, max_load: float = 0.5):
        if slots & (slots - 1) or slots < ROW:
            raise StreamlearnError(f"a count table needs a power of two >= {ROW} slots, got {slots}")
        self.slots, self.max_load = slots, max_load
        self._shift = np.uint64(64 - (slots.bit_length() - 1))
        self.buf = torch.zeros(2 * slots // ROW + 1, 2 * ROW)  # (rows, 256) float32: the stored row table
        words = self.buf.numpy().view(np.uint64).reshape(-1)  # a view: restored rows show here
        self.keys = words[:slots]  # (slots,) uint64, 0 = empty
        self.vals = words[slots:2 * slots]  # (slots,) two float32 packed in one uint64
        self.header = words[2 * slots:]  # the last row: word 0 counts the occupied slots

    @property
    def used(self) -> int:
        """Occupied slots (kept in the header row: a scan of the keys cost 0.2 ms a call
        at 2^21 slots, several calls a step)."""
        return int(self.header[0])

    def _home(self, keys: np.ndarray) -> np.ndarray:
        return ((keys * GOLDEN) >> self._shift).astype(np.int64)

    def find(self, keys: np.ndarray) -> np.ndarray:
        """Slot of each key (M,), -1 where absent. (Array methods, not ``np.take``: the
        function's dispatch wrapper was a quarter of the lookups' time, at 20-odd
        lookups a step.)"""
        if not len(keys):
            return np.empty(0, dtype=np.int64)
        idx = self._home(keys)
        k = self.keys.take(idx)
        hit = k == keys
        out = np.where(hit, idx, -1)
        todo = (~hit & (k != 0)).nonzero()[0]  # an empty slot ends a probe: absent
        idx = idx[todo]
        mask = self.slots - 1
        while len(todo):
            idx = (idx + 1) & mask
            k = self.keys.take(idx)
            hit = k == keys[todo]
            out[todo[hit]] = idx[hit]
            more = ~hit & (k != 0)
            todo, idx = todo[more], idx[more]
        return out

    def get(self, keys: np.ndarray) -> np.ndarray:
        """Values (M, 2) float32 of the keys, zeros where absent."""
        slot = self.find(keys)
        packed = np.where(slot >= 0, self.vals.take(np.maximum(slot, 0)), np.uint64(0))
        return packed.view(np.float32).reshape(-1, 2)

    def _insert(self, keys: np.ndarray) -> np.ndarray:
        """Slots of distinct keys (M,), claiming empty slots for new ones."""
        slot = self.find(keys)
        new = (slot < 0).nonzero()[0]
        if not len(new):
            return slot
        if self.used + len(new) > self.max_load * self.slots:
            raise TableFullError(f"a count table of {self.slots} slots would pass {self.max_load:.0%} load: "
                                 "raise model.count_slots")
        self.header[0] += np.uint64(len(new))
        idx = self._home(keys[new])
        mask = self.slots - 1
        while len(new):
            free = self.keys.take(idx) == 0
            cand, cidx = new[free], idx[free]
            first = _first_of_each(cidx)  # one claimant per empty slot: the earliest
            self.keys[cidx[first]] = keys[cand[first]]
            slot[cand[first]] = cidx[first]
            placed = np.zeros(len(new), dtype=bool)
            placed[free.nonzero()[0][first]] = True
            new, idx = new[~placed], (idx[~placed] + 1) & mask
        return slot

    def add(self, keys: np.ndarray, delta: np.ndarray) -> np.ndarray:
        """values[key] += delta (M, 2) (repeated keys add up); returns the touched rows."""
        uk, inv = np.unique(keys, return_inverse=True)
        d = np.zeros((len(uk), 2), dtype=np.float32)
        np.add.at(d, inv.reshape(-1), delta)
        return self.add_unique(uk, d)[1]

    def add_unique(self, keys: np.ndarray, delta: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """values[key] += delta (M, 2) for distinct keys; returns (the old values (M, 2),
        the touched rows, sorted)."""
        slot = self._insert(keys)
        old = self.vals.take(slot).view(np.float32).reshape(-1, 2)
        self.vals[slot] = (old + delta.astype(np.float32)).view(np.uint64).reshape(-1)
        rows = distinct(slot // ROW)
        header = self.buf.shape[0] - 1
        return old, np.concatenate([rows, rows + self.slots // ROW, [header]])  # key rows, value rows, header

    def entries(self) -> tuple[np.ndarray, np.ndarray]:
        """Every occupied slot's key (M,) and values (M, 2), copies."""
        occ = self.keys != 0
        return self.keys[occ].copy(), self.vals[occ].view(np.float32).reshape(-1, 2).copy()

    def clear(self) -> None:
        self.buf.zero_()

    @property
    def rows(self) -> int:
        return self.buf.shape[0]
