"""Training objectives on token lists: numpy only, no torch, no model.

- :func:`mlm_mask`: BERT's masking as Superbloom uses it: each token is chosen with
  probability p (15%); a chosen token's input becomes [MASK] (80%), a random token
  (10%) or stays unchanged (10%), and the model predicts the original there.
- :func:`shuffle_random`: HashFormers' Shuffle+Random (after Yamaguchi et al., 2021):
  10% of the tokens are shuffled among themselves within their sequence, another 10%
  replaced by random tokens; every token is labelled intact / shuffled / random.
- :class:`LabelTable`: the classification labels seen so far, up to a capacity.
- :class:`Histories`: each next-item key's last n items, in stream order.

"Random tokens" come from the batch itself (a draw from the stream's unigram
distribution): there is no vocabulary to draw from.

>>> rng = np.random.default_rng(0)
>>> m = mlm_mask([["a", "b", "c", "d"]], rng)
>>> len(m.targets) >= 1 and all(t in "abcd" for t in m.targets)
True
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Hashable, Sequence

import numpy as np

from .exceptions import LabelCapacityError, RecordError

MASK_TOKEN = "\x00[MASK]"  # input placeholder at [MASK] slots; the model swaps in a learned vector
BOS_TOKEN = "\x00[BOS]"  # before a sequence's first token (next-token inputs, n-gram contexts)
EOS_TOKEN = "\x00[EOS]"  # after a sequence's last token (two-sided n-gram contexts)
INTACT, SHUFFLED, RANDOM = 0, 1, 2  # Shuffle+Random classes
SR_RATE = 0.1  # shuffled share, and random share, of the tokens (Yamaguchi et al.)


@dataclass(frozen=True)
class Masked:
    """An mlm-corrupted batch: inputs, and at each chosen position (rows[i], cols[i])
    the original token ``targets[i]``; ``slots[i]`` is True where the input is [MASK]."""

    token_lists: list[list[str]]
    rows: np.ndarray  # (n,) int64
    cols: np.ndarray  # (n,) int64
    targets: list[str]
    slots: np.ndarray  # (n,) bool


def _flat(token_lists: Sequence[Sequence[str]]) -> tuple[list[str], np.ndarray, np.ndarray]:
    lengths = np.fromiter(map(len, token_lists), dtype=np.int64, count=len(token_lists))
    starts = np.zeros(len(lengths), dtype=np.int64)
    np.cumsum(lengths[:-1], out=starts[1:])
    return [t for ts in token_lists for t in ts], lengths, starts


def _split(flat: list[str], lengths: np.ndarray, starts: np.ndarray) -> list[list[str]]:
    return [flat[s:s + n] for s, n in zip(starts.tolist(), lengths.tolist())]


def mlm_mask(token_lists: Sequence[Sequence[str]], rng: np.random.Generator, p: float = 0.15,
             mask_frac: float = 0.8, random_frac: float = 0.1) -> Masked:
    """Choose each token with probability ``p`` (at least one per non-empty list, so
    every record teaches something), then corrupt 80/10/10 as described above."""
    flat, lengths, starts = _flat(token_lists)
    M = len(flat)
    chosen = rng.random(M) < p  # (M,)
    row_of = np.repeat(np.arange(len(lengths)), lengths)
    hit = np.bincount(row_of[chosen], minlength=len(lengths))
    empty = np.flatnonzero((hit == 0) & (lengths > 0))
    chosen[starts[empty] + (rng.random(len(empty)) * lengths[empty]).astype(np.int64)] = True
    idx = np.flatnonzero(chosen)
    u = rng.random(len(idx))
    slots = u < mask_frac
    randomized = idx[(u >= mask_frac) & (u < mask_frac + random_frac)]
    donors = rng.integers(0, max(M, 1), size=len(randomized))
    corrupted = list(flat)
    for i in idx[slots].tolist():
        corrupted[i] = MASK_TOKEN
    for i, j in zip(randomized.tolist(), donors.tolist()):
        corrupted[i] = flat[j]
    return Masked(
        _split(corrupted, lengths, starts), row_of[idx], idx - starts[row_of[idx]],
        [flat[i] for i in idx.tolist()], slots,
    )


def shuffle_random(token_lists: Sequence[Sequence[str]], rng: np.random.Generator,
                   rate: float = SR_RATE) -> tuple[list[list[str]], np.ndarray]:
    """Corrupted lists and the per-token class (M,) int64, row-major over valid tokens.

    A token counts as shuffled or random only if it actually changed: a shuffle that
    puts a token back in place, or a random draw of the same token, is undetectable
    and labelled intact.
    """
    flat, lengths, starts = _flat(token_lists)
    M = len(flat)
    row_of = np.repeat(np.arange(len(lengths)), lengths)
    u = rng.random(M)
    shuf = np.flatnonzero(u < rate)
    rand = np.flatnonzero((u >= rate) & (u < 2 * rate))
    # Group the shuffled positions by row in random order; both lists hold the same
    # count per row, so position shuf[i] receives a token from its own row.
    perm = shuf[np.lexsort((rng.random(len(shuf)), row_of[shuf]))]
    donors = rng.integers(0, max(M, 1), size=len(rand))
    corrupted = list(flat)
    for i, j in zip(shuf.tolist(), perm.tolist()):
        corrupted[i] = flat[j]
    for i, j in zip(rand.tolist(), donors.tolist()):
        corrupted[i] = flat[j]
    labels = np.zeros(M, dtype=np.int64)
    changed = np.fromiter((a != b for a, b in zip(corrupted, flat)), dtype=bool, count=M)
    labels[shuf] = SHUFFLED
    labels[rand] = RANDOM
    labels[~changed] = INTACT
    return _split(corrupted, lengths, starts), labels


# ---------------------------------------------------------------------------- labels

def _label_key(label: Hashable) -> tuple:
    # True == 1 in a dict: keep bool and int labels apart.
    return (type(label) is bool, label)


@dataclass
class LabelTable:
    """Labels in order of first appearance; a label's id is its row in the label head.

    >>> t = LabelTable(capacity=2)
    >>> t.add("spam"), t.add("ham"), t.add("spam")
    (0, 1, 0)
    >>> t.add("eggs")
    Traceback (most recent call last):
    ...
    streamlearn.exceptions.LabelCapacityError: label-capacity: label 'eggs' would be label 3 of model.max_labels=2; raise model.max_labels (and retrain) to admit more labels
    """

    capacity: int
    labels: list = field(default_factory=list)

    def __post_init__(self) -> None:
        self._ids = {_label_key(lab): i for i, lab in enumerate(self.labels)}

    def __len__(self) -> int:
        return len(self.labels)

    def get(self, label) -> int | None:
        return self._ids.get(_label_key(label))

    def add(self, label) -> int:
        """The label's id, adding it if new; LabelCapacityError when full."""
        if not isinstance(label, (str, int)):
            raise RecordError(f"wrong-type: label must be str or int, got {type(label).__name__}")
        key = _label_key(label)
        if key in self._ids:
            return self._ids[key]
        if len(self.labels) >= self.capacity:
            raise LabelCapacityError(
                f"label-capacity: label {label!r} would be label {len(self.labels) + 1} of "
                f"model.max_labels={self.capacity}; raise model.max_labels (and retrain) to admit more labels"
            )
        self._ids[key] = len(self.labels)
        self.labels.append(label)
        return self._ids[key]

    def replace(self, labels: list) -> None:
        """Hold ``labels`` from now on, in this order (a label's id is its new position),
        e.g. a merged table of several replicas; the caller moves the head rows."""
        self.labels[:] = labels
        self.__post_init__()


# ---------------------------------------------------------------------------- histories

class Histories:
    """Each key's last ``n`` items, oldest first; tracks the keys changed since the last
    :meth:`take_dirty` so a checkpoint writes only those."""

    def __init__(self, n: int):
        if n < 1:
            raise ValueError(f"history length must be >= 1, got {n}")
        self.n = n
        self._items: dict[str, tuple[str, ...]] = {}
        self._dirty: set[str] = set()

    def __len__(self) -> int:
        return len(self._items)

    def get(self, key: str) -> tuple[str, ...]:
        return self._items.get(key, ())

    def push(self, key: str, item: str) -> None:
        self._items[key] = (self._items.get(key, ()) + (item,))[-self.n:]
        self._dirty.add(key)

    def items(self):
        return self._items.items()

    def take_dirty(self) -> dict[str, tuple[str, ...]]:
        out = {k: self._items[k] for k in sorted(self._dirty)}
        self._dirty.clear()
        return out

    def load(self, key: str, items: Sequence[str]) -> None:
        self._items[key] = tuple(items)[-self.n:]
