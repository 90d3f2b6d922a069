"""Prequential loops for bench/quality.py: each predicts a mini-batch, then learns it.

Every loop times only ``Learner.learn_batch`` for its records/s (prepare, i.e. parsing
and hashing, runs in a worker's ingest thread and is excluded), and reports it with the
torch thread count the caller set.

Predictions on a prepared training batch use ``Learner.outputs``, the forward pass the
learner's own prediction verbs run, as consumers/metrics.py does: the public verbs would
tokenize and hash the batch a second time, and the next-item recall below needs every
candidate's score (to exclude the items a user already rated), which no public verb
returns. :func:`beam_check` compares the public beam-search ``topk_many`` against that
exhaustive scoring.
"""
from __future__ import annotations

import statistics
import time
from collections.abc import Sequence

import numpy as np
import torch

from streamlearn.config import load_config
from streamlearn.learner import Learner

from quality_streams import NextItemBaselines


def learner(task: str, overrides: Sequence[str], batch: int) -> Learner:
    return Learner(load_config(overrides=[f"learner.task={task}", f"learner.batch_size={batch}", *overrides],
                               use_env=False))


def n_params(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


# ---------------------------------------------------------------------------- classify

def classify(records: list[dict], overrides: Sequence[str], batch: int) -> dict:
    """Prequential accuracy. A batch is scored over the labels known before it (a label
    first seen in the batch cannot be predicted yet: those records count as misses)."""
    L = learner("classify", overrides, batch)
    hits, learn_s = 0, 0.0
    for start, stop in L.schedule.spans(len(records)):  # as the worker batches
        known = len(L.labels)
        b = L.prepare(records[start:stop])
        assert not b.rejected, b.rejected[:1]
        if known:
            probs = L.predict_proba_batch(b)[:, :known]  # (N, known)
            hits += int((probs.argmax(1) == b.targets["labels"]).sum())
        t = time.perf_counter()
        L.learn_batch(b)
        learn_s += time.perf_counter() - t
    return {"accuracy": hits / len(records), "records": len(records), "batch": batch,
            "learn_records_per_s": len(records) / learn_s, "params": n_params(L.model)}


# ---------------------------------------------------------------------------- next-item

def next_item(events: list[dict], overrides: Sequence[str], batch: int, k: int = 10) -> dict:
    """recall@k of the model, first-order Markov and popularity on the same events.

    An event is evaluated when its user has an earlier event. Each method ranks the
    items seen before the event, excluding the items the user rated before it; a hit is
    the event's item in the top k. The model scores every allowed item exactly
    (sum over its m hashes of the log-softmax) with the weights learned before the batch.
    """
    users = np.array([int(e["key"]) for e in events])
    items = np.array([int(e["item"]) for e in events])
    n_items = int(items.max()) + 1
    first = np.full(n_items, len(events))
    np.minimum.at(first, items, np.arange(len(events)))  # the event where each item first appears
    L = learner("next-item", overrides, batch)
    codes = L.task.code.targets([str(i) for i in range(n_items)])["hashes"]  # (n_items, m)
    base = NextItemBaselines(n_items)
    rated = np.zeros((users.max() + 1, n_items), dtype=bool)
    last: dict[int, int] = {}
    hits = {"model": 0, "markov": 0, "popularity": 0}
    evaluated, learn_s = 0, 0.0
    for start, stop in L.schedule.spans(len(events)):
        b = L.prepare(events[start:stop])
        scores = _item_scores(L, b, codes) if b.examples else None  # (examples, n_items)
        row = 0
        for e in range(start, stop):
            u, item = int(users[e]), int(items[e])
            if u in last:
                exclude = rated[u] | (first >= e)
                s = scores[row]
                row += 1
                s[exclude] = -np.inf
                top = np.argpartition(-s, k)[:k]
                hits["model"] += bool(item in top[np.isfinite(s[top])])
                markov, pop = base.top(last[u], exclude, k)
                hits["markov"] += bool(item in markov)
                hits["popularity"] += bool(item in pop)
                evaluated += 1
            base.learn(last.get(u), item)
            rated[u, item] = True
            last[u] = item
        assert row == b.examples
        t = time.perf_counter()
        L.learn_batch(b)
        learn_s += time.perf_counter() - t
    out = {f"recall@{k}_{name}": h / evaluated for name, h in hits.items()}
    out.update(events=len(events), evaluated=evaluated, batch=batch,
               learn_records_per_s=len(events) / learn_s, params=n_params(L.model))
    out["beam"] = beam_check(L, sorted(last)[:300], k)
    return out


def _item_scores(L: Learner, b, codes: np.ndarray) -> np.ndarray:
    logp = torch.log_softmax(L.outputs(b).float(), dim=-1).numpy()  # (n, m, size)
    scores = logp[:, 0, codes[:, 0]]
    for j in range(1, codes.shape[1]):
        scores = scores + logp[:, j, codes[:, j]]
    return scores  # (n, n_items)


def beam_check(L: Learner, keys: list[int], k: int) -> dict:
    """Public ``topk_many`` (beam search over the candidate index, learner.beam) against
    exhaustive scoring of the same candidates, for the given users' next item."""
    queries = [{"key": str(u)} for u in keys]
    tops = L.topk_many(queries, k=k)
    b = L.prepare(queries, train=False)
    tokens = L.index.tokens
    codes = L.task.code.targets(tokens)["hashes"]
    scores = _item_scores(L, b, codes)  # (n, candidates)
    same = 0
    for top, s in zip(tops, scores):
        best = np.argsort(-s, kind="stable")[:k]
        same += [tokens[i] for i in best] == top.tokens
    return {"queries": len(keys), "certified_exact": sum(t.exact for t in tops) / len(tops),
            "same_top_k_as_exhaustive": same / len(tops), "beam": L.cfg.learner.beam}


# ---------------------------------------------------------------------------- set completion

def step_cost(records: list[dict], task: str, overrides: Sequence[str], batch: int, steps: int) -> dict:
    """Median learn_batch time of the configuration against the same configuration with
    ``embedding.scheme=plain`` (a bounded-dictionary nn.Embedding table of the same
    width d, sparse rows, same optimizer), on the same batches, steps interleaved."""
    hashed, plain = learner(task, overrides, batch), learner(task, [*overrides, "embedding.scheme=plain"], batch)
    times: dict[str, list[float]] = {"hashed": [], "plain": []}
    for i in range(steps):
        chunk = records[(i * batch) % len(records):][:batch]
        for name, L in (("hashed", hashed), ("plain", plain)):
            b = L.prepare(chunk)
            t = time.perf_counter()
            L.learn_batch(b)
            times[name].append(time.perf_counter() - t)
    skip = min(5, steps // 5)  # warm-up steps (allocator, first labels)
    med = {name: statistics.median(ts[skip:]) for name, ts in times.items()}
    return {"step_ms": med["hashed"] * 1e3, "plain_step_ms": med["plain"] * 1e3,
            "ratio": med["hashed"] / med["plain"], "batch": batch, "steps": steps,
            "records_per_s": batch / med["hashed"]}
