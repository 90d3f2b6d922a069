"""``next-item``: a key's recent items -> its next item, over a hashed output space.

Records carry a ``key`` (e.g. a user) and an ``item``. The preparer keeps each key's
last ``learner.history`` items in stream order: a record's input is its key's items
before it (a key's first event has none and teaches nothing, but its item joins the
history), so two events of one key in one batch chain correctly, and its last
``learner.recency`` items again as tokens of their own, tagged with their place from
the end (:meth:`NextItemPreparer.model_input`): a pooled bag cannot tell which item came
last, and where the next item follows the last one (sessions, routes, a first-order
world) that is most of the answer. With ``learner.key_token`` the key enters too, as a
token of its own: its vector learns the key's taste, which its recent items only hint
at. With ``learner.place_weights`` a weight learned per place (the history's items from
the most recent back, each recency token, the key) scales each token before the bag is
pooled: a long history whose recent items count more. The head reads the pooled states
of that input. A query asks by ``key`` (its stored history) or with
``tokens`` (a history of its own; with a ``key`` as well, the key's token joins it).

With ``model.counts=transitions`` (the task's default) the head joins two experts
(:class:`TransitionHead`): the network's hashed logits plus what followed the key's last
item and last two items, counted (:mod:`streamlearn.counts.transitions`), as a
log-probability weighed per example by how much evidence each context has. A state stored
before 2026-11-26 keeps the mixture of the two distributions it was trained with
(``model.count_join=mixture``, :class:`MixtureHead`).

In a replay, the items a key already had are excluded from every contestant's top-k
list (a recommender does not recommend what the user already rated).
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ..batching import Batch, fields_of
from ..config import Config
from ..counts.transitions import ORDERS, Transitions, context_keys
from ..decoding import Fresh, TopK, exhaustive_topk_many
from ..device import Device
from ..exceptions import RecordError
from ..featurize import Featurizer
from ..hashing import canonical_id
from ..heads import HashedHead, Prior, add_prior
from ..model import HashedTransformer
from ..objectives import BOS_TOKEN, Histories
from ..outputs import HashedCode, OutputCode
from ..records import Record, plain_int
from .base import Event, TokenPreparer, TokenTask

__all__ = ["MixtureHead", "NextItem", "NextItemPreparer", "RECENT", "TransitionHead"]

RECENT = "\x01"  # starts a recency token (NextItemPreparer.model_input); a control character, not an id
KEY = "\x02"  # starts the key's own token (learner.key_token)
RESERVED = frozenset("\x00" + RECENT + KEY)  # not in a key or an item: the context keys join items with \x00
# A training batch of at most this many records is predicted in order (NextItem.logits,
# NextItem.fresh): its in-order counts hold an entry per pair of a record and one before it
# (a batch of 6,000 took 3.6 GB); a larger one reads the tables and the index as they are.
IN_ORDER_RECORDS = 1024
# learner.place_weights: one learned weight per place of the input, exp(0) = 1 at the start.
# Places 0 .. HISTORY_PLACES - 1 are the history's items from the most recent back (older
# ones share the last), then one per recency token (those past the table share its last),
# and the last place is the key's token.
PLACES = 64
HISTORY_PLACES = 40
KEY_PLACE = PLACES - 1


class NextItemPreparer(TokenPreparer):
    """Records need a key and an item; the per-key histories advance in record order."""

    task = "next-item"

    def __init__(self, cfg: Config, featurizer: Featurizer, code: OutputCode):
        super().__init__(cfg, featurizer, code)
        self.histories = Histories(cfg.learner.history)

    def validate(self, rec: Record) -> None:
        if rec.key is None or rec.item is None:
            raise RecordError("missing-field: key and item (task next-item)")
        for name, value in (("key", rec.key), ("item", rec.item)):
            if isinstance(value, str) and (not value or RESERVED.intersection(value)):
                raise RecordError(f"bad-value: {name} {value!r} is empty or holds a character \\x00-\\x02, which "
                                  "the model reserves to mark its own tokens (task next-item)")
        return None

    def fill_train(self, batch: Batch, accepted: list, rng: np.random.Generator) -> None:
        inputs, targets, weights, histories, places = [], [], [], [], []
        for place, (rec, _) in enumerate(accepted):  # stream order: each record sees the items before it
            item = canonical_id(rec.item)
            history = self.histories.get(rec.key)
            if history:
                places.append(place)
                inputs.append(self.model_input(history, rec.key))
                targets.append(item)
                weights.append(rec.weight)
                histories.append(history)
            self.histories.push(rec.key, item)
        batch.candidates = [canonical_id(r.item) for r, _ in accepted]
        batch.example_records = np.array(places, dtype=np.int64)
        if self.count_seed is not None and batch.candidates:
            # the count part counts every event's item (popularity), and each example's transition
            batch.counts = {"every": self.code.targets(batch.candidates)["hashes"],
                            "ctx": context_keys(histories, self.count_seed)}
        if not inputs:
            return
        batch.feats = self.featurize(inputs)
        self._add_places(batch.feats, [len(h) for h in histories], [True] * len(histories))
        batch.targets = self.code.targets(targets)
        batch.weight = np.array(weights, dtype=np.float32)

    def fill_query(self, batch: Batch, records: list) -> None:
        asked = [self._query_history(obj, i) for i, obj in enumerate(records)]
        histories = [history for history, _ in asked]
        batch.feats = self.featurize([self.model_input(history, key) for history, key in asked], grow=False)
        self._add_places(batch.feats, [len(h) for h in histories], [key is not None for _, key in asked])
        if self.count_seed is not None:
            batch.counts = {"ctx": context_keys(histories, self.count_seed)}

    def query_cut(self, tokens: list[str]) -> list[str]:
        """A history given as tokens is read from its most recent items: its end is kept."""
        return tokens[-self.cfg.hashing.max_tokens:]

    def query_columns(self, batch: Batch, i: int, n: int) -> tuple[int, list[int | None]]:
        """A history's last ``learner.history`` items are the input's first columns
        (:meth:`model_input`); older ones are not read."""
        read = min(n, self.cfg.learner.history)
        return i, [None] * (n - read) + list(range(read))

    def places(self, lengths: Sequence[int], keyed: Sequence[bool], width: int) -> np.ndarray:
        """The place of each token of :meth:`model_input`'s lists (N, ``width``) for
        histories of ``lengths`` items, with the key's token where ``keyed`` (and
        ``learner.key_token``); 0 past a list's end (masked there).

        >>> from streamlearn.config import Config
        >>> from streamlearn.tasks import build_task
        >>> from streamlearn.featurize import build_featurizer
        >>> cfg = Config().override("learner.task=next-item", "embedding.K=1000", "embedding.B=100", "model.out_B=64")
        >>> task = build_task(cfg, build_featurizer(cfg.embedding, cfg.hashing.seed))
        >>> task.prep.places([3, 1], [True, False], 8)  # a, b, c, @1:c, @2:b, @3:a, #key | a, @1:a
        array([[ 2,  1,  0, 40, 41, 42, 63,  0],
               [ 0, 40,  0,  0,  0,  0,  0,  0]])
        """
        n = np.asarray(lengths, dtype=np.int64)[:, None]
        recent = np.minimum(n, self.cfg.learner.recency)
        keyed = np.asarray(keyed, dtype=bool)[:, None] & self.cfg.learner.key_token
        t = np.arange(width, dtype=np.int64)[None, :]
        history = np.minimum(n - 1 - t, HISTORY_PLACES - 1)
        tags = np.minimum(HISTORY_PLACES + t - n, KEY_PLACE - 1)
        key = np.where(keyed & (t == n + recent), KEY_PLACE, 0)
        return np.where(t < n, history, np.where(t < n + recent, tags, key))

    def _add_places(self, feats: dict[str, np.ndarray], lengths: list[int], keyed: list[bool]) -> None:
        if self.cfg.learner.place_weights:
            feats["place"] = self.places(lengths, keyed, feats["mask"].shape[1])

    def model_input(self, history: Sequence[str], key: str | None = None) -> list[str]:
        """The model's input for a key's items (oldest first): the items, then the last
        ``learner.recency`` of them again, most recent first, each tagged with its place
        from the end (:data:`RECENT` + "1:" + the last item), then, with
        ``learner.key_token``, the key itself (:data:`KEY` + the key; a query by tokens
        alone has none).

        >>> from streamlearn.config import Config
        >>> from streamlearn.tasks import build_task
        >>> from streamlearn.featurize import build_featurizer
        >>> cfg = Config().override("learner.task=next-item", "embedding.K=1000", "embedding.B=100", "model.out_B=64")
        >>> task = build_task(cfg, build_featurizer(cfg.embedding, cfg.hashing.seed))
        >>> [t.replace(RECENT, "@").replace(KEY, "#") for t in task.prep.model_input(("a", "b", "c"), "u7")]
        ['a', 'b', 'c', '@1:c', '@2:b', '@3:a', '#u7']
        >>> [t.replace(RECENT, "@") for t in task.prep.model_input(("a",))]
        ['a', '@1:a']
        """
        out = list(history)
        for r in range(1, min(self.cfg.learner.recency, len(history)) + 1):
            out.append(f"{RECENT}{r}:{history[-r]}")
        if key is not None and self.cfg.learner.key_token:
            out.append(KEY + key)
        return out

    def _query_history(self, obj: Any, i: int) -> tuple[list[str], str | None]:
        """A query's history and key: by ``key``, the key's stored history; with
        ``tokens``, those tokens as the history, and the key too if the query names one
        (a snapshot asks so, with the history it stored for the key)."""
        fields = fields_of(obj)
        key = plain_int(fields.get("key"))  # numpy's too, as records take them
        if key is not None and (isinstance(key, bool) or not isinstance(key, (str, int))):
            raise RecordError(f"wrong-type: query {i}: key must be a str or an int, got {type(key).__name__}")
        key = None if key is None else canonical_id(key)
        if fields.get("tokens") is not None:
            return self.query_tokens(obj, i)[-self.cfg.learner.history:], key
        if key is None:
            raise RecordError(f"missing-field: query {i} needs key (str or int) or tokens (task next-item)")
        return list(self.histories.get(key)), key


class NextItem(TokenTask):
    """The next-item task (see the module docstring)."""

    name = "next-item"
    target_field = "item"
    events_are_examples = True  # a record whose key had an item is an example and an evaluated event
    events_read_state = True  # ... by the learner's stored histories
    Preparer = NextItemPreparer

    @staticmethod
    def catalogue_id(rec: Record) -> str | None:
        return None if rec.item is None else canonical_id(rec.item)

    def readout(self, model: HashedTransformer, batch: Batch, feats: dict[str, torch.Tensor], dev) -> torch.Tensor:
        h = model.encode(feats)  # (N, T, d)
        weights = getattr(model.head, "place", None)  # learner.place_weights (make_head)
        if weights is not None:
            h = h * torch.exp(weights)[feats["place"]].unsqueeze(-1).to(h.dtype)
        return model.pool(h, feats["mask"])  # (N, d)

    def new_counter(self) -> Transitions:
        m = self.cfg.model
        return Transitions(self.code.m, self.code.size, m.count_slots, m.successors)

    def make_head(self, d_model: int, embedding: nn.Module) -> nn.Module:
        if self.counter is None:
            head = super().make_head(d_model, embedding)
        else:
            width = embedding.row_tables()[self.code.table].shape[1] if self.code.table else d_model
            join = TransitionHead if self.cfg.model.count_join == "product" else MixtureHead
            head = join(d_model, self.code, width)
        if self.cfg.learner.place_weights:
            # log-weights of the input's places (readout): 0, a plain bag at the start
            head.place = nn.Parameter(torch.zeros(PLACES))
        return head

    def experts(self, batch: Batch, dev: Device, in_order: bool = False) -> tuple[torch.Tensor, ...] | None:
        """The count part's experts for the batch's examples (TransitionHead.forward);
        ``in_order``: a training batch predicted before its step, each example's counts
        seeing the batch's events before it."""
        if self.counter is None:
            return None
        counts = batch.counts
        order = (batch.targets["hashes"], counts["every"], batch.example_records) if in_order else None
        return tuple(dev.tensor(a) for a in self.counter.components(counts["ctx"], order))

    def logits(self, model: HashedTransformer, batch: Batch, dev: Device) -> torch.Tensor:
        """A training batch predicted before its step (a prequential replay's) gives each
        example the counts of the batch's events before it too, as a baseline learning
        record by record has them (:meth:`in_order`); a query batch reads the tables."""
        if self.counter is None:
            return super().logits(model, batch, dev)
        states = self.readout(model, batch, dev.tensors(batch.feats), dev)
        return model.head(states, self._tied(model), self.experts(batch, dev, in_order=self.in_order(batch)))

    @staticmethod
    def in_order(batch: Batch) -> bool:
        """Whether ``batch``'s predictions read it in order: a training batch of at most
        :data:`IN_ORDER_RECORDS` records."""
        return batch.train and len(batch.candidates) <= IN_ORDER_RECORDS

    def fresh(self, batch: Batch) -> Fresh | None:
        """A training batch's items the candidate index does not hold yet, in stream order,
        each a candidate for the examples after the record that first showed it: predicted
        before its step, a batch can name an item it brought, as a baseline learning record
        by record can (None: none, or a query batch)."""
        if not self.in_order(batch) or batch.example_records is None or not isinstance(self.code, HashedCode):
            return None
        first: dict[str, int] = {}  # each item's first record in the batch, in order
        for place, item in enumerate(batch.candidates):
            first.setdefault(item, place)
        new = [t for t, i in zip(first, self.index.ids(list(first)).tolist()) if i < 0]
        if not new:
            return None
        since = np.searchsorted(batch.example_records, [first[t] for t in new], side="right")
        return Fresh(new, self.code.ids(new), since)

    def topk(self, model, batch, dev, k, beam, exclude=None) -> list[TopK]:
        """:meth:`TokenTask.topk`; a training batch's lists also hold its :meth:`fresh`
        items (ids after the index's in ``exclude``), scored exhaustively."""
        if batch.train and not batch.examples:  # only keys' first records: nothing to answer
            return []
        fresh = self.fresh(batch)
        if fresh is None:
            return super().topk(model, batch, dev, k, beam, exclude)
        return exhaustive_topk_many(self.decodable(model, batch, dev), self.index, k, exclude, fresh)

    def loss(self, model, batch, dev):
        """With the count part, the loss reads the mixture at the answers' buckets only
        (:meth:`TransitionHead.fit_loss`): the dense mixture over every bucket and its
        backward were most of a step. It reads the tables as they are, not in order
        (in order it cost MovieLens 0.1684 -> 0.1677 of recall@10, seed 0)."""
        if self.counter is None:
            return super().loss(model, batch, dev)
        states = self.readout(model, batch, dev.tensors(batch.feats), dev)
        return model.head.fit_loss(states, dev.tensors(batch.targets), dev.tensor(batch.weight), self._tied(model),
                                   self.experts(batch, dev))

    def _step_targets(self, batch: Batch, rng: np.random.Generator) -> dict[str, np.ndarray]:
        """The code's own targets, with or without the count part: the transition part
        draws no negatives (the token tasks' count part does, for their sampled head)."""
        return self.code.step_targets(batch.targets, self.index, rng)

    def learned(self, batch: Batch) -> dict[str, np.ndarray]:
        """The candidate index learns the batch's items; the count part counts its
        transitions after the step (a step's experts never include its own batch)."""
        if batch.candidates:
            self.index.add(batch.candidates)
        if self.counter is None or batch.counts is None:
            return {}
        examples = batch.counts["ctx"]
        codes = batch.targets["hashes"] if len(examples) else np.empty((0, self.code.m), dtype=np.int64)
        return self.counter.learn(examples, codes, batch.counts["every"])

    def events(self, seed: int, bags: bool = True):
        """The key's items before the event (its history, the model's input; the previous
        item, Markov's; the two before, the n-gram's); the answer is the event's item, and every item the key already
        had is excluded. A key's first event is learned but not evaluated. A key met for
        the first time starts from the history the learner holds for it (a snapshot's)."""
        stored, length = self.prep.histories, self.cfg.learner.history
        keys: dict[str, _Key] = {}

        def build(position: int, rec: Record) -> list[Event]:
            self.prep.validate(rec)  # what the learner would refuse is a bad record here
            item = canonical_id(rec.item)
            ctx = keys.get(rec.key)
            if ctx is None:
                ctx = keys[rec.key] = _Key(tuple(stored.get(rec.key)))
            history = ctx.recent
            left = ((BOS_TOKEN, BOS_TOKEN) + history)[-2:]
            event = Event(position, rec, item, bool(history), {"key": rec.key, "tokens": list(history)},
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


# The counts' starting weight in the logits is softplus(0) = 0.69. On seed 0 (16 successors
# per context) a start of softplus(-1) = 0.31 gave the taste world (3,000 items) 1.357x popularity against 1.325x, the
# 10,000-item one 1.191x against 1.232x, MovieLens in user order the same (1.197x / 1.196x
# Markov); softplus(1) = 1.31 lost on both it was run on (bench/shapes.py).
TRUST_START = 0.0


class TransitionHead(HashedHead):
    """The hashed head and the transition counts as a product of experts, per output slot j:

        log P_j(b) = log_softmax_b(logits_j(b) + lam log Q_j(b | c)),   lam = softplus(w . e + c)

    Q the Witten-Bell backoff of :mod:`streamlearn.counts.transitions`, lam the counts'
    weight, read per example from the contexts' evidence e (log events, log distinct
    successors per order); w starts at zero and c at :data:`TRUST_START`, and both learn by
    gradient with the rest. A product, not a mixture: the network's logits carry the key's
    taste, the counts what follows the last items, and an item both favour must outrank
    one only either does (a sum of the two distributions ranks by the larger one).
    ``forward`` returns log P (n, m, size), normalised: the hashed loss and decoding read
    it as they read logits."""

    def __init__(self, d_model: int, code: HashedCode, width: int):
        super().__init__(d_model, code, width)
        self.trust = nn.Linear(2 * ORDERS, 1)
        nn.init.zeros_(self.trust.weight)
        nn.init.constant_(self.trust.bias, TRUST_START)

    def prior(self, experts: tuple[torch.Tensor, ...]) -> tuple[Prior, torch.Tensor]:
        """The counts' log Q as a :class:`~streamlearn.heads.Prior`, and their weight lam
        (n, 1, 1). Q = base pop + s: popularity times the mass every order backed off, plus
        s, each held successor's mass (sparse). So log Q = log base (the same for every
        bucket of an example: a softmax ignores it) + log pop (shared) + log(1 + s / (base
        pop)) where s > 0: no (n, m, size) logarithm. Q takes no gradient, lam does."""
        pop, base, at, value, evidence = experts
        where, inverse = torch.unique(at, return_inverse=True)  # two successors can share a bucket
        held = torch.zeros(len(where), device=value.device).index_add_(0, inverse, value)
        floor = base[where // pop.numel()] * pop.reshape(-1)[where % pop.numel()]
        lam = F.softplus(self.trust(evidence.float()).float())[:, :, None]  # float32 under autocast too
        return Prior(pop.log(), where, torch.log1p(held / floor)), lam

    def forward(self, x: torch.Tensor, tied: torch.Tensor | None = None,
                experts: tuple[torch.Tensor, ...] | None = None) -> torch.Tensor:
        """x (n, d_model), ``experts`` (:meth:`Transitions.components
        <streamlearn.counts.transitions.Transitions.components>` as tensors) -> log P
        (n, m, size)."""
        prior, lam = self.prior(experts)
        logits = super().forward(x, tied).float()
        if torch.is_grad_enabled():
            scores = (logits + prior.shared * lam).view(-1).index_add(0, prior.where, prior.weigh(lam) * prior.lift)
            return F.log_softmax(scores.view_as(logits), -1)
        return F.log_softmax(add_prior(logits, prior, lam), -1)  # answering: no graph, the logits' own buffer

    @staticmethod
    def decodable(scores: torch.Tensor) -> torch.Tensor:
        """:meth:`forward` is normalised log P already."""
        return scores.float()

    def fit_loss(self, x: torch.Tensor, targets: dict[str, torch.Tensor], weight: torch.Tensor,
                 tied: torch.Tensor | None = None, experts: tuple[torch.Tensor, ...] | None = None) -> torch.Tensor:
        """The hashed loss of :meth:`forward`'s log P, sum_j -log P_j(answer's bucket j)
        weighted over the n examples, read at the answers (:meth:`answer_logp` with the
        counts as its prior)."""
        logp = self.answer_logp(x, targets["hashes"], tied, *self.prior(experts))  # (n, m)
        return (-logp.sum(1) * weight).sum() / logp.shape[0]


# The mixture's starting share for the network, sigmoid(1.5) = 0.82 (MixtureHead).
GATE_START = 1.5


class MixtureHead(HashedHead):
    """``model.count_join=mixture``, the transition head before 2026-11-26, which a state
    stored then keeps (its config has no ``count_join``): the hashed head mixed with the
    transition counts, per output slot j:

        P_j(b) = sigmoid(g) softmax(logits_j)(b) + sigmoid(-g) Q_j(b | c)

    Q the Witten-Bell backoff of :mod:`streamlearn.counts.transitions`, g = w . e + c a
    gate on the contexts' evidence e (log events, log distinct successors per order). w
    starts at zero and c at :data:`GATE_START`; the gate learns by gradient, with the
    rest, when to trust the counts: a context seen once less than a frequent one that
    always leads to the same item. ``forward`` returns log P (n, m, size), normalised: the hashed loss
    and decoding read it as they read logits."""

    def __init__(self, d_model: int, code: HashedCode, width: int):
        super().__init__(d_model, code, width)
        self.gate = nn.Linear(2 * ORDERS, 1)
        nn.init.zeros_(self.gate.weight)
        nn.init.constant_(self.gate.bias, GATE_START)

    def forward(self, x: torch.Tensor, tied: torch.Tensor | None = None,
                experts: tuple[torch.Tensor, ...] | None = None) -> torch.Tensor:
        """x (n, d_model), ``experts`` (:meth:`Transitions.components
        <streamlearn.counts.transitions.Transitions.components>` as tensors) -> log P
        (n, m, size). Q is sparse plus a shared term: the mixture is summed in probability
        space (a dense log-sum-exp over the experts cost 4x the step)."""
        logits = super().forward(x, tied).float()
        pop, base, at, value, evidence = experts
        g = self.gate(evidence.float())[:, :, None]  # (n, 1, 1): logit of the network's share
        counted = torch.sigmoid(-g)  # (n, 1, 1)
        share = counted.reshape(-1)[at // pop.numel()]  # (E,) the counts' share of each entry's example
        if torch.is_grad_enabled():
            mix = torch.sigmoid(g) * F.softmax(logits, -1) + (counted * base[:, None, None]) * pop  # (n, m, size)
            return torch.log(mix.reshape(-1).index_add(0, at, share * value).view_as(mix))
        # answering: the same sums in the logits' own buffer (no graph to keep), about a
        # third fewer passes over the (n, m, size) scores
        e = logits.sub_(logits.amax(2, keepdim=True)).exp_()
        e.mul_(torch.sigmoid(g) / e.sum(2, keepdim=True))  # the network's share of its softmax
        e.view(len(e), -1).addr_(counted.reshape(-1) * base, pop.reshape(-1))  # + popularity's share
        return e.view(-1).index_add_(0, at, share * value).view_as(e).log_()

    @staticmethod
    def decodable(scores: torch.Tensor) -> torch.Tensor:
        """:meth:`forward` is normalised log P already."""
        return scores.float()

    def fit_loss(self, x: torch.Tensor, targets: dict[str, torch.Tensor], weight: torch.Tensor,
                 tied: torch.Tensor | None = None, experts: tuple[torch.Tensor, ...] | None = None) -> torch.Tensor:
        """The hashed loss of :meth:`forward`'s log P, sum_j -log P_j(answer's bucket j)
        weighted over the n examples, computed at the answers' buckets alone: the network's
        log-softmax there, Q there (popularity's term and the entries that fall on them)."""
        pop, base, at, value, evidence = experts
        hashes = targets["hashes"]  # (n, m)
        n, m, size = *hashes.shape, self.bias.shape[1]
        net = self.answer_logp(x, hashes, tied)  # the network's log-softmax at the answers
        cell = at // size  # (E,) the (example, slot) of each entry
        answer = torch.arange(n * m, device=at.device) * size + hashes.reshape(-1)  # (n m,) flat answer buckets
        hit = at == answer[cell]
        counted = torch.zeros(n * m, device=value.device).index_add(0, cell[hit], value[hit]).view(n, m)
        q = base[:, None] * pop.gather(1, hashes.t()).t() + counted  # (n, m) Q at the answers, > 0
        g = self.gate(evidence.float()).float()  # (n, 1); float32 under a GPU's bf16 autocast too
        logp = torch.logaddexp(F.logsigmoid(g) + net, F.logsigmoid(-g) + torch.log(q))  # (n, m)
        return (-logp.sum(1) * weight).sum() / n

