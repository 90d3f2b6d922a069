"""The worker's live history and prequential checks: points merge without losing a count,
the history stays bounded and writes only what changed, survives a failed commit and a
restart, and a real worker commits figures (scores, baseline, lag, dead letters,
checkpoint durations) that the dashboard then serves."""
import numpy as np
import pytest
import torch
from fastapi.testclient import TestClient

from streamlearn.checkpoint import LIVE_NS, live_kv, read_live
from streamlearn.config import Config, StoreConfig
from streamlearn.consumers import RunOptions, Worker
from streamlearn.consumers.live import Gauges, LiveHistory, merge
from streamlearn.exceptions import CorruptStateError
from streamlearn.learner import Learner
from streamlearn.prequential import ACCURACY, LOSS, HashedPopularity, PatternPopularity, SampledPopularity
from streamlearn.service import Settings, create_app
from streamlearn.state import Checkpoint, open_store
from test_snapshot import SMALL
from test_worker import config, produce, stream

pytestmark = pytest.mark.usefixtures("one_torch_thread")


class _Item:
    """What a worker hands LiveHistory.learned: the records and dead letters of a batch."""

    def __init__(self, records: int, dead=()):
        self.records, self.dead = records, list(dead)


class _Report:
    def __init__(self, records: int, loss: float = 0.5, skipped: bool = False):
        self.records, self.examples, self.loss, self.skipped = records, records, loss, skipped
        self.learned = 0 if skipped else records  # as StepReport.learned


def history(points=(), max_points: int = 1024, position=None) -> LiveHistory:
    position = position if position is not None else [0]
    return LiveHistory(list(points), gauges=lambda: Gauges(records=position[0], steps=position[0] // 10,
                                                           lag={0: 3}), max_points=max_points)


def fill(h: LiveHistory, n: int, position: list) -> None:
    for i in range(n):
        position[0] += 10
        h.learned(_Item(10, ["bad-json"] if i % 3 == 0 else []), _Report(9), None, "popularity")
        h.close()


# ---------------------------------------------------------------------------- points

def test_merging_two_points_keeps_every_count():
    position = [0]
    h = history(position=position)
    fill(h, 2, position)
    (_, a), (_, b) = h.points
    m = merge(a, b)
    assert m["consumed"] == a["consumed"] + b["consumed"] == 20 and m["records"] == b["records"] == 20
    assert m["dead"] == {"bad-json": 1} and m["start"] is True and m["dt"] == pytest.approx(a["dt"] + b["dt"])
    a["eval"] = {"metric": ACCURACY, "baseline": "x", "n": 4, "model": 3.0, "base": 1.0}
    b["eval"] = {"metric": ACCURACY, "baseline": "x", "n": 6, "model": 5.0, "base": 2.0}
    assert merge(a, b)["eval"] == {"metric": ACCURACY, "baseline": "x", "n": 10, "model": 8.0, "base": 3.0}
    a["ckpt"], b["ckpt"] = {"n": 1, "sum": 0.5, "max": 0.5, "failed": 0, "rows": 7}, {"n": 0, "sum": 0, "max": 0,
                                                                                       "failed": 1, "rows": 0}
    assert merge(a, b)["ckpt"] == {"n": 1, "sum": 0.5, "max": 0.5, "failed": 1, "rows": 7}


def test_the_history_stays_bounded_and_its_totals_survive_thinning():
    position = [0]
    h = history(max_points=16, position=position)
    fill(h, 200, position)
    assert len(h.points) <= 16
    numbers = [n for n, _ in h.points]
    assert numbers == sorted(numbers) and numbers[-1] == 199  # the newest points keep full resolution
    assert sum(f["consumed"] for _, f in h.points) == 2000 and h.points[-1][1]["records"] == 2000
    assert sum(f["dead"].get("bad-json", 0) for _, f in h.points) == 67
    assert [f["start"] for _, f in h.points].count(True) == 1


