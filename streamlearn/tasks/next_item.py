"""``next-item``: a key's recent items -> its next item, over a hashed output space.

Records carry a ``key`` (e.g. a user) and an ``item``. The preparer keeps each key's
last ``learner.history`` items in stream order: a record's input is its key's items
before it (a key's first event has none and teaches nothing, but its item joins the
history), so two events of one key in one batch chain correctly, and its last
``learner.recency`` items again as tokens of their own, tagged with their place from
the end (:meth:`NextItemPreparer.model_input`): a pooled bag cannot tell which item came
last, and where the next item follows the last one (sessions, routes, a first-order
world) that is most of the answer. The head reads the pooled states of that input. A query asks by ``key`` (its stored history) or with
``tokens`` (a history of its own).

In a replay, the items a key already had are excluded from every contestant's top-k
list (a recommender does not recommend what the user already rated).
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from ..batching import Batch, fields_of
from ..config import Config
from ..exceptions import RecordError
from ..featurize import Featurizer
from ..hashing import canonical_id
from ..model import HashedTransformer
from ..objectives import BOS_TOKEN, Histories
from ..outputs import OutputCode
from ..records import Record
from .base import Event, TokenPreparer, TokenTask

__all__ = ["NextItem", "NextItemPreparer", "RECENT"]

RECENT = "\x01"  # starts a recency token (NextItemPreparer.model_input); a control character, not an id


class NextItemPreparer(TokenPreparer):
    """Records need a key and an item; the per-key histories advance in record order."""

    task = "next-item"

    def __init__(self, cfg: Config, featurizer: Featurizer, code: OutputCode):
        super().__init__(cfg, featurizer, code)
        self.histories = Histories(cfg.learner.history)

    def validate(self, rec: Record) -> None:
        if rec.key is None or rec.item is None:
            raise RecordError("missing-field: key and item (task next-item)")
        return None

    def fill_train(self, batch: Batch, accepted: list, rng: np.random.Generator) -> None:
        inputs, targets, weights = [], [], []
        for rec, _ in accepted:  # stream order: each record sees the items before it
            item = canonical_id(rec.item)
            history = self.histories.get(rec.key)
            if history:
                inputs.append(self.model_input(history))
                targets.append(item)
                weights.append(rec.weight)
            self.histories.push(rec.key, item)
        batch.candidates = [canonical_id(r.item) for r, _ in accepted]
        if not inputs:
            return
        batch.feats = self.featurize(inputs)
        batch.targets = self.code.targets(targets)
        batch.weight = np.array(weights, dtype=np.float32)

    def fill_query(self, batch: Batch, records: list) -> None:
        inputs = [self.model_input(self._query_history(obj, i)) for i, obj in enumerate(records)]
        batch.feats = self.featurize(inputs, grow=False)

    def model_input(self, history: Sequence[str]) -> list[str]:
        """The model's input for a key's items (oldest first): the items, then the last
        ``learner.recency`` of them again, most recent first, each tagged with its place
        from the end (:data:`RECENT` + "1:" + the last item).

        >>> from streamlearn.config import Config
        >>> from streamlearn.tasks import build_task
        >>> from streamlearn.featurize import build_featurizer
        >>> cfg = Config().override("learner.task=next-item", "embedding.K=1000", "embedding.B=100")
        >>> task = build_task(cfg, build_featurizer(cfg.embedding, cfg.hashing.seed))
        >>> [t.replace(RECENT, "@") for t in task.prep.model_input(("a", "b", "c"))]
        ['a', 'b', 'c', '@1:c']
        """
        out = list(history)
        for r in range(1, min(self.cfg.learner.recency, len(history)) + 1):
            out.append(f"{RECENT}{r}:{history[-r]}")
        return out

    def _query_history(self, obj: Any, i: int) -> list[str]:
        fields = fields_of(obj)
        if fields.get("tokens") is not None:
            return self.query_tokens(obj, i)[-self.cfg.learner.history:]
        key = fields.get("key")
        if isinstance(key, bool) or not isinstance(key, (str, int)):
            raise RecordError(f"missing-field: query {i} needs key (str or int) or tokens (task next-item)")
        return list(self.histories.get(canonical_id(key)))


class NextItem(TokenTask):
    """The next-item task (see the module docstring)."""

    name = "next-item"
    target_field = "item"
    Preparer = NextItemPreparer

    def readout(self, model: HashedTransformer, batch: Batch, feats: dict[str, torch.Tensor], dev) -> torch.Tensor:
        return model.pool(model.encode(feats), feats["mask"])  # (N, d)

    def events(self, seed: int):
        """The key's items before the event (its history, the model's input; the previous
        item, Markov's; the two before, the n-gram's); the answer is the event's item, and every item the key already
        had is excluded. A key's first event is learned but not evaluated. A key met for
        the first time starts from the history the learner holds for it (a snapshot's)."""
        stored, length = self.prep.histories, self.cfg.learner.history
        keys: dict[str, _Key] = {}

        def build(position: int, rec: Record) -> list[Event]:
            if rec.key is None or rec.item is None:
                raise RecordError("missing-field: key and item (task next-item)")
            item = canonical_id(rec.item)
            ctx = keys.get(rec.key)
            if ctx is None:
                ctx = keys[rec.key] = _Key(tuple(stored.get(rec.key)))
            history = ctx.recent
            left = ((BOS_TOKEN, BOS_TOKEN) + history)[-2:]
            event = Event(position, rec, item, bool(history), {"tokens": list(history)},
                          prev=history[-1] if history else None, left=left, counts=(item,),
                          transitions=((history[-1], item),) if history else (), ngrams=(left + (item,),),
                          key=rec.key, _seen=ctx.seen, _before=ctx.count, _order=ctx.order,
                          _n_seen=len(ctx.order))
            ctx.recent = (history + (item,))[-length:]
            ctx.add(item)
            return [event]
        return build


class _Key:
    """A next-item key's context in a replay: recent items (the model's input) and every
    item it had."""

    __slots__ = ("recent", "seen", "order", "count")

    def __init__(self, recent: tuple[str, ...]):
        self.recent = recent
        self.seen: dict[str, int] = {}
        self.order: list[str] = []  # seen's keys as a list: events slice their prefix
        self.count = 0
        for item in recent:
            self.add(item)

    def add(self, item: str) -> None:
        if item not in self.seen:
            self.seen[item] = self.count
            self.order.append(item)
        self.count += 1
