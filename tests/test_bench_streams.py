"""The synthetic set streams bench/depth.py measures on: their ground truth is right."""
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

from quality_streams import cluster_sets, partner_sets


def test_partner_sets_hold_whole_pairs_and_answer_the_masked_id():
    stream = partner_sets(40, 500, (2, 3), seed=4)
    p = stream.partner
    assert np.array_equal(p[p], np.arange(40)) and not np.any(p == np.arange(40))  # a pairing
    rng = np.random.default_rng(0)
    for i, s in enumerate(stream.sets):
        assert len(s) in (4, 6) and len(set(s.tolist())) == len(s) and set(p[s].tolist()) == set(s.tolist())
        j = int(rng.integers(len(s)))
        assert stream.answers(i, np.delete(s, j)).tolist() == [s[j]]
    assert stream.tokens(0) == [f"id{x}" for x in stream.sets[0]]


def test_partner_sets_are_seeded_and_checked():
    a, b = partner_sets(40, 50, (1, 2), seed=1), partner_sets(40, 50, (1, 2), seed=1)
    assert np.array_equal(a.partner, b.partner) and all(np.array_equal(x, y) for x, y in zip(a.sets, b.sets))
    assert not np.array_equal(a.partner, partner_sets(40, 50, (1, 2), seed=2).partner)
    for bad in ((41, (1, 2)), (40, (0, 2)), (40, (3, 2)), (40, (1, 21))):
        with pytest.raises(ValueError, match="need an even n_ids"):
            partner_sets(bad[0], 10, bad[1])


def test_cluster_sets_answers_are_the_rest_of_the_cluster():
    stream = cluster_sets(64, 8, 100, (3, 6), seed=0)
    for i, s in enumerate(stream.sets):
        cluster = stream.clusters[stream.which[i]]
        assert set(s.tolist()) <= set(cluster.tolist())
        rest = stream.answers(i, s[1:])
        assert s[0] in rest and set(rest.tolist()) == set(cluster.tolist()) - set(s[1:].tolist())
