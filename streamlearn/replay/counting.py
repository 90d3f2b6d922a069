"""Counting baselines for the tasks that answer with tokens: popularity, Markov, n-gram.

They learn one record at a time (the replay loop calls them so), so every structure here
is kept current incrementally: a count that grows by one moves its item within
:class:`RankedCounts` in time proportional to the items sharing its count, never by
sorting everything again, and a top-k list reads only as far as it needs.

Every list skips the event's excluded items (a next-item key's own items); ties go to the
more popular item, then to the item seen first.

- :class:`Popularity`: the most frequent tokens (items) so far.
- :class:`Markov`: the tokens that most often followed the previous one, then popularity.
- :class:`NGram`: next-token, an interpolated Kneser-Ney trigram (Chen & Goodman) with
  backoff to the bigram and the unigram, one discount per order from the
  counts-of-counts, ``D = n1 / (n1 + 2 n2)``, kept online; masked tokens (an event with a
  right neighbour), the two-sided version: counts of (left, token, right) interpolated
  with the mean of P(token | left) and P(token | right), each an absolutely discounted
  bigram backing off to the unigram.

>>> from streamlearn.tasks.base import Event
>>> ev = lambda t, left: Event(0, None, t, True, None, counts=(t,), left=left, ngrams=(left + (t,),))
>>> ng = NGram(k=2)
>>> ng.learn([ev("cat", ("<s>", "the")), ev("dog", ("<s>", "the")), ev("cat", ("<s>", "the"))])
>>> ng.predict([ev("?", ("<s>", "the"))])
[['cat', 'dog']]
"""
from __future__ import annotations

import heapq
from bisect import bisect_left, insort
from collections import defaultdict
from typing import Iterator, Sequence

from ..tasks.base import Event
from .baselines import Baseline

__all__ = ["Markov", "NGram", "Popularity", "RankedCounts"]


class RankedCounts:
    """Counts of items, and the items ranked by count (descending), first seen first on
    ties, kept as counts grow: each count level holds its items' first-seen ordinals in
    order, and the levels are kept sorted."""

    def __init__(self) -> None:
        self.items: list[str] = []  # ordinal -> item
        self.ordinal: dict[str, int] = {}
        self.counts: list[int] = []  # ordinal -> count
        self.total = 0
        self._level: dict[int, list[int]] = {}  # count -> ordinals with that count, ascending
        self._levels: list[int] = []  # the counts present, ascending

    def __len__(self) -> int:
        return len(self.items)

    def count(self, item: str) -> int:
        i = self.ordinal.get(item)
        return 0 if i is None else self.counts[i]

    def first(self, item: str) -> int:
        """The item's first-seen ordinal (a large number for an item never seen)."""
        return self.ordinal.get(item, len(self.items))

    def add(self, item: str) -> int:
        """Count ``item`` once; returns its count before."""
        i = self.ordinal.get(item)
        if i is None:
            i = self.ordinal[item] = len(self.items)
            self.items.append(item)
            self.counts.append(0)
        old = self.counts[i]
        if old:
            self._leave(old, i)
        self._enter(old + 1, i)
        self.counts[i] = old + 1
        self.total += 1
        return old

    def ranked(self) -> Iterator[str]:
        """Items by count descending, first seen first on ties."""
        for count in reversed(self._levels):
            for i in self._level[count]:
                yield self.items[i]

    def top(self, want: int, skip) -> list[str]:
        """The first ``want`` of :meth:`ranked` for which ``skip(item)`` is False."""
        out: list[str] = []
        if want <= 0:
            return out
        for item in self.ranked():
            if not skip(item):
                out.append(item)
                if len(out) == want:
                    break
        return out

    def _leave(self, count: int, i: int) -> None:
        level = self._level[count]
        del level[bisect_left(level, i)]
        if not level:
            del self._level[count]
            del self._levels[bisect_left(self._levels, count)]

    def _enter(self, count: int, i: int) -> None:
        level = self._level.get(count)
        if level is None:
            self._level[count] = [i]
            insort(self._levels, count)
        else:
            insort(level, i)


class Popularity(Baseline):
    """The k most frequent items so far, minus the event's excluded ones."""

    name = "popularity"

    def __init__(self, k: int):
        super().__init__()
        self.k = k
        self.counts = RankedCounts()

    def learn(self, events: Sequence[Event]) -> None:
        for e in events:
            for item in e.counts:
                self.counts.add(item)

    def predict(self, events: Sequence[Event]) -> list:
        return [self.top(e, set(), self.k) for e in events]

    def top(self, event: Event, taken: set[str], want: int) -> list[str]:
        """The ``want`` most popular items that are neither excluded nor in ``taken``."""
        return self.counts.top(want, lambda item: item in taken or event.excluded(item))

    def key(self, item: str) -> tuple[int, int]:
        """Sort key of the popularity order (more popular first, then seen first)."""
        return -self.counts.count(item), self.counts.first(item)


