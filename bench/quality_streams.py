"""Streams and reference models for bench/quality.py (plain helpers, no timing here).

- :func:`sms`, :func:`ag_news`: the two text-classification streams as records, in file
  order (AG News: ``train_random5000_text_label.csv`` then ``train_first581.csv``, labels
  mapped to the class names of ``classes.txt`` so both files agree);
- :func:`movielens`: u.data as next-item events in timestamp order (stable sort, as
  ``streamlearn.datasets`` reads it);
- :func:`cluster_sets`, :func:`partner_sets`: the synthetic set-completion streams (latent
  clusters of ids; sets of partnered ids) with their ground truth (bench/depth.py);
- :func:`river_nb`, :func:`vw_oaa`: the text peers, prequential one record at a time;
- :class:`NextItemBaselines`: first-order Markov and global popularity, online.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from streamlearn.datasets import DatasetReader

AG_CLASSES = ("World", "Sports", "Business", "Sci/Tech")  # classes.txt, labels 1..4


def sms(data: Path) -> list[dict]:
    return [row.record for row in DatasetReader(data / "sms-spam-collection" / "SMSSpamCollection")]


def ag_news(data: Path) -> list[dict]:
    """5,581 articles: the 5,000-row random sample (labels 0.0..3.0), then the first 581
    rows of the original file (labels 1..4)."""
    folder = data / "ag-news-train-samples"
    out = []
    for row in DatasetReader(folder / "train_random5000_text_label.csv"):
        out.append({"text": row.record["text"], "label": AG_CLASSES[int(float(row.record["label"]))]})
    for row in DatasetReader(folder / "train_first581.csv"):
        out.append({"text": row.record["text"], "label": AG_CLASSES[int(row.record["label"]) - 1]})
    return out


def movielens(data: Path) -> list[dict]:
    return [row.record for row in DatasetReader(data / "movielens-100k" / "u.data")]


@dataclass(frozen=True)
class SetStream:
    """A synthetic set-completion stream: ``sets[i]`` holds integer ids (token
    ``f"id{x}"``); subclasses carry the ground truth and answer for it."""

    sets: list[np.ndarray]

    def tokens(self, i: int) -> list[str]:
        return [f"id{x}" for x in self.sets[i].tolist()]

    def answers(self, i: int, context: np.ndarray) -> np.ndarray:
        """The ids an oracle that knows the ground truth cannot tell apart as the one
        missing from set i's ``context`` (set i minus one id)."""
        raise NotImplementedError


@dataclass(frozen=True)
class ClusterSets(SetStream):
    """Sets of ids drawn without replacement from cluster ``which[i]``; ``clusters``
    (n_clusters, cluster) lists each cluster's ids."""

    which: np.ndarray  # (records,) int64
    clusters: np.ndarray  # (n_clusters, cluster) int64

    def answers(self, i: int, context: np.ndarray) -> np.ndarray:
        """The ids an oracle that knows the clusters cannot tell apart as the one missing
        from set i's ``context``: the rest of its cluster."""
        return np.setdiff1d(self.clusters[self.which[i]], context)


def cluster_sets(n_ids: int, cluster: int, records: int, sizes: tuple[int, int], seed: int = 0) -> ClusterSets:
    """``records`` sets: each picks one of n_ids / cluster latent clusters (uniformly) and
    a random subset of ``sizes[0]..sizes[1]`` of its ids. Ids are assigned to clusters
    at random, so the hash of an id says nothing about its cluster."""
    if n_ids % cluster or not 1 <= sizes[0] <= sizes[1] <= cluster:
        raise ValueError(f"need n_ids divisible by cluster and 1 <= sizes <= cluster; got {n_ids}, {cluster}, {sizes}")
    rng = np.random.default_rng(seed)
    clusters = rng.permutation(n_ids).reshape(-1, cluster)
    which = rng.integers(len(clusters), size=records)
    lengths = rng.integers(sizes[0], sizes[1] + 1, size=records)
    sets = [rng.choice(clusters[c], n, replace=False) for c, n in zip(which, lengths)]
    return ClusterSets(sets, which, clusters)


