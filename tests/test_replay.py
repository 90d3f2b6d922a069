"""`streamlearn replay` on files: prequential and frozen, metrics, baselines, report, plot,
--save/--compare, determinism, and bad input (counted, never a crash or a silent skip)."""
from __future__ import annotations

import json
from collections import Counter

import msgpack
import numpy as np
import pytest
import torch
from river import utils as river_utils

from streamlearn.cli import main
from streamlearn.config import Config
from streamlearn.datasets import DatasetError, task_of
from streamlearn.learner import Learner
from streamlearn.records import Record
from streamlearn.replay import FileSource, ReplayOptions, replay
from streamlearn.replay.baselines import BASELINES, build_baselines, parse_baselines, vw_available
from streamlearn.replay.counting import Markov, Popularity
from streamlearn.replay.model import ModelContestant
from streamlearn.sizing import OUT_B_MIN
from streamlearn.hashing import words
from streamlearn.replay.metrics import MRR, MetricSet, RecallAtK
from streamlearn.state import open_store

TINY = ["model.layers=0", "embedding.K=2000", "embedding.B=200", "embedding.d=16", "model.d_model=16",
        "model.max_labels=8", "learner.batch_size=16", "store.shards=2", "store.map_size_gb=0.05"]
TINY_ITEMS = [*TINY, "learner.task=next-item", "hashing.tokenizer=ids", "model.out_B=256", "learner.history=4"]
REPORT_KEYS = {"config", "source", "records", "metrics", "baselines", "records_per_s", "series", "models",
               "bad_records", "rejected_records", "evaluated", "rolling", "task", "mode", "compare"}


def words_stream(n: int) -> list[dict]:
    """A separable stream: the label is named by one of its words."""
    pool = {"spam": ["win", "prize", "cash", "free"], "ham": ["lunch", "meeting", "home", "later"]}
    out = []
    for i in range(n):
        label = "spam" if i % 3 == 0 else "ham"
        words = pool[label]
        out.append({"text": f"{words[i % 4]} {words[(i + 1) % 4]} and {words[(i + 2) % 4]}", "label": label})
    return out


def write_jsonl(path, records) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return str(path)


def movielens(path, users: int = 12, per_user: int = 8) -> str:
    """u.data lines; every user walks the same cycle of 20 items from its own start, so the
    transitions (Markov) predict the next item and popularity, nearly uniform, does not."""
    lines, ts = [], 1000
    for step in range(per_user):
        for u in range(users):
            item = (u * 7 + step) % 20 + 1
            lines.append(f"{u + 1}\t{item}\t4\t{ts}")
            ts += 1
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def cfg(*extra: str, base=TINY) -> Config:
    return Config().override(*base, *extra)


def events_of(config: Config):
    """The task's replay event builder for one-event records: ``build(position, record) -> Event``."""
    build = Learner(config).task.events(seed=0)
    return lambda position, record: single(build(position, record))


def single(events: list):
    assert len(events) == 1
    return events[0]


# ---------------------------------------------------------------------------- metrics


def test_recall_and_mrr_by_hand_and_under_rolling_revert():
    r, m = RecallAtK(k=2), MRR(k=2)
    pairs = [("a", ["a", "b"]), ("b", ["a", "b"]), ("c", ["a", "b", "c"])]  # rank 1, rank 2, beyond k
    for y, p in pairs:
        r.update(y, p)
        m.update(y, p)
    assert r.get() == pytest.approx(2 / 3) and m.get() == pytest.approx((1 + 0.5 + 0) / 3)
    rolling = river_utils.Rolling(MRR, window_size=2, k=2)
    for y, p in pairs:
        rolling.update(y, p)
    assert rolling.get() == pytest.approx((0.5 + 0) / 2)  # the first pair was reverted


def test_a_rolling_window_of_misses_reads_exactly_zero():
    """Was 5.15e-18 in a report: river's running mean drifted under its reverts."""
    for cls in (RecallAtK, MRR):
        rolling = river_utils.Rolling(cls, window_size=7, k=3)
        for i in range(300):
            rolling.update("a", ["a", "b", "c"][i % 3:] if i < 200 else ["x"])
        assert rolling.get() == 0.0
        rolling.update("b", ["a", "b"])
        assert rolling.get() == (1 / 7 if cls is RecallAtK else 0.5 / 7)


def test_metric_set_log_loss_charges_a_missing_label():
    ms = MetricSet("labels", k=10, window=5)
    ms.update("spam", {})  # no label known yet: p(spam) = 0, clipped to 1e-15
    ms.update("ham", {"ham": 0.5, "spam": 0.5})
    overall = ms.overall()
    assert overall["accuracy"] == 0.5
    assert overall["macro_f1"] == pytest.approx(0.5)  # ham F1 1, spam F1 0; river alone: 1/3 (a "None" class)
    assert overall["log_loss"] == pytest.approx((34.538776 + 0.693147) / 2, rel=1e-5)


# ---------------------------------------------------------------------------- baselines


def test_popularity_and_markov_exclude_what_the_key_already_had():
    build = events_of(cfg(base=TINY_ITEMS))
    stream = [("u1", "a"), ("u2", "a"), ("u3", "a"), ("u1", "b"), ("u2", "b"), ("u3", "c"), ("u1", "c")]
    events = [build(i, Record(key=k, item=v)) for i, (k, v) in enumerate(stream)]
    pop, markov = Popularity(k=2), Markov(k=2)
    pop.learn(events[:6])
    markov.learn(events[:6])
    last = events[6]  # u1 had a and b; its previous item is b
    assert last.excluded("a") and last.excluded("b") and not last.excluded("c")
    assert pop.predict([last]) == [["c"]]  # a (3) and b (2) are excluded
    assert markov.predict([last]) == [["c"]]  # after b came nothing yet: backfilled by popularity
    fresh = build(7, Record(key="u9", item="a"))
    # events[3] is u1 taking b: then u1 had only a (b, learned later, is not excluded back in time)
    assert not fresh.evaluate and pop.predict([events[3]]) == [["b", "c"]]


def filtered_beam_lists(learner: Learner, events: list, k: int) -> list[list[str]]:
    """The reference: each record's beam search as wide as the hashed output (exhaustive),
    asked for k + excluded answers, the items its key had filtered out."""
    extra = max(e.n_excluded for e in events)
    tops = learner.topk_many([e.query for e in events], k=k + extra, beam=learner.index.size)
    return [[t for t in top.tokens if not e.excluded(t)][:k] for e, top in zip(events, tops)]


def test_batched_next_item_decoding_equals_the_filtered_beam_lists():
    """Unfused (a label delay, or frozen), the model's next-item lists (one exhaustive pass
    per mini-batch, already-had items masked) are the per-record beam-search lists with
    the had items filtered out; no list holds an item its key already had, including one
    learned later in the same batch; an event not evaluated gets None."""
    learner = Learner(cfg(base=TINY_ITEMS))
    model = ModelContestant("model", learner, learning=True, k=5, fused=False)
    build = learner.task.events(seed=0)
    stream = [Record(key=f"u{(i * 7) % 5}", item=str((i * 3) % 11 + (i % 4))) for i in range(160)]
    for start in range(0, len(stream), 16):
        events = [single(build(start + i, r)) for i, r in enumerate(stream[start:start + 16])]
        asked = [e for e in events if e.evaluate]
        got = model.predict(events)
        assert [top for e, top in zip(events, got) if not e.evaluate] == [None] * (len(events) - len(asked))
        got = [top for e, top in zip(events, got) if e.evaluate]
        assert got == filtered_beam_lists(learner, asked, k=5)
        for e, top in zip(asked, got):
            assert not any(e.excluded(t) for t in top)
            allowed = len(learner.index) - sum(t in learner.index for t in e.excluded_items())
            assert len(top) == min(5, allowed)
        model.learn(events)
    assert model.steps == 10


