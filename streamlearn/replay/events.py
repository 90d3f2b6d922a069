"""Records -> evaluation events: what is asked, what the right answer is, per task.

An :class:`Event` is built when its record arrives, in stream order, and freezes the
context every contestant (the model and each baseline) is asked with, so all of them
answer the same question:

- ``classify``: the record's tokens (the model's tokenizer, so bag-of-words baselines see
  the same words); the answer is its label.
- ``next-item``: the key's items before this event (its history, the model's input; the
  previous item, the Markov baseline's input); the answer is the event's item. Items the
  key already had are excluded from every contestant's top-k list (a recommender does not
  recommend what the user already rated). A key's first event has no history: it is
  learned but not evaluated.
- ``mlm``: one token per record, chosen by a seeded hash of the record's position, is
  replaced by ``[MASK]``; the answer is that token, the Markov input the token before it.

The context advances at arrival, before any learning: with a label delay, the labels
(and so the learning) come late, but the events themselves are known as they arrive.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import xxhash

from ..batching import QUERY_MASK
from ..config import Config
from ..exceptions import RecordError
from ..hashing import canonical_id, derive_seed, tokenize
from ..objectives import Histories
from ..records import Record

__all__ = ["Event", "EventBuilder"]


@dataclass(eq=False)
class Event:
    """One record under evaluation (see the module docstring).

    ``target``: the label, item or masked token; ``evaluate``: False for a next-item key's
    first event; ``query``: what the model is asked (a Record for classify, a dict of
    tokens for top-k); ``prev``: the Markov context; ``counts``/``transitions``: what a
    counting baseline learns from the event.
    """

    position: int
    record: Record
    target: Any
    evaluate: bool
    query: Any
    tokens: tuple[str, ...] = ()
    prev: str | None = None
    counts: tuple[str, ...] = ()
    transitions: tuple[tuple[str, str], ...] = ()
    _seen: dict[str, int] | None = None  # next-item: the key's items -> their ordinal for the key
    _before: int = 0  # the key's events before this one
    _order: list[str] | None = None  # next-item: the key's distinct items, first seen first
    _n_seen: int = 0  # how many of them the key had when this event arrived
    preds: dict[str, Any] = field(default_factory=dict)

    def excluded(self, item: str) -> bool:
        """True if the key already had ``item`` when this event arrived."""
        return self._seen is not None and self._seen.get(item, self._before) < self._before

    @property
    def n_excluded(self) -> int:
        return self._n_seen

    def excluded_items(self, start: int = 0) -> list[str]:
        """The items :meth:`excluded` is True for, first seen first, from the ``start``-th
        on (a caller that resolved the first ``start`` already asks only for the rest)."""
        return self._order[start:self._n_seen] if self._order is not None else []


class _Key:
    """A next-item key's context: recent items (the model's input) and every item it had."""

    __slots__ = ("recent", "seen", "order", "count")

    def __init__(self, recent: tuple[str, ...]):
        self.recent = recent
        self.seen: dict[str, int] = {}
        self.order: list[str] = []  # seen's keys as a list: events slice their prefix
        self.count = 0
        for item in recent:
            self._add(item)

    def _add(self, item: str) -> None:
        if item not in self.seen:
            self.seen[item] = self.count
            self.order.append(item)
        self.count += 1


class EventBuilder:
    """Builds events for one task; raises :class:`RecordError` for a record the task
    cannot use (counted by the runner as a bad record with that reason).

    ``histories``: the starting snapshot's next-item histories (a key's context then starts
    from its stored items); ``seed``: picks the masked position (mlm).
    """

    def __init__(self, cfg: Config, histories: Histories | None = None, seed: int = 0):
        self.cfg, self.task = cfg, cfg.learner.task
        self._history = cfg.learner.history
        self._stored = histories
        self._keys: dict[str, _Key] = {}
        self._mask_seed = derive_seed(seed, "replay/mlm-mask")

    def build(self, position: int, rec: Record) -> Event:
        if self.task == "next-item":
            return self._next_item(position, rec)
        tokens = self._tokens(rec)
        if self.task == "classify":
            if rec.label is None:
                raise RecordError("missing-field: label (task classify)")
            return Event(position, rec, rec.label, True, rec, tokens=tuple(tokens))
        return self._mlm(position, rec, tokens)

    def _tokens(self, rec: Record) -> list[str]:
        # The learner's own tokenization (batching.Preparer), so baselines and the model
        # see the same words and the same records fail.
        h = self.cfg.hashing
        if rec.tokens is not None:
            tokens = [canonical_id(t) for t in rec.tokens]
        elif rec.text is not None:
            tokens = tokenize(rec.text, h.ngrams, h.lowercase) if h.tokenizer == "words" else rec.text.split()
        else:
            raise RecordError(f"missing-field: text or tokens (task {self.task})")
        if not tokens:
            raise RecordError("bad-value: the text has no tokens after tokenization")
        return tokens

    def _next_item(self, position: int, rec: Record) -> Event:
        if rec.key is None or rec.item is None:
            raise RecordError("missing-field: key and item (task next-item)")
        item = canonical_id(rec.item)
        ctx = self._keys.get(rec.key)
        if ctx is None:
            stored = self._stored.get(rec.key) if self._stored is not None else ()
            ctx = self._keys[rec.key] = _Key(tuple(stored))
        history = ctx.recent
        event = Event(position, rec, item, bool(history), {"tokens": list(history)},
                      prev=history[-1] if history else None, counts=(item,),
                      transitions=((history[-1], item),) if history else (),
                      _seen=ctx.seen, _before=ctx.count, _order=ctx.order, _n_seen=len(ctx.order))
        ctx.recent = (history + (item,))[-self._history:]
        ctx._add(item)
        return event

    def _mlm(self, position: int, rec: Record, tokens: list[str]) -> Event:
        tokens = tokens[: self.cfg.hashing.max_tokens]
        pos = xxhash.xxh64_intdigest(position.to_bytes(8, "big"), self._mask_seed) % len(tokens)
        query = tokens[:pos] + [QUERY_MASK] + tokens[pos + 1:]
        return Event(position, rec, tokens[pos], True, {"tokens": query}, tokens=tuple(tokens),
                     prev=tokens[pos - 1] if pos else None, counts=tuple(tokens),
                     transitions=tuple(zip(tokens, tokens[1:])))