class Markov(Baseline):
    """First-order transitions: the items that most often followed the event's previous
    item (ties: the more popular, then the one seen first), then popular items to fill the
    k slots. Breaking ties by popularity rather than by arrival alone matters: most
    transitions are seen once or twice (MovieLens recall@10 0.1034 -> 0.1183)."""

    name = "markov"

    def __init__(self, k: int):
        super().__init__()
        self.k = k
        self.after: dict[str, dict[str, int]] = defaultdict(dict)
        self.popularity = Popularity(k)

    def learn(self, events: Sequence[Event]) -> None:
        for e in events:
            for a, b in e.transitions:
                row = self.after[a]
                row[b] = row.get(b, 0) + 1
        self.popularity.learn(events)

    def predict(self, events: Sequence[Event]) -> list:
        return [self._top(e) for e in events]

    def _top(self, event: Event) -> list[str]:
        row = self.after.get(event.prev) if event.prev is not None else None
        pop = self.popularity
        out = []
        if row:
            allowed = {item: c for item, c in row.items() if not event.excluded(item)} if event.n_excluded else row
            if len(allowed) > self.k:  # only counts at least the k-th largest can make the list
                cut = heapq.nlargest(self.k, allowed.values())[-1]
                allowed = {item: c for item, c in allowed.items() if c >= cut}
            out = sorted(allowed, key=lambda item: (-allowed[item], *pop.key(item)))[: self.k]
        return out + pop.top(event, set(out), self.k - len(out))


class _Discount:
    """Counts-of-counts n1, n2 of one table, kept as counts grow; D = n1 / (n1 + 2 n2)."""

    def __init__(self) -> None:
        self.n1 = self.n2 = 0

    def bump(self, old: int) -> None:
        """A count went from ``old`` to ``old + 1``."""
        if old == 0:
            self.n1 += 1
        elif old == 1:
            self.n1 -= 1
            self.n2 += 1
        elif old == 2:
            self.n2 -= 1

    @property
    def D(self) -> float:
        den = self.n1 + 2 * self.n2
        return self.n1 / den if den else 0.5


class _Table:
    """context -> {token: count}, with per-context totals and the table's discount."""

    def __init__(self) -> None:
        self.rows: dict[tuple, dict[str, int]] = defaultdict(dict)
        self.totals: dict[tuple, int] = defaultdict(int)
        self.discount = _Discount()

    def add(self, context: tuple, token: str) -> int:
        row = self.rows[context]
        old = row.get(token, 0)
        row[token] = old + 1
        self.totals[context] += 1
        self.discount.bump(old)
        return old

    def smoothed(self, context: tuple) -> tuple[dict[str, int], int, float, float]:
        """(row, total, D, lambda): P(w) = max(c(w) - D, 0) / total + lambda * lower(w)."""
        row, total = self.rows.get(context, {}), self.totals.get(context, 0)
        D = self.discount.D
        return row, total, D, (D * len(row) / total) if total else 1.0


