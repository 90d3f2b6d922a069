"""The synthetic next-item worlds (bench/synthetic_items.py) have the shape they claim, and
the per-record peers (bench/peers.py) rank as their definition says."""
import sys
from collections import Counter
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

from peers import NextItemPeers, recall_of_peers
from synthetic_items import markov_world, route_world, taste_world


def _by_user(events):
    out = {}
    for e in events:
        out.setdefault(e["key"], []).append(e["item"])
    return out


def test_markov_world_moves_to_a_successor_or_jumps():
    s = markov_world(200, events=5_000, n_users=50, jump=0.1, seed=3)
    pos = {name: i for i, name in enumerate(s.truth["names"])}
    succ = s.truth["P"]
    steps = jumps = 0
    for items in _by_user(s.events).values():
        for a, b in zip(items, items[1:]):
            steps += 1
            jumps += pos[b] not in succ[pos[a]]
    assert 0.03 < jumps / steps < 0.12  # jumps (10%) minus those landing on a successor


def test_route_world_users_walk_whole_routes():
    s = route_world(100, events=3_000, n_users=20, routes=50, length=5, seed=1)
    names = s.truth["names"]
    routes = {tuple(names[i] for i in r) for r in s.truth["routes"].tolist()}
    for items in _by_user(s.events).values():
        whole = len(items) // 5 * 5
        for k in range(0, whole, 5):
            assert tuple(items[k:k + 5]) in routes


def test_taste_world_never_repeats_an_item_for_a_user():
    s = taste_world(1_000, events=3_000, n_users=30, seed=2)
    for items in _by_user(s.events).values():
        assert len(items) == len(set(items))


def test_worlds_are_seeded():
    for make in (lambda seed: markov_world(100, events=500, n_users=10, seed=seed),
                 lambda seed: route_world(100, events=500, n_users=10, routes=20, length=5, seed=seed),
                 lambda seed: taste_world(100, events=500, n_users=10, seed=seed)):
        assert make(4).events == make(4).events
        assert make(4).events != make(5).events


def test_popularity_and_markov_rank_by_counts_so_far():
    rng = np.random.default_rng(0)
    peers, pop, trans = NextItemPeers(), Counter(), {}
    prev = None
    for _ in range(3_000):
        item = int(rng.zipf(1.3)) % 60
        if rng.random() < 0.3:
            exclude = set(rng.choice(60, 5).tolist())
            top = peers.popularity(exclude, 10)
            counts = [pop[i] for i in top]
            assert counts == sorted(counts, reverse=True) and not exclude & set(top)
            rest = [c for i, c in pop.items() if i not in exclude and i not in top]
            assert len(top) == min(10, len(pop) - len(exclude & set(pop))) and (not rest or min(counts) >= max(rest))
            if prev is not None:
                m = peers.markov(prev, exclude, 10)
                t = [trans.get(prev, Counter())[i] for i in m]
                assert t == sorted(t, reverse=True) and not exclude & set(m)
        peers.learn(prev, item)
        pop[item] += 1
        if prev is not None:
            trans.setdefault(prev, Counter())[item] += 1
        prev = item


def test_peers_learn_record_by_record_whatever_the_order_within_a_key():
    events = [("u1", "a"), ("u2", "a"), ("u1", "b"), ("u2", "b"), ("u3", "a"), ("u3", "b")]
    r = recall_of_peers(events, k=1)
    # u3's "b" after "a": Markov has seen a -> b twice; popularity ranks a (excluded) then b
    assert r["evaluated"] == 3 and r["markov"] == 2 / 3 and r["popularity"] == 2 / 3