def test_a_commit_writes_only_what_changed_and_deletes_what_was_merged():
    position = [0]
    h = history(max_points=8, position=position)
    fill(h, 8, position)
    first = h.take_kv()[LIVE_NS]
    assert len(first) == 8 and all(v is not None for v in first.values())
    fill(h, 1, position)  # a ninth point: the older half (4 points) merges into 2
    second = h.take_kv()[LIVE_NS]
    deleted = sorted(int.from_bytes(k, "big") for k, v in second.items() if v is None)
    written = sorted(int.from_bytes(k, "big") for k, v in second.items() if v is not None)
    assert deleted == [0, 2] and written == [1, 3, 8]
    assert h.take_kv()[LIVE_NS] == {}


@pytest.mark.parametrize("backend", ["lmdb", "memory"])
def test_points_round_trip_through_the_store_and_a_restart_continues_them(tmp_path, backend):
    position = [0]
    h = history(max_points=8, position=position)
    fill(h, 12, position)
    with open_store(tmp_path / "s", StoreConfig(backend=backend, shards=1, map_size_gb=0.05)) as store:
        store.commit(Checkpoint(step=1, kv=h.take_kv()))
        stored = read_live(store)
        assert stored == h.points
        again = LiveHistory(stored, gauges=lambda: Gauges(records=999, steps=0))
        again.close()
        store.commit(Checkpoint(step=2, kv=again.take_kv()))
        numbers = [n for n, _ in read_live(store)]
        assert numbers[-1] == h.points[-1][0] + 1 and read_live(store)[-1][1]["start"] is True


def test_a_damaged_point_is_corrupt_state(tmp_path):
    with open_store(tmp_path / "s", StoreConfig(shards=1, map_size_gb=0.05)) as store:
        store.commit(Checkpoint(step=1, kv={LIVE_NS: {b"\x00" * 8: b"\xc1"}}))
        with pytest.raises(CorruptStateError, match="live"):
            read_live(store)
        store.commit(Checkpoint(step=2, kv=live_kv({0: None}) | {LIVE_NS: {b"\x00" * 8: b"\x93\x01\x02\x03"}}))
        with pytest.raises(CorruptStateError, match="not a numbered map"):
            read_live(store)


# ---------------------------------------------------------------------------- prequential checks

def test_the_classify_check_scores_the_model_and_the_naive_bayes_part_before_learning():
    lrn = Learner(Config().override(*SMALL))
    check = lrn.task.prequential_check()
    records = [{"text": "free prize", "label": "spam"}, {"text": "see you", "label": "ham"}] * 8
    lrn.learn_batch(lrn.prepare(records))
    batch = lrn.prepare(records)
    scores = lrn.prequential(batch, check)
    nb_right = (lrn.task.nb.scores(batch.nb_tokens, batch.n_labels).argmax(-1) == batch.targets["labels"]).sum()
    assert (scores.metric, scores.examples, scores.hits) == (ACCURACY, 16, lrn.prequential_hits(batch))
    assert scores.baseline == nb_right and check.baseline == "naive bayes part"


@pytest.mark.parametrize("overrides", [(), ("learner.compiled=false",), ("model.layers=1",), ("learner.nb_weight=0",)])
def test_a_scored_step_gives_what_scoring_then_learning_gives(overrides):
    """The worker's evaluated batches (learn_batch_scored: classify scores the logits of
    the step's own forward) get the figures prequential() then learn_batch() give, and
    leave the learner as they leave it."""
    fused, apart = Learner(Config().override(*SMALL, *overrides)), Learner(Config().override(*SMALL, *overrides))
    checks = fused.task.prequential_check(), apart.task.prequential_check()
    stream = [{"text": "free prize now", "label": "spam"}, {"text": "see you at noon", "label": "ham"},
              {"text": "prize call now", "label": "spam"}, {"text": "lunch at noon", "label": "ham"}] * 6
    stream += [{"text": "a brand new label", "label": "other"}] + stream[:8]
    for i in range(0, len(stream), 8):
        a, b = fused.prepare(stream[i:i + 8]), apart.prepare(stream[i:i + 8])
        scores, report = fused.learn_batch_scored(a, checks[0])
        expected = apart.prequential(b, checks[1])
        other = apart.learn_batch(b)
        assert (report.loss, report.examples, report.step, report.skipped) == \
            (other.loss, other.examples, other.step, other.skipped)
        assert scores == expected
        for check, batch in zip(checks, (a, b)):
            check.learn(batch)
    for name, table in fused.row_tables().items():
        assert torch.equal(table, apart.row_tables()[name]), name


