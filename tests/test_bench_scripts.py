"""Benchmarks run on a tiny case: two that once broke without a test noticing
(bench/depth.py after mlm's defaults moved to the sampled head, 2026-11-25; bench/shapes.py
where the optional vowpalwabbit peer is not installed), in-process, and bench/decoding.py,
whose table docs/decoding.md quotes."""
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from streamlearn.config import load_config

BENCH = Path(__file__).resolve().parents[1] / "bench"
sys.path.insert(0, str(BENCH))

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


def test_decoding_bench_prints_its_table_and_every_certified_top10_is_the_exhaustive_one():
    out = subprocess.run([sys.executable, str(BENCH / "decoding.py"), "--n", "30000", "--reps", "1"],
                         capture_output=True, text=True, check=True, timeout=120).stdout
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in out.splitlines()
            if line.startswith("| ") and not line.startswith("| logp")]
    assert len(rows) == 7, out  # two score tables x three beams, and the 32 positions
    for row in rows[:6]:
        assert row[5] in ("yes", "no") and int(row[6].replace(",", "")) > 0, row
        if row[5] == "yes":  # the certificate: nothing unvisited can enter the top 10
            assert row[7] == "yes", row
    exact, same = (int(x.split("/")[0]) for x in (rows[6][5], rows[6][7]))
    assert same >= exact, rows[6]
    assert "add:" in out and "merge: a tail of" in out
