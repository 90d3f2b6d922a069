"""Benchmarks run on a tiny case: two that once broke without a test noticing
(bench/depth.py after mlm's defaults moved to the sampled head, 2026-11-25; bench/shapes.py
where the optional vowpalwabbit peer is not installed), in-process, bench/decoding.py,
whose table docs/decoding.md quotes, and bench/moving_items.py's streams."""
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from streamlearn.config import load_config

BENCH = Path(__file__).resolve().parents[1] / "bench"
sys.path.insert(0, str(BENCH))

import depth
import moving_items
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


def test_moving_item_streams_have_their_shape_and_replay(tmp_path):
    grow = moving_items.growing()
    assert len(grow) == 6000 and len({item for _, item in grow[3000:]} - {item for _, item in grow[:3000]}) > 1000
    shift = moving_items.popshift()
    top = [Counter(item for _, item in shift[s:s + 1500]).most_common(20) for s in (0, 1500)]
    assert not {i for i, _ in top[0]} & {i for i, _ in top[1]}  # the popular items changed
    keys = Counter(key for key, _ in moving_items.one_event())
    assert sum(n == 1 for n in keys.values()) == 3000 and sum(n == 20 for n in keys.values()) == 100
    ring = moving_items.ring(4, 50)
    assert len(ring) == 200 and all(0 < (b - a) % 3000 <= 3 for (k, a), (j, b) in zip(ring, ring[1:]) if k == j)
    row = moving_items.run(moving_items.write(moving_items.growing()[:600], tmp_path / "g.jsonl"), 0,
                           ["learner.batch_size=16"])
    assert row["peer"] in ("markov", "popularity") and 0 <= row["model"] <= 1 and row["records_per_s"] > 0