def test_without_naive_bayes_the_baseline_is_the_majority_label():
    lrn = Learner(Config().override(*SMALL, "learner.nb_weight=0"))
    check = lrn.task.prequential_check()
    first = lrn.prepare([{"text": "a", "label": "x"}] * 3 + [{"text": "b", "label": "y"}])
    lrn.learn_batch(first)
    check.learn(first)
    batch = lrn.prepare([{"text": "c", "label": "x"}, {"text": "d", "label": "y"}])
    assert lrn.prequential(batch, check).baseline == 1.0 and check.baseline == "majority label"


@pytest.mark.parametrize("overrides", [
    (),  # the mlm defaults: the sampled head with the count part
    ("model.output=hashed", "model.counts=none"),
    ("embedding.scheme=tfree", "model.output=tfree", "model.counts=none"),
    ("model.output=sampled", "model.counts=none"),
])
def test_the_token_check_compares_the_models_loss_with_popularity_in_its_code(overrides):
    lrn = Learner(Config().override(*SMALL, "learner.task=mlm", "learner.mask_prob=0.5", *overrides))
    check = lrn.task.prequential_check()
    warm = lrn.prepare([{"text": "a dog ran in the park today"}] * 8)  # tokens to draw negatives from
    lrn.learn_batch(warm)
    check.learn(warm)
    batch = lrn.prepare([{"text": "the cat sat on the mat again"}] * 8)
    scores = lrn.prequential(batch, check)
    with torch.inference_mode():
        loss = float(lrn.task.loss(lrn.model, batch, lrn.dev))
    assert scores.metric == LOSS and scores.hits is None and scores.examples == batch.examples
    assert scores.model == pytest.approx(loss * batch.examples, rel=1e-5)
    before = scores.baseline / scores.examples
    lrn.learn_batch(batch)
    check.learn(batch)
    after = lrn.prequential(lrn.prepare([{"text": "the cat sat on the mat again"}] * 8), check)
    assert after.baseline / after.examples < before  # popularity learned which rows are answers


def test_next_items_check_with_its_transition_counts_scores_the_mixtures_loss_against_popularity():
    lrn = Learner(Config().override(*SMALL, "learner.task=next-item"))  # the defaults: model.counts=transitions
    check = lrn.task.prequential_check()
    events = [{"key": f"u{j % 5}", "item": f"i{j % 7}"} for j in range(40)]
    for _ in range(3):
        batch = lrn.prepare(events)
        scores = lrn.prequential(batch, check)
        with torch.inference_mode():
            loss = float(lrn.task.loss(lrn.model, batch, lrn.dev))
        lrn.learn_batch(batch)
        check.learn(batch)
    assert scores.metric == LOSS and scores.model == pytest.approx(loss * batch.examples, rel=1e-5)
    assert scores.model < scores.baseline  # the cycle is learned: the model beats item popularity


def test_hashed_popularity_is_the_heads_loss_of_bucket_frequencies():
    pop = HashedPopularity(m=2, size=4)
    pop.learn({"hashes": np.array([[0, 1], [0, 2]])}, np.ones(2, np.float32))
    p0, p1 = (2 + 1) / (2 + 4), (1 + 1) / (2 + 4)
    assert pop.loss({"hashes": np.array([[0, 1]])}, np.ones(1, np.float32)) == pytest.approx(-np.log(p0) - np.log(p1))


def test_sampled_popularity_is_the_cross_entropy_of_the_steps_candidates_by_frequency():
    pop = SampledPopularity()
    pop.learn({"hashes": np.array([[1, 2], [1, 2], [3, 4]])}, np.ones(3, np.float32))
    step = {"choices": np.array([[1, 2], [3, 4], [5, 6]]), "answer": np.array([1])}
    want = -np.log((1 + 1) / ((2 + 1) + (1 + 1) + (0 + 1)))
    assert pop.loss(step, np.ones(1, np.float32)) == pytest.approx(want)