class NGram(Baseline):
    """Next-token Kneser-Ney trigram, or the two-sided model for masked tokens (module
    docstring). Reads ``event.left`` (the two tokens before the answer, sentinel-padded)
    and ``event.right`` (the token after it: masked tokens only, None otherwise), and
    learns ``event.ngrams``: three consecutive tokens each, sentinel-padded (next-token:
    the answer is the third; masked: the second)."""

    name = "ngram"

    def __init__(self, k: int):
        super().__init__()
        self.k = k
        self.tri, self.bi, self.back = _Table(), _Table(), _Table()
        self.unigram = RankedCounts()  # next-token: continuation counts N1+(. w); masked: counts
        self.d1 = _Discount()

    # ------------------------------------------------------------------ learn
    def learn(self, events: Sequence[Event]) -> None:
        for e in events:
            for x, y, z in e.ngrams:
                if e.right is None:
                    self._learn_next(x, y, z)
                else:
                    self._learn_masked(x, y, z)

    def _learn_next(self, u: str, v: str, w: str) -> None:
        """A trigram (u, v, w): Kneser-Ney's lower orders count new contexts only."""
        if self.tri.add((u, v), w) == 0 and self.bi.add((v,), w) == 0:
            self._unigram(w)

    def _learn_masked(self, left: str, w: str, right: str) -> None:
        self.tri.add((left, right), w)
        self.bi.add((left,), w)
        self.back.add((right,), w)
        self._unigram(w)

    def _unigram(self, w: str) -> None:
        self.d1.bump(self.unigram.add(w))

    # ------------------------------------------------------------------ predict
    def predict(self, events: Sequence[Event]) -> list:
        return [self._top(e) for e in events]

    def _unigram_p(self):
        """The unigram p1(w), absolutely discounted and interpolated with the uniform over
        the tokens seen: (max(c - D, 0) + D) / total for a seen token, a monotone function
        of its count (so its order is the ranking's); as a function with the table's total
        and discount read once (it is called for every token a context has seen, per
        event)."""
        uni = self.unigram
        total, D, ordinal, counts = uni.total, self.d1.D, uni.ordinal, uni.counts
        if not total:
            return lambda w: 0.0

        def p1(w: str) -> float:
            i = ordinal.get(w)
            return ((counts[i] - D if counts[i] > D else 0.0) + D) / total if i is not None else D / total
        return p1

    def _scores(self, e: Event, p1) -> tuple[dict[str, float], float]:
        """Exact scores of the tokens some context has seen, and the factor ``f`` every
        other token's score is ``f * p1(w)`` times (so their order is the unigram's);
        ``p1``: :meth:`_unigram_p`."""
        u, v = e.left[-2], e.left[-1]
        if e.right is None:
            row3, tot3, D3, l3 = self.tri.smoothed((u, v))
            row2, tot2, D2, l2 = self.bi.smoothed((v,))
            # scores[w] = l3 * lower(w) + max(c3(w) - D3, 0) / tot3, lower(w) = l3's backoff:
            # max(c2(w) - D2, 0) / tot2 + l2 * p1(w), or l2 * p1(w) for a w row2 lacks
            scores = {w: l3 * ((c - D2 if c > D2 else 0.0) / tot2 + l2 * p1(w)) for w, c in row2.items()} \
                if tot2 else {}
            for w, c in row3.items():
                lower = scores.get(w)
                scores[w] = (l3 * (l2 * p1(w)) if lower is None else lower) + (c - D3 if c > D3 else 0.0) / tot3
            return scores, l3 * l2
        row3, tot3, D3, l3 = self.tri.smoothed((v, e.right))
        rowl, totl, Dl, ll = self.bi.smoothed((v,))
        rowr, totr, Dr, lr = self.back.smoothed((e.right,))

        def side(w: str) -> float:
            pw = p1(w)
            pl = (max(rowl.get(w, 0) - Dl, 0) / totl if totl else 0.0) + ll * pw
            pr = (max(rowr.get(w, 0) - Dr, 0) / totr if totr else 0.0) + lr * pw
            return 0.5 * (pl + pr)

        seen = set(row3) | set(rowl) | set(rowr)
        scores = {w: (max(row3.get(w, 0) - D3, 0) / tot3 if tot3 else 0.0) + l3 * side(w) for w in seen}
        return scores, l3 * 0.5 * (ll + lr)

    def _top(self, e: Event) -> list[str]:
        p1 = self._unigram_p()
        scores, f = self._scores(e, p1)
        uni = self.unigram
        ordinal, counts, unseen = uni.ordinal, uni.counts, len(uni.items)

        def rank(w: str, score: float) -> tuple[float, int, int]:
            """Higher score first, then the more frequent token, then the one seen first."""
            i = ordinal.get(w)
            return (-score, 0, unseen) if i is None else (-score, -counts[i], i)

        allowed = {w: s for w, s in scores.items() if not e.excluded(w)} if e.n_excluded else scores
        # Rows of common contexts hold thousands of tokens: only those scoring at least the
        # k-th best score can be in the top k, so only they are ranked with the tie-breaks.
        if len(allowed) > self.k:
            cut = heapq.nlargest(self.k, allowed.values())[-1]
            allowed = {w: s for w, s in allowed.items() if s >= cut}
        best = sorted((rank(w, s), w) for w, s in allowed.items())[: self.k]
        # Tokens no context has seen score f * p1: the unigram order, merged in where they beat.
        rest = uni.top(self.k, lambda w: w in scores or e.excluded(w))
        merged = best + [(rank(w, f * p1(w)), w) for w in rest]
        return [w for _, w in heapq.nsmallest(self.k, merged)]
