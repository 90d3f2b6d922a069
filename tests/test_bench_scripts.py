"""Two benchmarks that once broke without a test noticing, each run on a tiny case in-process:
bench/depth.py after mlm's defaults moved to the sampled head (2026-11-25), and
bench/shapes.py where the optional vowpalwabbit peer is not installed."""
import sys
from pathlib import Path

import numpy as np
import pytest

from streamlearn.config import load_config

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

import depth
import shapes

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_depth_trains_superbloom_hashed_model_and_ranks_every_id():
    run = depth.Run(layers=1, seed=0, ids=200, cluster=8, sets=1200, rows=20)
    assert depth.learner(run).cfg.model.output == "hashed"  # mlm's defaults are a sampled head
    result = depth.run_model(run)
    quarters = result["recall@10_by_quarter"]
    assert result["layers"] == 1 and len(quarters) == 4, result
    assert 0 < quarters[-1] <= 1


def test_shapes_text_peers_leave_out_a_peer_that_is_not_installed():
    rng = np.random.default_rng(0)
    records = [{"text": " ".join(rng.choice(["free", "prize", "win"] if y else ["lunch", "later", "call"], 4)),
                "label": "spam" if y else "ham"} for y in rng.integers(0, 2, 60)]
    hashing = load_config(overrides=["learner.task=classify"], use_env=False).hashing
    got = shapes.text_peers(records, hashing)
    assert got["river_nb"]["best"] > 0.8  # two vocabularies: easy once a few are seen
    if got["vw"]["native"] is None:  # vowpalwabbit is an optional extra
        assert got["vw"]["best"] is None