def test_sampled_popularity_with_a_count_part_scores_each_answer_against_the_drawn_negatives_only():
    pop = SampledPopularity()
    pop.learn({"hashes": np.array([[1, 2], [1, 2], [3, 4]])}, np.ones(3, np.float32))
    step = {"choices": np.array([[1, 2], [3, 4], [5, 6]]), "answer": np.array([0, 1]),
            "negatives": np.array([1, 2])}
    c = np.array([2 + 1, 1 + 1, 0 + 1])
    want = [-np.log(c[0] / (c[0] + c[1] + c[2])), -np.log(c[1] / (c[1] + c[2]))]  # answer 1 is drawn too: counted once
    assert pop.loss(step, np.ones(2, np.float32)) == pytest.approx(np.mean(want))


def test_pattern_popularity_is_the_summed_bce_of_row_frequencies():
    pop = PatternPopularity(rows=3)
    targets = {"ids": np.array([0, 0, 2]), "offsets": np.array([0, 2, 3])}  # row 0 twice in answer 0: once
    pop.learn(targets, np.ones(2, np.float32))
    p = (np.array([1, 0, 1]) + 1) / (2 + 2)
    want = -(np.log(p[0]) + np.log(1 - p[1]) + np.log(1 - p[2]))
    assert pop.loss({"ids": np.array([0]), "offsets": np.array([0, 1])}, np.ones(1, np.float32)) == pytest.approx(want)


# ---------------------------------------------------------------------------- a real worker

def test_a_worker_commits_its_figures_and_the_dashboard_serves_them(broker, make_topic, group, tmp_path):
    topic = make_topic(2)
    records = stream(900, seed=3)
    produce(broker, topic, records[:600])
    from kafka import KafkaProducer
    raw = KafkaProducer(bootstrap_servers=broker)
    for _ in range(3):
        raw.send(topic, b"\xff not a record")
    raw.flush()
    raw.close()
    cfg = config(broker, group, "worker.checkpoint_every=200", "worker.eval_every=1")
    state = tmp_path / "s"
    Worker(cfg, RunOptions(topic, str(state), until_idle_s=1.0)).run()
    with open_store(state, readonly=True) as store:
        points = [f for _, f in read_live(store)]
    assert points[0]["start"] and sum(f["consumed"] for f in points) == 603
    assert points[-1]["records"] == 603 and sum(f["learned"] for f in points) == 600
    assert sum(sum(f["dead"].values()) for f in points) == 3
    evaluated = [f["eval"] for f in points if f["eval"]]
    assert sum(e["n"] for e in evaluated) == 600 and {e["baseline"] for e in evaluated} == {"naive bayes part"}
    assert sum(e["model"] for e in evaluated) / 600 > 0.6  # 3 separable classes: chance is 1/3
    assert sum(f["ckpt"]["n"] for f in points) >= 2  # every checkpoint but the last, which no commit followed
    assert all(v >= 0 for f in points for v in f["lag"].values())

    produce(broker, topic, records[600:])  # a restart goes on with the same history
    Worker(cfg, RunOptions(topic, str(state), until_idle_s=1.0)).run()
    with open_store(state, readonly=True) as store:
        again = read_live(store)
    assert [f["start"] for _, f in again].count(True) == 2 and again[-1][1]["records"] == 903

    client = TestClient(create_app(Settings(state=str(state))))
    body = client.get("/v1/dashboard").json()
    assert len(body["points"]) == len(again) and body["points"][-1]["records"] == 903
    assert body["card"]["task"] == "classify" and body["card"]["labels_seen"] == 3
    assert {t["name"] for t in body["card"]["tables"]} >= {"E", "P", "nb.counts"}
    assert all(0 < t["stored"] <= t["rows"] for t in body["card"]["tables"])
    assert body["totals"]["records_learned"] == 900
    assert client.get(f"/v1/dashboard?since={body['commits']}").json()["unchanged"] is True