def test_fused_next_item_lists_read_the_batch_in_order():
    """Prequential, each mini-batch is predicted from its training batch before its step:
    an event's list ranks the candidates known before the batch and the items the batch
    showed before the event, by the outputs whose transition counts saw the batch's
    earlier records (checked against a twin learner fed the same batches), minus every
    item the key had, the batch's included."""
    learner, twin = Learner(cfg(base=TINY_ITEMS)), Learner(cfg(base=TINY_ITEMS))
    model = ModelContestant("model", learner, learning=True, k=5, fused=True)
    build = learner.task.events(seed=0)
    stream = [Record(key=f"u{(i * 7) % 5}", item=str((i * 3) % 11 + (i % 4) + 4 * (i // 40))) for i in range(160)]
    fresh_answered = 0
    for start in range(0, len(stream), 16):
        events = [single(build(start + i, r)) for i, r in enumerate(stream[start:start + 16])]
        got = model.predict(events)
        batch = twin.prepare([e.record for e in events], train=True)
        logp = twin.outputs(batch).numpy()  # (n, m, size): log P with the counts in order
        known = twin.index.tokens
        first: dict[str, int] = {}
        for e in events:
            first.setdefault(e.target, e.position)
        cands = known + [t for t in first if t not in twin.index]
        codes = twin.task.code.ids(cands)
        row = 0
        for e, top in zip(events, got):
            if not e.evaluate:
                assert top is None
                continue
            scores = logp[row, 0, codes[:, 0]].astype(np.float64)
            for j in range(1, codes.shape[1]):
                scores = scores + logp[row, j, codes[:, j]]
            row += 1
            allowed = [c for c in range(len(cands)) if not e.excluded(cands[c])
                       and (c < len(known) or first[cands[c]] < e.position)]
            want = [cands[c] for c in sorted(allowed, key=lambda c: (-scores[c], c))[:5]]
            assert top == want
            fresh_answered += any(t not in known for t in top)
        assert row == batch.examples
        model.learn(events)
        twin.learn_batch(batch)
    assert model.steps == 10 and fresh_answered > 0


def test_markov_breaks_transition_ties_by_popularity():
    build = events_of(cfg(base=TINY_ITEMS))
    stream = [("u1", "a"), ("u1", "b"), ("u2", "a"), ("u2", "c"), ("u3", "c"), ("u4", "c"), ("u5", "a")]
    events = [build(i, Record(key=k, item=v)) for i, (k, v) in enumerate(stream)]
    markov = Markov(k=2)
    markov.learn(events[:6])
    # after a: b once (seen first), c once; c is the more popular (3 against 1)
    assert markov.predict([build(7, Record(key="u5", item="x"))]) == [["c", "b"]]


def test_baseline_names_are_checked_and_inapplicable_ones_skipped_with_a_reason():
    assert parse_baselines("all", "next-item") == ["popularity", "markov", "ngram"]
    with pytest.raises(Exception, match="unknown baseline 'nb'"):
        parse_baselines("nb,markov", "classify")
    built, skipped = build_baselines(["markov", "popularity"], "classify", 10)
    assert [b.name for b in built] == ["popularity"] and "does not apply to task classify" in skipped["markov"]


# ---------------------------------------------------------------------------- file replay


def test_prequential_file_replay_report_learns_and_ranks_baselines(tmp_path):
    path = write_jsonl(tmp_path / "s.jsonl", words_stream(240))
    report = replay(FileSource(path), ReplayOptions(window=50, baselines=("river-nb", "popularity", "markov")),
                    config=cfg())
    assert REPORT_KEYS <= set(report)
    assert report["records"] == 240 and report["evaluated"] == 240 and report["bad_records"]["total"] == 0
    assert set(report["metrics"]) == {"accuracy", "macro_f1", "log_loss"}
    assert report["rolling"]["accuracy"] > 0.9  # the words name the label: the model learns it
    assert report["baselines"]["popularity"]["accuracy"] == pytest.approx(report["baselines"]["popularity"]["accuracy"])
    assert report["rolling"]["accuracy"] > report["baselines"]["popularity"]["rolling"]["accuracy"]
    assert report["baselines"]["river-nb"]["records_per_s"] > 0 and report["records_per_s"] > 0
    assert "does not apply" in report["baselines"]["markov"]["skipped"]
    assert report["source"] == {"kind": "file", "path": path, "format": "jsonl"}
    positions = report["series"]["positions"]
    assert positions == sorted(positions) and positions[-1] == 240
    assert len(report["series"]["model"]["accuracy"]) == len(positions)


def test_same_input_and_seed_give_identical_metrics(tmp_path):
    path = write_jsonl(tmp_path / "s.jsonl", words_stream(120))
    options = ReplayOptions(window=40, baselines=("river-nb", "river-logreg", "popularity"), seed=3)
    a, b = (replay(FileSource(path), options, config=cfg()) for _ in range(2))
    for key in ("metrics", "series", "evaluated"):
        assert a[key] == b[key]
    for name in ("river-nb", "river-logreg", "popularity"):
        assert {k: v for k, v in a["baselines"][name].items() if k not in ("seconds", "records_per_s")} == \
               {k: v for k, v in b["baselines"][name].items() if k not in ("seconds", "records_per_s")}


@pytest.mark.parametrize("delay", [0, 7])
def test_baselines_learn_record_by_record_whatever_the_models_batch_size(tmp_path, delay):
    """Baselines predict then learn one record at a time in stream order (river's
    progressive_val_score), so their metrics are the same at every learner.batch_size;
    and they equal a hand-run record-by-record loop of the same baseline."""
    from river import naive_bayes

    records = words_stream(150)
    path = write_jsonl(tmp_path / "s.jsonl", records)
    options = ReplayOptions(window=40, baselines=("river-nb", "popularity"), delay=delay)
    reports = [replay(FileSource(path), options, config=cfg(f"learner.batch_size={b}")) for b in (1, 16, 64)]
    for name in ("river-nb", "popularity"):
        got = [{k: v for k, v in r["baselines"][name].items() if k not in ("seconds", "records_per_s")}
               for r in reports]
        assert got[0] == got[1] == got[2], name
    nb, hits = naive_bayes.MultinomialNB(alpha=1.0), 0
    for i, r in enumerate(records):  # the hand-run loop: predict i, then learn the one now due
        x = Counter(words(r["text"]))
        proba = nb.predict_proba_one(x)
        hits += bool(proba) and max(proba, key=proba.get) == r["label"]
        if i - delay >= 0:
            due = records[i - delay]
            nb.learn_one(Counter(words(due["text"])), due["label"])
    assert reports[0]["baselines"]["river-nb"]["accuracy"] == pytest.approx(hits / len(records))


def test_label_delay_scores_every_record_once(tmp_path):
    path = write_jsonl(tmp_path / "s.jsonl", words_stream(100))
    now = replay(FileSource(path), ReplayOptions(window=50), config=cfg())
    late = replay(FileSource(path), ReplayOptions(window=50, delay=30), config=cfg())
    assert now["evaluated"] == late["evaluated"] == 100
    assert late["metrics"]["accuracy"] < now["metrics"]["accuracy"]  # 30 more records predicted untrained


def test_save_then_frozen_replay_and_inspect(tmp_path, capsys):
    path = write_jsonl(tmp_path / "s.jsonl", words_stream(160))
    saved = tmp_path / "saved"
    report = replay(FileSource(path), ReplayOptions(), config=cfg(), save=saved)
    assert report["saved_step"] == 14  # 1 + 2 + 4 + 8 records in the first steps (Schedule), then 16 per step
    assert main(["inspect", "--state", str(saved), "--json"]) == 0
    manifest = json.loads(capsys.readouterr().out)
    assert manifest["step"] == 14 and manifest["metrics"]["records"] == 160
    with open_store(saved, readonly=True) as store:
        commits = store.manifest().commits
    frozen = replay(FileSource(path), ReplayOptions(mode="frozen"), state=saved)
    assert frozen["metrics"]["accuracy"] > 0.9 and frozen["models"]["model"]["records_per_s"] > 0
    # --task naming the snapshot's own task is fine (was refused as "from scratch"); another is not
    assert main(["replay", "--file", str(path), "--state", str(saved), "--task", "classify", "--mode", "frozen",
                 "--no-progress"]) == 0
    capsys.readouterr()
    assert main(["replay", "--file", str(path), "--state", str(saved), "--task", "mlm", "--no-progress"]) == 2
    assert "holds a classify model" in capsys.readouterr().err
    assert frozen["truncated_records"] is None  # nothing learned: not counted, not 0
    pre = replay(FileSource(path), ReplayOptions(), state=saved)  # prequential from the snapshot
    assert pre["evaluated"] == 160
    with open_store(saved, readonly=True) as store:
        assert store.manifest().commits == commits  # replays never write to the state they read


@pytest.mark.parametrize("task", ["classify", "next-token"])
def test_a_saved_learner_stores_the_rows_it_changed_and_reads_back_whole(tmp_path, task):
    """Was: every row of every table (150-340 MB for a replay of 1,000-3,000 records). A row
    left at its seeded init is not stored; restored, it is that init again, bit for bit."""
    from streamlearn.checkpoint import read_full
    from streamlearn.replay import save_learner

    learner = Learner(cfg(f"learner.task={task}", *(("model.layers=1",) if task == "next-token" else ())))
    records = words_stream(64) if task == "classify" else [{"text": r["text"]} for r in words_stream(64)]
    learner.learn_many(records)
    learner.learn_many([{"text": "prize"}] if task == "next-token" else [{"text": "prize", "label": "spam"}])
    save_learner(learner, tmp_path / "saved")
    with open_store(tmp_path / "saved", readonly=True) as store:
        stored = {name: store.stats()["tables"][name]["stored"] for name in learner.row_tables()}
        back = read_full(store)
    ours, theirs = learner.row_tables(), back.row_tables()
    for name, table in ours.items():  # by bits: the count tables' words hold bits, NaN patterns among them
        assert torch.equal(table.detach().cpu().view(torch.int32), theirs[name].detach().cpu().view(torch.int32)), name
    assert 0 < sum(stored.values()) < sum(t.shape[0] for t in ours.values()) / 10  # not every row
    for a, b in zip(learner.model.state_dict().values(), back.model.state_dict().values()):
        assert torch.equal(a.cpu(), b.cpu())


def wide_words_stream(n: int, per_label: int = 40) -> list[dict]:
    """Like words_stream, but each label has ``per_label`` words and a record names 3 of
    them: a few records cannot have seen every word (words_stream's 4 words per label
    are all learned from one batch of 16)."""
    out = []
    for i in range(n):
        label = "spam" if i % 3 == 0 else "ham"
        words = [f"{label}{(7 * i + j) % per_label}" for j in range(3)]
        out.append({"text": " ".join(words), "label": label})
    return out


def test_compare_two_snapshots_on_the_same_records(tmp_path):
    path = write_jsonl(tmp_path / "s.jsonl", wide_words_stream(160))
    short = write_jsonl(tmp_path / "short.jsonl", wide_words_stream(6))
    replay(FileSource(path), ReplayOptions(), config=cfg(), save=tmp_path / "a")
    replay(FileSource(short), ReplayOptions(), config=cfg(), save=tmp_path / "b")
    report = replay(FileSource(path), ReplayOptions(mode="frozen", baselines=("popularity",)),
                    compare=(tmp_path / "a", tmp_path / "b"))
    assert set(report["models"]) == {"a", "b"}
    assert report["metrics"] == {k: report["models"]["a"][k] for k in report["metrics"]}
    cmp = report["compare"]
    assert cmp["a"]["state"] == str(tmp_path / "a")
    assert cmp["diff"]["accuracy"] == pytest.approx(cmp["b"]["metrics"]["accuracy"] - cmp["a"]["metrics"]["accuracy"])
    assert cmp["diff"]["accuracy"] < 0  # b learned 6 records, a 160


def test_prequential_compare_of_next_item_snapshots_that_know_other_keys(tmp_path):
    """Two next-item snapshots whose keys differ, compared prequentially: the events follow
    the first one's histories, so both are asked by queries (was: B predicted from its own
    training batch, whose examples follow B's histories, and the replay crashed with
    "exclude has 64 entries for 4 positions", or scored B's lists against other events)."""
    a = [{"key": f"x{i % 9}", "item": f"i{(i * 5) % 13}"} for i in range(120)]
    b = [{"key": f"y{i % 4}", "item": f"i{(i * 3) % 13}"} for i in range(40)]
    mixed = [{"key": f"{'x' if i % 3 else 'y'}{i % 5}", "item": f"i{(i * 7) % 13}"} for i in range(96)]
    for name, records in (("a", a), ("b", b)):
        replay(FileSource(write_jsonl(tmp_path / f"{name}.jsonl", records)), ReplayOptions(k=3),
               config=cfg(base=TINY_ITEMS), save=tmp_path / name)
    both = replay(FileSource(write_jsonl(tmp_path / "m.jsonl", mixed)), ReplayOptions(k=3),
                  compare=(tmp_path / "a", tmp_path / "b"))
    alone = replay(FileSource(tmp_path / "m.jsonl"), ReplayOptions(k=3, delay=0), compare=(tmp_path / "a", tmp_path / "a"))
    assert both["models"]["a"]["recall@3"] == alone["models"]["a"]["recall@3"] == alone["models"]["b"]["recall@3"]
    assert 0 <= both["models"]["b"]["recall@3"] <= 1 and both["evaluated"] == alone["evaluated"]


def test_next_item_file_replay_with_top_k_baselines(tmp_path):
    path = movielens(tmp_path / "u.data")
    report = replay(FileSource(path), ReplayOptions(k=3, window=30, baselines=("popularity", "markov")),
                    config=cfg(base=TINY_ITEMS))
    assert set(report["metrics"]) == {"recall@3", "mrr"}
    assert report["records"] == 96 and report["not_evaluated"] == 12 and report["evaluated"] == 84
    markov = report["baselines"]["markov"]
    assert markov["recall@3"] > report["baselines"]["popularity"]["recall@3"]  # the shared sequence
    assert 0 <= report["metrics"]["mrr"] <= report["metrics"]["recall@3"] <= 1


def test_a_catalog_that_grows_inside_a_batch_is_answered_as_markov_answers_it(tmp_path):
    """Each new item is shown by one key and followed at once by another: the second
    key's only allowed answer is the item the record before it brought, in the same
    mini-batch. Markov, learning record by record, names it; so does the model, whose
    fused batch lists the items its earlier records brought (it scored 0 before)."""
    records = []
    for t in range(96):
        records += [{"key": "src", "item": f"n{t}"}, {"key": "fan", "item": f"n{t}"}]
    path = write_jsonl(tmp_path / "grow.jsonl", records)
    report = replay(FileSource(path), ReplayOptions(k=3, baselines=("markov",)),
                    config=cfg("learner.batch_size=16", base=TINY_ITEMS))
    markov = report["baselines"]["markov"]["recall@3"]
    assert markov == pytest.approx(95 / 190)  # every fan event after the first; no src event
    assert report["metrics"]["recall@3"] == pytest.approx(markov)


def test_a_mini_batch_of_first_events_only_is_learned_and_scores_nothing(tmp_path):
    """A fused mini-batch whose records are all their keys' first has no example to
    answer (was: a crash on its empty input)."""
    records = [{"key": f"k{i % 16}", "item": f"i{(i * 5) % 23}"} for i in range(64)]
    report = replay(FileSource(write_jsonl(tmp_path / "firsts.jsonl", records)), ReplayOptions(k=3),
                    config=cfg("learner.batch_size=16", base=TINY_ITEMS))
    assert report["not_evaluated"] == 16 and report["evaluated"] == 48


def test_next_item_ids_that_are_empty_or_hold_the_models_marks_are_bad_records(tmp_path):
    """An empty key or item, or one holding \\x00-\\x02 (the marks of the model's own recency
    and key tokens, and the context keys' separator), is refused with its reason, by the
    learner and by the replay alike (was: accepted, and "\\x02u1" read as the key token
    of u1); the events after it are scored as usual, in either replay path."""
    odd = [{"key": "a", "item": ""}, {"key": "", "item": "x"}, {"key": "\x02u1", "item": "y"},
           {"key": "a", "item": "\x011:i1"}, {"key": "a", "item": "i\x00j"}]
    records = odd + [{"key": f"u{i % 3}", "item": f"i{i % 5}"} for i in range(30)] + [{"key": "a", "item": "x"}]
    learner = Learner(cfg(base=TINY_ITEMS))
    rejected = learner.learn_many(odd).rejected
    assert [i for i, _ in rejected] == [0, 1, 2, 3, 4] and all("bad-value" in str(e) for _, e in rejected)
    path = write_jsonl(tmp_path / "odd.jsonl", records)
    for delay in (0, 1):
        report = replay(FileSource(path), ReplayOptions(k=3, delay=delay), config=cfg(base=TINY_ITEMS))
        assert report["bad_records"]["reasons"] == {"bad-value": 5} and report["rejected_records"]["total"] == 0
        assert report["not_evaluated"] == 4 and report["evaluated"] == 27  # u0-u2's and a's first


def test_the_task_of_a_file_brings_its_defaults_and_replays_it(tmp_path):
    """bench/streams.py sets only learner.task from the file's shape: MovieLens files are
    next-item, whose defaults (ids, an own output space) replay their events."""
    path = movielens(tmp_path / "u.data")
    assert task_of(path) == "next-item" and task_of(tmp_path / "x.tsv", "tsv") == "classify"
    config = Config().override(f"learner.task={task_of(path)}", "store.shards=2", "store.map_size_gb=0.05")
    report = replay(FileSource(path), ReplayOptions(k=3, window=30, limit=48), config=config)
    assert report["task"] == "next-item" and report["config"]["model"]["model"]["out_B"] == OUT_B_MIN  # few items
    assert report["config"]["model"]["hashing"]["tokenizer"] == "ids"
    assert report["evaluated"] == 36  # 48 events of 12 users: each user's first is not scored
    with pytest.raises(DatasetError, match="can hold any task"):
        task_of(write_jsonl(tmp_path / "r.jsonl", [{"text": "a", "label": "b"}]))


def test_cli_takes_the_task_a_file_says_and_learner_seed_from_set(tmp_path, capsys):
    """Was: a MovieLens or key/item file without --task replayed as classify, every record
    bad and exit status 0; --set learner.seed was overridden by --seed's default 0."""
    sets = [a for s in [*TINY, "model.out_B=256", "learner.history=4"] for a in ("--set", s)]
    items = write_jsonl(tmp_path / "items.jsonl", [{"key": f"u{i % 4}", "item": f"i{(i * 3) % 11}"} for i in range(48)])
    for path in (movielens(tmp_path / "u.data"), items):
        assert run_cli("--file", path, *sets, "--report", str(tmp_path / "r.json")) == 0
        report = json.loads((tmp_path / "r.json").read_text())
        assert report["task"] == "next-item" and report["bad_records"]["total"] == 0 and report["evaluated"] > 0
        assert report["config"]["model"]["hashing"]["tokenizer"] == "ids"  # next-item's own defaults
    path = write_jsonl(tmp_path / "s.jsonl", words_stream(64))
    sets = [a for s in TINY for a in ("--set", s)]
    runs = {}
    for name, seed in (("set", ["--set", "learner.seed=3"]), ("flag", ["--seed", "3"]), ("none", [])):
        assert run_cli("--file", path, *sets, *seed, "--report", str(tmp_path / f"{name}.json")) == 0
        runs[name] = json.loads((tmp_path / f"{name}.json").read_text())
    assert runs["set"]["config"]["replay"]["seed"] == runs["flag"]["config"]["replay"]["seed"] == 3
    assert runs["none"]["config"]["replay"]["seed"] == 0
    assert runs["set"]["series"] == runs["flag"]["series"]


def test_mlm_file_replay(tmp_path):
    path = write_jsonl(tmp_path / "s.jsonl", words_stream(64))
    report = replay(FileSource(path), ReplayOptions(k=5, baselines=("popularity", "markov")),
                    config=cfg("learner.task=mlm", "model.out_B=256"))
    assert set(report["metrics"]) == {"recall@5", "mrr"} and report["evaluated"] == 64
    assert report["baselines"]["markov"]["recall@5"] > 0


@pytest.mark.skipif(not vw_available(), reason="vowpalwabbit (an optional extra) is not installed")
def test_vw_baseline_learns(tmp_path):
    path = write_jsonl(tmp_path / "s.jsonl", words_stream(150))
    report = replay(FileSource(path), ReplayOptions(window=50, baselines=("vw",)), config=cfg())
    assert report["baselines"]["vw"]["rolling"]["accuracy"] > 0.9


# ---------------------------------------------------------------------------- bad input


def test_bad_records_are_counted_with_reasons_and_examples(tmp_path):
    good = words_stream(40)
    lines = [json.dumps(r) for r in good[:20]] + ["{not json", json.dumps({"text": "no label"}),
                                                   json.dumps({"text": "  ", "label": "ham"}), "[1, 2]"]
    lines += [json.dumps(r) for r in good[20:]]
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join(lines) + "\n")
    report = replay(FileSource(path), ReplayOptions(baselines=("river-nb",)), config=cfg())
    bad = report["bad_records"]
    assert report["records"] == 44 and report["evaluated"] == 40 and bad["total"] == 4
    assert bad["reasons"] == {"invalid-json": 1, "missing-field": 1, "bad-value": 1, "wrong-type": 1}  # as from Kafka
    assert [e["position"] for e in bad["examples"]] == [21, 22, 23, 24]
    assert [e["where"] for e in bad["examples"]] == ["bad.jsonl:21", "bad.jsonl:22", "bad.jsonl:23", "bad.jsonl:24"]


def test_msgpack_stream_with_bad_objects_and_a_truncated_tail(tmp_path):
    path = tmp_path / "dump.msgpack"
    objs = [{"text": r["text"], "label": r["label"]} for r in words_stream(30)]
    data = b"".join(msgpack.packb(o) for o in objs[:10]) + msgpack.packb([1, 2]) + msgpack.packb({"label": "x"})
    data += b"".join(msgpack.packb(o) for o in objs[10:]) + msgpack.packb({"text": "cut"})[:-2]
    path.write_bytes(data)
    report = replay(FileSource(path), ReplayOptions(), config=cfg())
    assert report["source"]["format"] == "msgpack"
    assert report["records"] == 33 and report["evaluated"] == 30
    assert report["bad_records"]["reasons"] == {"invalid-msgpack": 1, "missing-field": 1, "truncated-msgpack": 1}


@pytest.mark.parametrize("bad_at", [(0,), (1, 2), (0, 1, 2, 3, 4, 5, 6)], ids=["first", "second batch", "first batches"])
@pytest.mark.parametrize("task", ["classify", "next-token"])
def test_a_mini_batch_of_bad_records_takes_no_step_and_the_replay_goes_on(tmp_path, bad_at, task):
    """Was: 'a fused batch was not revealed as predicted (internal order error)', exit 2,
    whenever a whole early mini-batch was bad (a bad first line, a BOM): the chunks kept
    the schedule's sizes by their index while the reveal split them by the steps taken."""
    lines = [json.dumps(r) for r in words_stream(40)]
    for i in bad_at:
        lines[i] = "not json"
    path = tmp_path / "s.jsonl"
    path.write_text("\n".join(lines) + "\n")
    extra = ("learner.task=next-token", "model.count_slots=1024", "model.negatives=8") if task == "next-token" else ()
    report = replay(FileSource(path), ReplayOptions(), config=cfg(*extra), save=tmp_path / "saved")
    assert report["records"] == 40 and report["bad_records"]["total"] == len(bad_at)
    # the batches follow the steps taken: the good records in the schedule's sizes for the model's steps
    good, steps, size = 40 - len(bad_at), 0, None
    schedule = Learner(cfg(*extra)).schedule
    taken = 0
    for i in range(40):  # replay the cut: a chunk of the next size, a step only if it held a good record
        if size is None:
            size, held = schedule.size(steps), 0
        held += i not in bad_at
        taken += 1
        if taken == size or i == 39:
            steps += held > 0
            size, taken = None, 0
    assert report["saved_step"] == steps and good > 0
    if task == "classify":
        assert report["evaluated"] == 40 - len(bad_at)
    else:  # an event per position of every good record
        assert report["evaluated"] == sum(len(r["text"].split()) for i, r in enumerate(words_stream(40))
                                          if i not in bad_at)


def test_labels_beyond_capacity_are_rejected_and_reported(tmp_path):
    records = [{"text": f"word{i} common", "label": f"l{i % 10}"} for i in range(40)]
    path = write_jsonl(tmp_path / "many.jsonl", records)
    report = replay(FileSource(path), ReplayOptions(), config=cfg())  # model.max_labels=8
    assert report["rejected_records"] == {"total": 8, "reasons": {"label-capacity": 8}}
    assert report["evaluated"] == 32


# ---------------------------------------------------------------------------- CLI


def run_cli(*args: str) -> int:
    return main(["replay", "--no-progress", *args])


def test_cli_writes_report_and_png_plot(tmp_path, capsys):
    path = write_jsonl(tmp_path / "s.jsonl", words_stream(96))
    out, png = tmp_path / "r.json", tmp_path / "r.png"
    sets = [a for s in TINY for a in ("--set", s)]
    assert run_cli("--file", path, *sets, "--baselines", "all", "--window", "30", "--report", str(out),
                   "--plot", str(png)) == 0
    text = capsys.readouterr().out
    assert "replay classify prequential: 96 records, 96 scored, 0 bad, 0 rejected" in text and "river-nb" in text
    report = json.loads(out.read_text())
    assert REPORT_KEYS <= set(report) and "accuracy" in report["baselines"]["river-nb"]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5_000
    assert f"report written to {out}" in text and f"plot written to {png}" in text
    bare, svg = tmp_path / "chart", tmp_path / "r.svg"  # no suffix: a PNG at that very path (was: chart.png)
    for plot in (bare, svg):
        assert run_cli("--file", path, *sets, "--no-progress", "--plot", str(plot)) == 0
        assert f"plot written to {plot}" in capsys.readouterr().out
    assert bare.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and b"<svg" in svg.read_bytes()[:400]


def test_cli_says_where_it_saved_the_learner(tmp_path, capsys):
    path = write_jsonl(tmp_path / "s.jsonl", words_stream(32))
    sets = [a for s in TINY for a in ("--set", s)]
    assert run_cli("--file", path, *sets, "--save", str(tmp_path / "saved")) == 0
    # 32 records at batch 16: 1, 2, 4, 8 (a new model's first steps, Schedule), then 16 and 1
    assert f"learner saved to {tmp_path / 'saved'} (step 6)" in capsys.readouterr().out


def test_replay_doubles_the_batch_from_learner_double_batch_after_on(tmp_path, capsys):
    path = write_jsonl(tmp_path / "s.jsonl", words_stream(64))
    sets = [a for s in [*TINY, "learner.double_batch_after=4"] for a in ("--set", s)]
    assert run_cli("--file", path, *sets, "--save", str(tmp_path / "saved")) == 0
    # 1, 2, 4, 8 (the ramp to batch 16), then from step 4 on 32 and the 17 left
    assert f"learner saved to {tmp_path / 'saved'} (step 6)" in capsys.readouterr().out


@pytest.mark.parametrize("lines", ["", "not json\n[1, 2]\n"], ids=["empty file", "all bad"])
def test_nothing_scored_reads_n_a_not_zero(tmp_path, capsys, lines):
    """An empty range or a file of bad records has no accuracy: the report says null, the
    summary n/a, for the model and every baseline (0.0000 would read as a model that is
    always wrong)."""
    path = tmp_path / "s.jsonl"
    path.write_text(lines)
    sets = [a for s in TINY for a in ("--set", s)]
    out, png = tmp_path / "r.json", tmp_path / "r.png"
    assert run_cli("--file", str(path), *sets, "--baselines", "river-nb,popularity", "--report", str(out),
                   "--plot", str(png)) == 0
    text = capsys.readouterr().out
    rows = [line.split() for line in text.splitlines() if line.strip().startswith(("model", "river-nb", "popularity"))]
    assert len(rows) == 3 and all(row[1:4] == ["n/a", "n/a", "n/a"] for row in rows), text
    report = json.loads(out.read_text())
    assert report["evaluated"] == 0 and set(report["metrics"].values()) == {None}
    assert {report["baselines"]["river-nb"][name] for name in report["metrics"]} == {None}
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_compare_plot_and_summary_name_the_two_directories(tmp_path, capsys):
    import matplotlib.pyplot as plt

    from streamlearn.replay.plot import figure

    path = write_jsonl(tmp_path / "s.jsonl", wide_words_stream(64))
    old, new = tmp_path / "old-model", tmp_path / "new-model"
    replay(FileSource(path), ReplayOptions(), config=cfg(), save=old)
    replay(FileSource(path), ReplayOptions(), config=cfg("learner.seed=1"), save=new)
    assert run_cli("--file", path, "--mode", "frozen", "--compare", str(old), str(new), "--baselines", "popularity",
                   "--report", str(tmp_path / "r.json")) == 0
    assert f"a = {old}, b = {new}" in capsys.readouterr().out
    fig = figure(json.loads((tmp_path / "r.json").read_text()))
    try:
        legend = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    finally:
        plt.close(fig)
    assert legend == [str(old), str(new), "popularity"]


@pytest.mark.parametrize("args, message", [
    ([], "give one source"),
    (["--file", "x.jsonl", "--topic", "t"], "give one source"),
    (["--file", "{path}", "--start-offset", "5"], "use them with --topic"),
    (["--file", "{path}", "--mode", "frozen"], "frozen replay evaluates a fixed snapshot"),
    (["--file", "{path}", "--baselines", "knn"], "unknown baseline 'knn'"),
    (["--file", "{path}", "--window", "0"], "--window must be an integer >= 1"),
    (["--file", "{path}", "--state", "{tmp}/none"], "no state directory"),
    (["--file", "{path}", "--save", "{path}"], "a file, not a directory"),  # was: "the directory exists and is not empty"
    (["--file", "{path}", "--save", "{tmp}"], "exists and is not empty"),
    (["--file", "{tmp}/missing.jsonl"], "no such file"),
    (["--topic", "t", "--start-offset", "x"], "offset 'x'"),
    (["--topic", "t", "--start-offset", "1", "--end-time", "5"], "not both"),
    # checked before the replay runs (was: after it, and the run's results were lost)
    (["--file", "{path}", "--report", "{tmp}/no-dir/r.json"], "no directory"),
    (["--file", "{path}", "--plot", "{tmp}"], "is a directory"),
    (["--file", "{path}", "--plot", "{tmp}/r.txt"], ".txt is not a plot format"),  # was: a traceback after the run
    (["--file", "{path}", "--seed", "3", "--set", "learner.seed=1"], "--seed 3 and learner.seed=1 disagree"),
    (["--file", "{tmp}/book.txt"], "a token stream; pass --task next-token or --task mlm"),
    (["--file", "{tmp}/unlabelled.jsonl"], "text without labels, a token stream"),
])
def test_cli_bad_arguments_are_clear_errors(tmp_path, capsys, args, message):
    path = write_jsonl(tmp_path / "s.jsonl", words_stream(4))
    (tmp_path / "book.txt").write_text("Well, Prince, so Genoa and Lucca are now just family estates\n")
    write_jsonl(tmp_path / "unlabelled.jsonl", [{"text": r["text"]} for r in words_stream(4)])
    args = [a.format(path=path, tmp=tmp_path) for a in args]
    assert run_cli(*args, "--set", "model.layers=0") == 2
    assert message in capsys.readouterr().err


def test_classify_baselines_see_a_texts_words_not_the_networks_ngrams_and_shapes():
    """The bag-of-words peers get the words the peers score best on; the n-grams and digit
    shapes are the network's own features (a list of tokens is taken whole)."""
    build = Learner(cfg("hashing.ngrams=2", "hashing.shapes=true")).task.events(seed=0)
    text = build(0, Record(text="Call 0800 now", label="spam"))[0]
    assert text.tokens == ("call", "0800", "now")
    listed = build(1, Record(tokens=("call now", "x"), label="spam"))[0]
    assert listed.tokens == ("call now", "x")


def test_classify_events_without_a_bag_reader_reject_and_answer_as_with_one():
    """Without a baseline that reads the words (``bags=False``) a text is not tokenized,
    only checked to hold a token: the same events, but for the words, and the same
    errors, for blank texts (Unicode whitespace included), missing labels and token lists."""
    task = Learner(cfg("hashing.ngrams=2", "hashing.shapes=true")).task
    records = [Record(text="Call 0800 now", label="spam"), Record(text=" \t\n\u2003\x1c", label="ham"),
               Record(text="", label="ham"), Record(text="no label"), Record(tokens=("a b",), label="x"),
               Record(text="\u00e9t\u00e9 !", label="y"), Record(text="-", label="z")]
    outcomes = []
    for bags in (True, False):
        build, seen = task.events(0, bags), []
        for i, rec in enumerate(records):
            try:
                e = build(i, rec)[0]
                seen.append((e.position, e.target, e.evaluate, e.query, e.tokens if rec.tokens else None))
            except Exception as exc:  # compared below, type and message
                seen.append((type(exc).__name__, str(exc)))
        outcomes.append(seen)
    assert outcomes[0] == outcomes[1]
    assert [o[0] for o in outcomes[1]].count("RecordError") == 3
    assert task.events(0, bags=False)(0, records[0])[0].tokens == ()


def test_a_replay_tokenizes_classify_events_only_for_a_baseline_that_reads_them(tmp_path):
    """The model's figures are the same with and without a bag-of-words baseline beside it."""
    rows = [{"text": f"w{i % 5} t{i % 2} x", "label": f"l{i % 2}"} for i in range(40)] + [{"text": "  ", "label": "l0"}]
    path = write_jsonl(tmp_path / "c.jsonl", rows)
    alone = replay(FileSource(path), ReplayOptions(), config=cfg())
    beside = replay(FileSource(path), ReplayOptions(baselines=("river-nb",)), config=cfg())
    assert alone["bad_records"] == beside["bad_records"] and alone["bad_records"]["total"] == 1
    assert alone["evaluated"] == beside["evaluated"] == 40

    def figures(report: dict) -> dict:
        return {k: v for k, v in report["models"]["model"].items() if k not in ("seconds", "records_per_s")}
    assert figures(alone) == figures(beside) and figures(alone)["accuracy"] > 0.5


@pytest.mark.parametrize("counts", ["none", "kn3"])
def test_next_token_replay_takes_one_step_per_mini_batch_of_records(tmp_path, counts):
    """A next-token record brings an event per position; its mini-batches still hold
    learner.batch_size records, each learned once (10 records of 6 words, batch 4: 3 steps;
    only classify's first steps grow 1, 2, 4, ...)."""
    path = write_jsonl(tmp_path / "t.jsonl", [{"text": f"w{i} a b c d w{i % 3}"} for i in range(10)])
    extra = ["learner.task=next-token", "learner.batch_size=4", "model.output=sampled", f"model.counts={counts}",
             "model.count_slots=1024"]
    report = replay(FileSource(path), ReplayOptions(), config=cfg(*extra), save=tmp_path / "saved")
    assert report["saved_step"] == 3 and report["evaluated"] == 60
    sampled = replay(FileSource(path), ReplayOptions(window=20), config=cfg(*extra))  # a point every 2 events
    positions = sampled["series"]["positions"]  # one point per record (was: up to three at its x, 6 events each)
    assert positions == sorted(set(positions)) and positions[-1] == 10
    assert all(len(values) == len(positions) for values in sampled["series"]["model"].values())
    assert sampled["series"]["model"]["recall@10"][-1] == sampled["rolling"]["recall@10"]


def test_cli_on_a_next_token_snapshot_checks_set_and_the_environment_against_its_own_task(tmp_path, capsys,
                                                                                           monkeypatch):
    """Was: --set was checked against classify's defaults before the snapshot was read (a
    loop: the refusal's own advice refused), and STREAMLEARN__* variables never reached a
    snapshot (a model key among them was neither applied nor refused)."""
    path = write_jsonl(tmp_path / "t.jsonl", [{"text": f"w{i} a b c d w{i % 3}"} for i in range(24)])
    sets = [a for s in (*TINY, "learner.task=next-token", "model.count_slots=1024", "model.negatives=8")
            for a in ("--set", s)]
    assert run_cli("--file", path, *sets, "--save", str(tmp_path / "nt")) == 0
    capsys.readouterr()
    state = ["--file", path, "--state", str(tmp_path / "nt"), "--report", str(tmp_path / "r.json")]
    assert run_cli(*state, "--set", "model.recent_pairs=1000") == 0  # next-token's own key, its stored value
    monkeypatch.setenv("STREAMLEARN__LEARNER__BATCH_SIZE", "4")
    assert run_cli(*state) == 0
    assert json.loads((tmp_path / "r.json").read_text())["config"]["replay"]["batch_size"] == 4
    assert "note: new model" not in capsys.readouterr().err  # a snapshot is not sized again
    monkeypatch.setenv("STREAMLEARN__HASHING__SEED", "5")
    assert run_cli(*state) == 2
    assert "hashing.seed: stored 0, now 5" in capsys.readouterr().err
    monkeypatch.delenv("STREAMLEARN__HASHING__SEED")
    # another task for a snapshot is refused, not dropped (baselines were then the other task's)
    assert run_cli(*state, "--set", "learner.task=classify") == 2
    assert "holds a next-token model, and this run asks for learner.task=classify" in capsys.readouterr().err


def test_cli_refuses_a_snapshot_on_a_file_or_beside_a_snapshot_of_another_task(tmp_path, capsys):
    """Was: --state on a file of another task scored nothing (every record bad, exit 0);
    --compare of two tasks crashed in the metrics or scored a classifier's recall as 0."""
    words = write_jsonl(tmp_path / "s.jsonl", words_stream(40))
    sets = [a for s in TINY for a in ("--set", s)]
    assert run_cli("--file", words, *sets, "--save", str(tmp_path / "cls")) == 0
    items = [a for s in (*TINY, "model.out_B=256", "learner.history=4") for a in ("--set", s)]
    ml = movielens(tmp_path / "u.data")
    assert run_cli("--file", ml, *items, "--save", str(tmp_path / "ni")) == 0
    book = tmp_path / "book.txt"
    book.write_text("the old prince said so to the count\n")
    capsys.readouterr()
    for file, state, holds in ((ml, "cls", "next-item"), (str(book), "cls", "running text"),
                               (words, "ni", None)):
        code = run_cli("--file", file, "--state", str(tmp_path / state), "--mode", "frozen")
        err = capsys.readouterr().err
        if holds is None:  # a table says no task of its own: the snapshot's reads it (and counts what is bad)
            assert code == 0
        else:
            assert code == 2 and f"holds a classify model, and {file} holds {holds}" in err, err
    assert run_cli("--file", words, "--mode", "frozen", "--compare", str(tmp_path / "cls"), str(tmp_path / "ni")) == 2
    assert "--compare needs two snapshots of one task" in capsys.readouterr().err


def test_cli_checks_set_against_the_task_its_file_says(tmp_path, capsys):
    """A MovieLens file is next-item: --set model.counts=transitions (next-item's own key)
    was refused by classify's rule before the file's task was taken."""
    sets = [a for s in (*TINY, "model.out_B=256", "learner.history=4", "model.counts=transitions") for a in ("--set", s)]
    assert run_cli("--file", movielens(tmp_path / "u.data"), *sets, "--report", str(tmp_path / "r.json")) == 0
    assert json.loads((tmp_path / "r.json").read_text())["task"] == "next-item"
    book = tmp_path / "book.txt"
    book.write_text("the old prince said so to the count\n")
    capsys.readouterr()
    assert run_cli("--file", str(book), "--set", "model.recent_pairs=1000") == 2  # which token task? first
    assert "pass --task next-token or --task mlm" in capsys.readouterr().err
    assert run_cli("--file", str(book), "--task", "next-token", "--set", "model.layers=-1") == 2
    assert "model.layers must be >= 0" in capsys.readouterr().err


def test_worker_config_on_a_stored_model_takes_its_task(tmp_path):
    from streamlearn.checkpoint import stored_task
    from streamlearn.cli import build_parser
    from streamlearn.cli.worker import run_config

    path = write_jsonl(tmp_path / "t.jsonl", [{"text": f"w{i} a b c d w{i % 3}"} for i in range(12)])
    replay(FileSource(path), ReplayOptions(), config=cfg("learner.task=next-token", "model.count_slots=1024"),
           save=tmp_path / "nt")
    assert stored_task(tmp_path / "nt") == "next-token" and stored_task(tmp_path / "none") is None
    args = build_parser().parse_args(["worker", "--topic", "t", "--state", str(tmp_path / "nt"),
                                      "--set", "model.recent_pairs=1000"])
    config, given = run_config(args)
    assert config.learner.task == "next-token" and given == {"model.recent_pairs"}
    args = build_parser().parse_args(["worker", "--topic", "t", "--state", str(tmp_path / "new")])
    assert run_config(args)[0].learner.task == "classify"


def _next_token_predictions(fused: bool, batch_size: int) -> list[list[str]]:
    """Every event's top 5 from a next-token model replayed by hand, mini-batch by
    mini-batch, predicted from its training batch (``fused``) or from queries."""
    config = cfg("learner.task=next-token", f"learner.batch_size={batch_size}", "model.output=sampled",
                 "model.counts=kn3", "model.count_slots=1024", "model.negatives=8")
    learner = Learner(config)
    build = learner.task.events(seed=0)
    model = ModelContestant("model", learner, learning=True, k=5, fused=fused)
    texts = [f"w{i % 7} a b w{i % 3} c w{i % 5}" for i in range(24)]
    out = []
    for start in range(0, len(texts), batch_size):
        events = [e for i in range(start, start + batch_size) for e in build(i, Record(text=texts[i]))]
        out += model.predict(events)
        model.learn(events)
    return out


def test_a_next_token_replay_predicts_each_record_from_its_training_batch():
    """Replay answers next-token's events from the training batch before its step (one
    example per event): at batch 1 exactly what separate prefix queries answer; in larger
    batches a record's count scores see the batch's records before it, so later records
    of a batch are answered differently and its first alike."""
    assert _next_token_predictions(True, 1) == _next_token_predictions(False, 1)
    fused, queried = _next_token_predictions(True, 4), _next_token_predictions(False, 4)
    assert len(fused) == len(queried) == 24 * 6
    by_record = [(fused[6 * i:6 * i + 6], queried[6 * i:6 * i + 6]) for i in range(24)]
    assert all(f == q for i, (f, q) in enumerate(by_record) if i % 4 == 0)  # a batch's first record
    assert any(f != q for i, (f, q) in enumerate(by_record) if i % 4)


def test_replay_help_names_every_baseline(capsys):
    """The flag's help is written out (reading BASELINES would load torch for --help)."""
    with pytest.raises(SystemExit):
        main(["replay", "--help"])
    flat = "".join(capsys.readouterr().out.split())  # argparse wraps at spaces and after hyphens
    assert all(name in flat for name in BASELINES), flat


def test_a_file_record_over_max_record_bytes_is_bad_as_it_is_from_kafka(tmp_path):
    """Was: learned from a file, dead-lettered by the worker and by a Kafka replay."""
    path = tmp_path / "big.jsonl"
    records = words_stream(20)
    lines = [json.dumps(r) for r in records]
    lines.insert(5, json.dumps({"text": "word " * 300, "label": "ham"}))  # about 1.5 KB
    path.write_text("\n".join(lines) + "\n")
    sets = [a for s in TINY for a in ("--set", s)]
    assert run_cli("--file", str(path), *sets, "--set", "worker.max_record_bytes=1000",
                   "--report", str(tmp_path / "r.json")) == 0
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["records"] == 21 and report["bad_records"]["reasons"] == {"too-large": 1}
    assert report["bad_records"]["examples"][0]["where"] == "big.jsonl:6"


def _raising(exc: BaseException):
    def run(args):
        raise exc
    return run


def _chained(outer: type[BaseException], how: str) -> BaseException:
    """``outer`` raised while a KeyboardInterrupt was handled (``context``) or from it (``cause``)."""
    try:
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt as ki:
            if how == "cause":
                raise outer("CPUDispatcher(<function classify_step>) returned a result with an exception set") from ki
            raise outer("during the interrupt")  # noqa: B904 (the implicit __context__ is the case)
    except BaseException as exc:
        return exc


@pytest.mark.parametrize("outer, how", [(SystemError, "cause"), (SystemError, "context"),
                                        (RuntimeError, "context"), (DatasetError, "cause")])
def test_ctrl_c_inside_numba_exits_130_without_a_traceback(monkeypatch, capsys, outer, how):
    """Ctrl-C in a numba kernel surfaces as a SystemError caused by the KeyboardInterrupt
    (was: that traceback, exit 1)."""
    import streamlearn.cli.replay as cli_replay

    monkeypatch.setattr(cli_replay, "run", _raising(_chained(outer, how)))
    assert main(["replay", "--file", "x"]) == 130
    assert capsys.readouterr().err == ""
    monkeypatch.setattr(cli_replay, "run", _raising(SystemError("no interrupt in its chain")))
    with pytest.raises(SystemError):  # another error is not taken for an interrupt
        main(["replay", "--file", "x"])


def test_the_report_is_written_when_stdouts_reader_has_gone(tmp_path):
    """``replay ... --report r.json | head -1`` (was: with PYTHONUNBUFFERED=1 the summary's
    BrokenPipeError stopped the run before the report and plot were written)."""
    import os
    import subprocess
    import sys

    data = write_jsonl(tmp_path / "s.jsonl", words_stream(40))
    report, plot = tmp_path / "r.json", tmp_path / "r.png"
    sets = [a for s in TINY for a in ("--set", s)]
    cmd = [sys.executable, "-m", "streamlearn.cli", "replay", "--no-progress", "--file", data, *sets,
           "--report", str(report), "--plot", str(plot)]
    read, write = os.pipe()
    os.close(read)  # the reader has gone before anything is printed, as head's after its line
    try:
        proc = subprocess.run(cmd, stdout=write, stderr=subprocess.PIPE, text=True, timeout=240,
                              env={**os.environ, "PYTHONUNBUFFERED": "1"})
    finally:
        os.close(write)
    assert proc.returncode == 141 and "Traceback" not in proc.stderr, proc.stderr
    assert json.loads(report.read_text())["records"] == 40 and plot.stat().st_size > 0


def test_records_cut_to_max_tokens_are_counted_in_the_summary_and_report(tmp_path, capsys):
    """Was: the learner counted them (StepReport.truncated), replay showed them nowhere."""
    records = words_stream(30)
    for r in records[::3]:  # 10 records of 3 + 12 words, over hashing.max_tokens=8
        r["text"] += " and then some more words than the model reads at once here"
    data, out = write_jsonl(tmp_path / "long.jsonl", records), tmp_path / "r.json"
    sets = [a for s in [*TINY, "hashing.max_tokens=8"] for a in ("--set", s)]
    assert main(["replay", "--no-progress", "--file", data, *sets, "--report", str(out)]) == 0
    assert "  10 records cut to hashing.max_tokens=8 tokens" in capsys.readouterr().out.splitlines()
    report = json.loads(out.read_text())
    assert report["truncated_records"] == 10 and report["models"]["model"]["truncated_records"] == 10
    assert main(["replay", "--no-progress", "--file", data, *sets[:-2], "--report", str(out)]) == 0
    assert "cut to" not in capsys.readouterr().out and json.loads(out.read_text())["truncated_records"] == 0


def test_a_table_without_a_label_column_is_refused_for_classify_and_stars_is_a_label(tmp_path, capsys):
    """Was: a CSV whose label column had a name the reader did not know ("stars") ran as
    classify with every row a bad record ("0 scored, N bad (missing-field)"), exit 0."""
    rows = [(f"the food was {'great' if i % 2 else 'awful'} today {i}", str(1 + 4 * (i % 2))) for i in range(40)]
    sets = [a for s in TINY for a in ("--set", s)]
    for name, code in (("stars", 0), ("grade", 2)):
        path = tmp_path / f"{name}.csv"
        path.write_text(f"body,{name}\n" + "".join(f"{text},{label}\n" for text, label in rows))
        capsys.readouterr()
        assert run_cli("--file", str(path), *sets) == code
        out, err = capsys.readouterr()
        if code == 0:
            assert "40 records, 40 scored, 0 bad" in out
        else:
            assert "no label column found" in err and "--label-column" in err and "Traceback" not in err
    assert run_cli("--file", str(tmp_path / "grade.csv"), "--label-column", "grade", *sets) == 0
