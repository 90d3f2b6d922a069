"""Fair online peers: each predicts then learns RECORD BY RECORD in stream order, as
river's ``progressive_val_score`` does, whatever the batch size of the model they are
compared with (issue 17, item 1). Plain helpers: no timing, no torch.

Text peers (accuracy over the whole stream; a record whose label no peer has seen yet is
a miss, as it is for the model):

- :func:`river_nb`: river ``MultinomialNB`` on token counts;
- :func:`river_logreg`: river ``LogisticRegression`` (one-vs-rest for more than two
  labels) on token counts, its defaults;
- :func:`vw_oaa`: Vowpal Wabbit ``--oaa K --ngram 2`` as a user would run it.

Each takes ``token_lists`` (the model's own tokens: the same records, the same tokens) or,
with ``native=True``, the raw text through the peer's own tokenizer (river's
``BagOfWords(lowercase=True)``, VW on lowercased whitespace words); callers report the
better of the two so a peer is never handicapped by our tokenizer.

Next-item peers (:class:`NextItemPeers`): first-order Markov and popularity over sparse
counts (no n_items x n_items matrix, so 50,000 items fit), with the key's already-seen
items excluded and only items seen so far ranked, as for the model.
"""
from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Sequence



# ---------------------------------------------------------------------------- text

def river_nb(labels: Sequence, token_lists: Sequence[Sequence[str]] | None = None,
             texts: Sequence[str] | None = None) -> float:
    """river MultinomialNB, predict_one then learn_one per record."""
    from river import naive_bayes
    return _river(naive_bayes.MultinomialNB(), labels, token_lists, texts)


def river_logreg(labels: Sequence, token_lists: Sequence[Sequence[str]] | None = None,
                 texts: Sequence[str] | None = None) -> float:
    """river LogisticRegression (its defaults; one-vs-rest beyond two labels)."""
    from river import linear_model, multiclass
    if len(set(labels)) > 2:
        model = multiclass.OneVsRestClassifier(linear_model.LogisticRegression())
    else:
        model = _Binary(linear_model.LogisticRegression(), labels)
    return _river(model, labels, token_lists, texts)


class _Binary:
    """A binary river classifier over two arbitrary labels (it wants bools)."""

    def __init__(self, model, labels: Sequence):
        self.model = model
        self.first = labels[0]
        self.other = None

    def predict_one(self, x):
        if self.other is None:
            return self.first
        return self.first if self.model.predict_one(x) else self.other

    def learn_one(self, x, y):
        if y != self.first and self.other is None:
            self.other = y
        self.model.learn_one(x, y == self.first)


def _river(model, labels, token_lists, texts) -> float:
    from river import feature_extraction
    bow = feature_extraction.BagOfWords(lowercase=True) if token_lists is None else None
    hits = 0
    for i, y in enumerate(labels):
        x = bow.transform_one(texts[i]) if bow is not None else dict(Counter(token_lists[i]))
        hits += model.predict_one(x) == y
        model.learn_one(x, y)
    return hits / len(labels)


def vw_oaa(labels: Sequence, token_lists: Sequence[Sequence[str]] | None = None,
           texts: Sequence[str] | None = None) -> float | None:
    """Vowpal Wabbit ``--oaa K --ngram 2``, predict then learn per record; None when
    vowpalwabbit is not installed. Labels are numbered in order of first appearance."""
    try:
        import vowpalwabbit
    except ImportError:
        return None
    ids: dict = {}
    for y in labels:
        ids.setdefault(y, len(ids) + 1)
    vw = vowpalwabbit.Workspace(f"--oaa {max(len(ids), 2)} --ngram 2 --quiet")
    hits = 0
    for i, y in enumerate(labels):
        words = token_lists[i] if token_lists is not None else texts[i].lower().split()
        line = " ".join(w.replace(":", ";").replace("|", "/") for w in words)
        hits += vw.predict(f"| {line}") == ids[y]
        vw.learn(f"{ids[y]} | {line}")
    vw.finish()
    return hits / len(labels)


# ---------------------------------------------------------------------------- next-item

class NextItemPeers:
    """Online first-order Markov and popularity over item ids (any hashable).

    Popularity ranks the items seen so far by count (ties in a deterministic order). Markov
    ranks the successors counted after the key's previous item by count (ties by
    popularity), then fills the list with popularity. Both skip what ``exclude`` holds.
    ``top`` then ``learn`` per record is the prequential protocol.
    """

    def __init__(self):
        self.trans: dict = defaultdict(Counter)
        self.count: dict = {}
        # Items in descending count; items of equal count form a block and an increment
        # swaps the item to the front of its block (O(1) per event).
        self.order: list = []
        self.pos: dict = {}
        self.block_start: dict[int, int] = {}

    def popularity(self, exclude: set, k: int) -> list:
        out = []
        for item in self.order:
            if item not in exclude:
                out.append(item)
                if len(out) == k:
                    break
        return out

    def markov(self, prev, exclude: set, k: int) -> list:
        succ = self.trans.get(prev)
        out = []
        if succ:
            ranked = sorted(succ.items(), key=lambda kv: (-kv[1], self.pos[kv[0]]))
            out = [item for item, _ in ranked if item not in exclude][:k]
        if len(out) < k:
            taken = set(out)
            for item in self.order:
                if item not in exclude and item not in taken:
                    out.append(item)
                    if len(out) == k:
                        break
        return out

    def learn(self, prev, item) -> None:
        if prev is not None:
            self.trans[prev][item] += 1
        self._bump(item)

    def _bump(self, item) -> None:
        c = self.count.get(item, 0)
        if c == 0:
            self.order.append(item)
            self.pos[item] = len(self.order) - 1
            self.block_start.setdefault(0, len(self.order) - 1)
        i = self.pos[item]
        start = self.block_start[c]
        other = self.order[start]
        self.order[start], self.order[i] = item, other
        self.pos[item], self.pos[other] = start, i
        # the block of count c now starts one later (or is empty); item opens or joins c + 1
        if start + 1 < len(self.order) and self.count.get(self.order[start + 1], 0) == c and self.order[start + 1] != item:
            self.block_start[c] = start + 1
        else:
            del self.block_start[c]
        self.block_start.setdefault(c + 1, start)
        self.count[item] = c + 1


def recall_of_peers(events: Sequence[tuple], k: int = 10) -> dict:
    """recall@k of Markov and popularity over (key, item) events, prequential per record.
    An event counts when its key has an earlier event; the key's earlier items and items
    not yet seen are excluded."""
    peers = NextItemPeers()
    last: dict = {}
    seen: dict = defaultdict(set)
    hits = {"markov": 0, "popularity": 0}
    evaluated = 0
    for key, item in events:
        if key in last:
            ex = seen[key]
            hits["markov"] += item in peers.markov(last[key], ex, k)
            hits["popularity"] += item in peers.popularity(ex, k)
            evaluated += 1
        peers.learn(last.get(key), item)
        last[key] = item
        seen[key].add(item)
    return {name: h / max(evaluated, 1) for name, h in hits.items()} | {"evaluated": evaluated}
