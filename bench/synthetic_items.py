"""Seeded synthetic next-item streams of known shape (issue 17, item 4).

Each generator returns a :class:`ItemStream`: events ``{"key": user, "item": id}`` in
stream order (users interleaved, each user's events in order), plus what was used to
make them. Item ids are strings ``"i<n>"`` with n a random label, so neither the id nor
its hash says anything about the item.

- :func:`markov_world`: the next item depends on the user's previous item only: each
  item has ``successors`` random successors with Zipf weights, and with probability
  ``jump`` the user jumps to an item drawn by global popularity instead. First-order
  Markov (counts of prev -> next) is the optimum here, so a model should reach about
  its recall (target >= 0.95x), no more.
- :func:`route_world`: sessions follow routes (fixed random item sequences, each item on
  ~``routes * length / n_items`` of them). The last item alone leaves many possible
  next items; the last two or three name the route. Target: >= 1.3x Markov.
- :func:`taste_world`: each user has a low-rank taste (rank ``rank``) that drifts; the
  next item is drawn by softmax(taste . item + popularity) among the items the user has
  not had. The previous item says little; the recent items together say the taste.
  Target: >= 1.3x Markov.

Users are picked per event by a Zipf(0.5) activity weight, so a few users are busy and many
come back rarely (their histories must persist across long gaps).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True)
class ItemStream:
    name: str
    events: list[dict]
    n_items: int
    truth: dict = field(default_factory=dict, repr=False)  # the generator's ground truth


def _zipf_weights(n: int, s: float, rng: np.random.Generator) -> np.ndarray:
    """Weights 1 / rank^s over n items in a random order, summing to 1."""
    w = 1.0 / np.arange(1, n + 1) ** s
    return rng.permutation(w / w.sum())


def _names(n: int, rng: np.random.Generator) -> list[str]:
    return [f"i{x}" for x in rng.permutation(10 * n)[:n].tolist()]


def _users(events: int, n_users: int, rng: np.random.Generator) -> np.ndarray:
    """Which user acts at each event: Zipf(0.5) activity weights (2,000 users, 100,000
    events: 50 events a user on average, the busiest about 1,100)."""
    return rng.choice(n_users, size=events, p=_zipf_weights(n_users, 0.5, rng))


def markov_world(n_items: int, events: int = 100_000, n_users: int = 2_000, successors: int = 10,
                 jump: float = 0.1, skew: float = 0.7, seed: int = 0) -> ItemStream:
    """First-order Markov walks (module docstring). ``truth["P"]``: (n_items, successors)
    successor ids and ``truth["Q"]`` their probabilities (before the jump mixture),
    ``truth["pop"]`` the jump distribution, Zipf(``skew``), which also draws the
    successors (popular items are many items' successors)."""
    rng = np.random.default_rng(seed)
    pop = _zipf_weights(n_items, skew, rng)
    succ = rng.choice(n_items, size=(n_items, successors), p=pop)  # a repeat merges two weights
    q = 1.0 / np.arange(1, successors + 1)
    q /= q.sum()
    names = _names(n_items, rng)
    who = _users(events, n_users, rng)
    cur = rng.choice(n_items, size=n_users, p=pop)
    jumps = rng.random(events) < jump
    pick = rng.choice(successors, size=events, p=q)
    land = rng.choice(n_items, size=events, p=pop)
    started = np.zeros(n_users, dtype=bool)
    out = []
    for t, u in enumerate(who.tolist()):
        if started[u]:
            cur[u] = land[t] if jumps[t] else succ[cur[u], pick[t]]
        started[u] = True
        out.append({"key": f"u{u}", "item": names[cur[u]]})
    return ItemStream(f"markov-{n_items // 1000}k", out, n_items, {"P": succ, "Q": q, "pop": pop, "names": names})


def route_world(n_items: int = 1_000, events: int = 100_000, n_users: int = 2_000, routes: int = 2_000,
                length: int = 20, seed: int = 0) -> ItemStream:
    """Sessions that follow routes (module docstring): a user follows a route (picked by
    Zipf popularity) from its start to its end, then picks another. ``truth["routes"]``:
    (routes, length) item indices."""
    rng = np.random.default_rng(seed)
    item_pop = _zipf_weights(n_items, 0.5, rng)
    paths = np.stack([rng.choice(n_items, size=length, replace=False, p=item_pop) for _ in range(routes)])
    route_pop = _zipf_weights(routes, 0.5, rng)
    names = _names(n_items, rng)
    who = _users(events, n_users, rng)
    route = np.full(n_users, -1)
    step = np.zeros(n_users, dtype=np.int64)
    fresh = rng.choice(routes, size=events, p=route_pop)
    out = []
    for t, u in enumerate(who.tolist()):
        if route[u] < 0 or step[u] == length:
            route[u], step[u] = fresh[t], 0
        out.append({"key": f"u{u}", "item": names[paths[route[u], step[u]]]})
        step[u] += 1
    return ItemStream("routes", out, n_items, {"routes": paths, "names": names})


def taste_world(n_items: int = 3_000, events: int = 100_000, n_users: int = 2_000, rank: int = 8,
                drift: float = 0.05, sharpness: float = 2.0, seed: int = 0) -> ItemStream:
    """Low-rank tastes with drift (module docstring). Item vectors and user tastes are
    N(0, 1/rank) per coordinate; the logit of item i for user u is
    ``sharpness * sqrt(rank) * taste_u . v_i + log pop_i``; after each event the user's
    taste moves: ``taste <- sqrt(1 - drift^2) taste + drift * noise``."""
    rng = np.random.default_rng(seed)
    pop = _zipf_weights(n_items, 0.8, rng)
    V = rng.normal(0, rank ** -0.5, size=(n_items, rank))
    Z = rng.normal(0, rank ** -0.5, size=(n_users, rank))
    names = _names(n_items, rng)
    who = _users(events, n_users, rng)
    had = np.zeros((n_users, n_items), dtype=bool)
    log_pop = np.log(pop)
    keep = np.sqrt(1 - drift ** 2)
    out = []
    for t, u in enumerate(who.tolist()):
        logits = sharpness * np.sqrt(rank) * (V @ Z[u]) + log_pop
        if had[u].all():  # a user who has had everything starts over
            had[u] = False
        logits[had[u]] = -np.inf
        i = int(np.argmax(logits + rng.gumbel(size=n_items)))  # a softmax draw (Gumbel-max)
        had[u, i] = True
        Z[u] = keep * Z[u] + drift * rng.normal(0, rank ** -0.5, size=rank)
        out.append({"key": f"u{u}", "item": names[i]})
    return ItemStream("taste", out, n_items, {"V": V, "names": names})