@dataclass(frozen=True)
class PartnerSets(SetStream):
    """A set stream whose answer needs two steps of context.

    Ids are paired at random (``partner[x]`` is x's partner); every set holds whole pairs.
    With one id masked, the answer is the partner of the one context id whose own partner
    is missing: telling which id that is needs the context ids compared with each other
    before the [MASK] slot reads them.
    """

    partner: np.ndarray  # (n_ids,) int64

    def answers(self, i: int, context: np.ndarray) -> np.ndarray:
        """The one id that completes ``context`` (set i minus one id) into whole pairs."""
        return self.partner[context[~np.isin(self.partner[context], context)]]


def partner_sets(n_ids: int, records: int, pairs: tuple[int, int], seed: int = 0) -> PartnerSets:
    """``records`` sets of ``pairs[0]..pairs[1]`` random whole pairs each (2 to 2 * pairs[1]
    ids); ids are paired at random, so the hash of an id says nothing about its partner."""
    if n_ids % 2 or not 1 <= pairs[0] <= pairs[1] <= n_ids // 2:
        raise ValueError(f"need an even n_ids and 1 <= pairs <= n_ids / 2; got {n_ids}, {pairs}")
    rng = np.random.default_rng(seed)
    couples = rng.permutation(n_ids).reshape(-1, 2)
    partner = np.empty(n_ids, dtype=np.int64)
    partner[couples[:, 0]], partner[couples[:, 1]] = couples[:, 1], couples[:, 0]
    counts = rng.integers(pairs[0], pairs[1] + 1, size=records)
    sets = [rng.permutation(couples[rng.choice(len(couples), c, replace=False)].reshape(-1)) for c in counts]
    return PartnerSets(sets, partner)


# ---------------------------------------------------------------------------- text peers

def river_nb(records: list[dict]) -> float:
    """river MultinomialNB on BagOfWords(lowercase=True): predict_one, then learn_one."""
    from river import compose, feature_extraction, naive_bayes

    model = compose.Pipeline(feature_extraction.BagOfWords(lowercase=True), naive_bayes.MultinomialNB())
    hits = 0
    for r in records:
        hits += model.predict_one(r["text"]) == r["label"]
        model.learn_one(r["text"], r["label"])
    return hits / len(records)


def vw_oaa(records: list[dict]) -> float | None:
    """Vowpal Wabbit --oaa with bigrams, predict then learn; None when not installed."""
    try:
        import vowpalwabbit
    except ImportError:
        return None
    labels = sorted({r["label"] for r in records}, key=str)
    ids = {lab: i + 1 for i, lab in enumerate(labels)}
    vw = vowpalwabbit.Workspace(f"--oaa {len(labels)} --ngram 2 --quiet")
    hits = 0
    for r in records:
        text = " ".join(w.replace(":", " ").replace("|", " ") for w in r["text"].lower().split())
        hits += vw.predict(f"| {text}") == ids[r["label"]]
        vw.learn(f"{ids[r['label']]} | {text}")
    vw.finish()
    return hits / len(records)


# ---------------------------------------------------------------------------- next-item peers

class NextItemBaselines:
    """Online first-order Markov and global popularity over integer item ids.

    Markov ranks the candidates by the count of transitions (previous item -> candidate)
    seen so far, ties and the rest of the list by popularity; a row with no counts left
    after the exclusions is plain popularity. Popularity ranks by counts so far. Both
    rank only items seen so far and exclude what the caller excludes.
    """

    def __init__(self, n_items: int):
        self.trans = np.zeros((n_items, n_items), dtype=np.int64)
        self.pop = np.zeros(n_items, dtype=np.int64)
        self._scale = 1  # > max popularity, so a transition count outranks any popularity

    def top(self, prev: int, exclude: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """(Markov top-k, popularity top-k) item ids; ``exclude`` a bool mask (n_items,)."""
        allowed = (self.pop > 0) & ~exclude
        pop = np.where(allowed, self.pop, -1)
        markov = np.where(allowed, self.trans[prev] * self._scale + self.pop, -1)
        return _topk(markov, k), _topk(pop, k)

    def learn(self, prev: int | None, item: int) -> None:
        if prev is not None:
            self.trans[prev, item] += 1
        self.pop[item] += 1
        self._scale = max(self._scale, int(self.pop[item]) + 1)


def _topk(scores: np.ndarray, k: int) -> np.ndarray:
    """Ids of the k best scores among those >= 0 (fewer if fewer qualify)."""
    k = min(k, int((scores >= 0).sum()))
    if k == 0:
        return np.empty(0, dtype=np.int64)
    top = np.argpartition(-scores, k - 1)[:k]
    return top[scores[top] >= 0]
