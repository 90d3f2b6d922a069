"""Explanations: exact contributions add up to the logits the model computes, leave-one-out
contributions equal the score drops a user would measure by deleting a token, importance
weights are the rows of P, and the snapshot, /v1/explain and `inspect --tokens` give the
same answer as the learner restored from the same checkpoint."""
import json
import random
import subprocess
import sys

import numpy as np
import pytest
import torch
from fastapi.testclient import TestClient

from streamlearn.checkpoint import read_full
from streamlearn.config import Config
from streamlearn.exceptions import RecordError
from streamlearn.explain import EXACT, LEAVE_ONE_OUT
from streamlearn.learner import Learner
from streamlearn.service import Settings, create_app
from streamlearn.snapshot import Snapshot
from streamlearn.state import open_store
from test_snapshot import SMALL, commit

pytestmark = pytest.mark.usefixtures("one_torch_thread")

SPAM = ["free prize now", "win cash prize", "claim your free reward", "urgent win now"]
HAM = ["see you at noon", "lunch at the usual place", "call you later", "meeting at noon today"]


def classifier(*overrides: str) -> Learner:
    lrn = Learner(Config().override(*SMALL, *overrides))
    rng = random.Random(0)
    for _ in range(6):
        lrn.learn_many([{"text": rng.choice(SPAM), "label": "spam"} for _ in range(4)]
                       + [{"text": rng.choice(HAM), "label": "ham"} for _ in range(4)])
    return lrn


def token_learner(task: str, *overrides: str) -> Learner:
    lrn = Learner(Config().override(*SMALL, f"learner.task={task}", *overrides))
    if task == "next-item":
        lrn.learn_many([{"key": f"u{i % 5}", "item": f"i{i % 7}"} for i in range(80)])
    else:
        lrn.learn_many([{"text": t} for t in SPAM + HAM] * 3)
    return lrn


def centered_logit(lrn: Learner, record: dict, label) -> float:
    logits = lrn.outputs(lrn.prepare([record], train=False))[0].double()  # (L,)
    return float(logits[lrn.labels.index(label)] - logits.mean())


# ---------------------------------------------------------------------------- exact parts

@pytest.mark.parametrize("nb", ["0.2", "0"])
def test_depth_0_contributions_are_exact_and_add_up_to_the_centered_logit(nb):
    lrn = classifier("model.layers=0", f"learner.nb_weight={nb}")
    query = {"text": "free prize at noon free"}
    e = lrn.explain_many([query])[0]
    # the network's input tokens: the words, then the bigrams (hashing.ngrams=2)
    assert e.tokens == ["free", "prize", "at", "noon", "free", "free prize", "prize at", "at noon", "noon free"]
    if nb != "0":
        assert e.parts["naive_bayes"][5:] == [0.0] * 4  # the Naive Bayes part counts words only
    assert set(e.methods.values()) == {EXACT}
    assert ("naive_bayes" in e.parts) == (nb != "0")
    assert e.score == pytest.approx(centered_logit(lrn, query, e.output), abs=1e-5)
    assert sum(e.contributions) + e.rest == pytest.approx(e.score, abs=1e-5)
    assert e.contributions[0] == pytest.approx(e.contributions[4], abs=1e-6)  # a repeated token counts twice alike
    assert e.contributions[1] > 0 > e.contributions[3]  # "prize" pushes towards spam, "noon" away


def test_an_exact_term_is_what_the_token_adds_to_the_logit():
    """Checked from the outside: at depth 0 with the Naive Bayes part off, a lone token's
    contribution is the logit minus the bias, and beside a second token it is scaled by
    the pool's 1/sqrt(n); the bias (rest) does not move."""
    lrn = classifier("model.layers=0", "learner.nb_weight=0")
    one = lrn.explain_many([{"tokens": ["prize"]}], ["spam"])[0]
    assert one.contributions[0] == pytest.approx(centered_logit(lrn, {"tokens": ["prize"]}, "spam") - one.rest,
                                                 abs=1e-6)
    two = lrn.explain_many([{"tokens": ["prize", "noon"]}], ["spam"])[0]
    assert two.contributions[0] == pytest.approx(one.contributions[0] / np.sqrt(2), abs=1e-6)
    assert two.rest == pytest.approx(one.rest, abs=1e-6)  # the bias: no token changes it


def test_naive_bayes_token_terms_add_up_to_its_scores():
    lrn = classifier()
    nb = lrn.task.nb
    batch = lrn.prepare([{"text": "free prize"}, {"text": "see you at noon now"}], train=False)
    terms, prior = nb.token_terms(batch.nb_tokens, batch.n_labels)  # (N, T, L), (L,)
    np.testing.assert_allclose(terms.sum(1) + prior, nb.scores(batch.nb_tokens, batch.n_labels), rtol=1e-5, atol=1e-4)
    assert (terms[0, 2:] == 0).all()  # padding adds nothing


# ---------------------------------------------------------------------------- leave-one-out

def test_with_layers_the_model_part_is_leave_one_out_and_equals_deleting_the_token():
    lrn = classifier("model.layers=1")
    query = {"tokens": ["free", "prize", "noon"]}
    e = lrn.explain_many([query], ["spam"])[0]
    assert e.methods == {"model": LEAVE_ONE_OUT, "naive_bayes": EXACT}
    assert e.score == pytest.approx(centered_logit(lrn, query, "spam"), abs=1e-5)
    # the model part's drop when "prize" goes, from the task's own logit parts
    parts = lrn.task.logit_parts
    with torch.inference_mode():
        full = parts(lrn.model, lrn.prepare([query], train=False), lrn.dev)["model"][0].double()
        cut = parts(lrn.model, lrn.prepare([{"tokens": ["free", "noon"]}], train=False), lrn.dev)["model"][0].double()
    c = lrn.labels.index("spam")
    assert e.parts["model"][1] == pytest.approx(float((full[c] - full.mean()) - (cut[c] - cut.mean())), abs=1e-5)


@pytest.mark.parametrize("task, overrides", [
    ("mlm", ()), ("next-item", ()), ("next-token", ()),  # each task's defaults (mlm, next-token: with the count part)
    ("next-token", ("model.output=hashed", "model.counts=none")),
    ("next-token", ("model.output=sampled", "model.counts=none")),
    ("mlm", ("model.output=tfree", "model.counts=none")),
])
def test_token_tasks_explain_the_score_top_k_gives_by_leaving_tokens_out(task, overrides):
    lrn = token_learner(task, *overrides)
    tokens = {"mlm": ["free", "[MASK]", "noon"], "next-item": ["i1", "i2", "i3"], "next-token": ["see", "you", "at"]}[task]
    e = lrn.explain_many([{"tokens": tokens}], k=3)[0]
    top = lrn.topk_many([{"tokens": tokens}], k=3)[0]
    assert e.output == top.tokens[0] and e.methods == {"model": LEAVE_ONE_OUT}
    assert e.score == pytest.approx(float(top.scores[0]), abs=1e-4)
    assert [t for t, _ in e.top] == top.tokens
    for i, token in enumerate(tokens):
        if token == "[MASK]":
            assert e.contributions[i] is None  # the slot asked about is never left out
            continue
        rest = tokens[:i] + tokens[i + 1:]
        batch = lrn.prepare([{"tokens": rest}], train=False)
        with torch.inference_mode():
            scores = lrn.task.decodable(lrn.model, batch, lrn.dev)
        dropped = float(lrn.task.code.score_of(scores, e.output, lrn.task.index)[0])
        assert e.contributions[i] == pytest.approx(e.score - dropped, abs=1e-4)


def test_a_next_item_query_with_a_key_keeps_the_key_in_every_variant():
    """Was: the variants dropped the key, so each item's contribution also held the whole
    effect of the key's token (the same constant in every one, 0.07 in a walk-through)."""
    lrn = token_learner("next-item")
    query = {"tokens": ["i1", "i2", "i3"], "key": "u1"}
    e = lrn.explain_many([query], k=3)[0]
    assert e.tokens == query["tokens"] and e.output == lrn.topk_many([query], k=1)[0].tokens[0]

    def score(record) -> float:
        batch = lrn.prepare([record], train=False)
        with torch.inference_mode():
            scores = lrn.task.decodable(lrn.model, batch, lrn.dev)
        return float(lrn.task.code.score_of(scores, e.output, lrn.task.index)[0])

    assert e.score == pytest.approx(score(query), abs=1e-4)
    for i in range(3):
        rest = {"tokens": query["tokens"][:i] + query["tokens"][i + 1:], "key": "u1"}
        assert e.contributions[i] == pytest.approx(e.score - score(rest), abs=1e-4)
    keyless = lrn.explain_many([{"tokens": query["tokens"]}], [e.output])[0]
    assert keyless.score != pytest.approx(e.score, abs=1e-4)  # the key's token counts, in rest


def test_a_mask_among_a_next_token_querys_tokens_is_a_token_and_is_explained():
    lrn = token_learner("next-token")
    e = lrn.explain_many([{"tokens": ["free", "[MASK]", "noon"]}])[0]
    assert e.tokens == ["free", "[MASK]", "noon"] and None not in e.contributions


def test_a_token_not_among_the_candidates_can_be_explained_unless_the_head_scores_candidates_only():
    lrn = token_learner("mlm", "model.output=hashed", "model.counts=none")  # the tied hashed head scores any token
    e = lrn.explain_many([{"tokens": ["free", "[MASK]"]}], ["zebra"])[0]
    assert e.output == "zebra" and e.score is not None and e.score < e.top[0][1]
    sampled = token_learner("next-token")  # the default: sampled, over the stream's candidates
    with pytest.raises(RecordError, match="not a candidate"):
        sampled.explain_many([{"tokens": ["free"]}], ["zebra"])


# ---------------------------------------------------------------------------- importance, outputs

def test_importance_weights_are_the_rows_of_P_the_tokens_pick():
    lrn = classifier()
    e = lrn.explain_many([{"tokens": ["free", "never-seen"]}])[0]
    feats = lrn.featurizer.featurize([["free", "never-seen"]], 128)
    P, d1 = lrn.model.embedding.P.detach().cpu().numpy(), feats["d1"][0]
    np.testing.assert_allclose(e.importance, P[d1], rtol=1e-6)
    assert e.rows == feats["buckets"][0].tolist()
    assert len(e.importance[0]) == lrn.cfg.embedding.k


@pytest.mark.parametrize("task", ["next-token", "mlm"])
def test_token_tasks_give_each_token_its_own_importance_weights(task):
    """next-token reads a query after [BOS], out of the longest query it is a prefix of:
    each token still gets its own rows of P, as a classifier's explanation gives them."""
    lrn = token_learner(task)
    queries = [{"tokens": ["the", "free", "prize"]}, {"tokens": ["the", "free"]}, {"tokens": ["noon"]}]
    P = lrn.model.embedding.P.detach().cpu().numpy()
    for query, e in zip(queries, lrn.explain_many(queries)):
        feats = lrn.featurizer.featurize([query["tokens"]], 128)
        np.testing.assert_allclose(e.importance, P[feats["d1"][0]], rtol=1e-6)
        assert e.rows == feats["buckets"][0].tolist(), query


def test_next_token_explains_the_tokens_of_its_input_only():
    lrn = token_learner("next-token", "hashing.max_tokens=4")  # [BOS] and the prefix's last 3 tokens
    e = lrn.explain_many([{"tokens": ["see", "you", "at", "noon"]}])[0]
    feats = lrn.featurizer.featurize([["you", "at", "noon"]], 128)
    assert e.tokens == ["you", "at", "noon"]  # was: "see" listed too, with no rows and no importance
    assert e.rows == feats["buckets"][0].tolist()


def test_a_scheme_without_importance_weights_says_so():
    lrn = classifier("embedding.scheme=bloom")
    e = lrn.explain_many([{"text": "free prize"}])[0]
    assert e.importance is None and e.rows is None and len(e.contributions) == 3  # "free", "prize", "free prize"


def test_the_output_is_a_label_by_value_or_by_its_string():
    lrn = Learner(Config().override(*SMALL))
    lrn.learn_many([{"text": "a b", "label": 1}, {"text": "c d", "label": "x"}])
    assert lrn.explain_many([{"text": "a"}], ["1"])[0].output == 1  # JSON keys are strings
    with pytest.raises(RecordError, match="not a label"):
        lrn.explain_many([{"text": "a"}], ["nope"])
    with pytest.raises(RecordError, match=r"^bad-value: query 1: output 'nope' is not a label"):  # was: no query named
        lrn.explain_many([{"text": "a"}, {"text": "b"}], ["x", "nope"])


def test_nothing_to_explain_before_any_label():
    e = Learner(Config().override(*SMALL)).explain_many([{"text": "a b"}])[0]
    assert e.output is None and e.score is None and e.contributions == [None] * 3 and e.top == []  # a, b, "a b"


# ---------------------------------------------------------------------------- the ways in

@pytest.fixture(scope="module")
def state(tmp_path_factory):
    path = tmp_path_factory.mktemp("explain") / "state"
    with open_store(path) as store:
        commit(store, classifier(), 1)
    return str(path)


def test_the_snapshot_service_and_cli_agree_with_the_restored_learner(state):
    with open_store(state, readonly=True) as store:
        want = read_full(store).explain_many([{"tokens": ["free", "prize", "noon"]}], k=2)[0]
    with Snapshot.open(state) as snap:
        got = snap.explain([{"tokens": ["free", "prize", "noon"]}], k=2)
    assert got.step == 1 and got.values[0].contributions == pytest.approx(want.contributions)

    client = TestClient(create_app(Settings(state=state)))
    body = client.post("/v1/explain", json={"tokens": ["free", "prize", "noon"], "k": 2}).json()
    assert body["snapshot_step"] == 1 and body["output"] == want.output
    assert body["contributions"] == pytest.approx(want.contributions)
    assert body["top"][0] == {"output": want.top[0][0], "value": pytest.approx(want.top[0][1])}
    batch = client.post("/v1/explain", json={"records": [{"text": "free prize", "output": "ham"}, {"text": "noon"}]})
    given, best = batch.json()["results"]
    assert given["output"] == "ham" and best["output"] == best["top"][0]["output"]

    out = subprocess.run([sys.executable, "-m", "streamlearn.cli", "inspect", "--state", state, "--tokens",
                          "free prize noon", "-k", "2", "--json"], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout)["contributions"] == pytest.approx(want.contributions)
    text = subprocess.run([sys.executable, "-m", "streamlearn.cli", "inspect", "--state", state, "--tokens",
                           "free prize noon"], capture_output=True, text=True, check=True).stdout
    assert "importance p_w" in text and "prize" in text and "exact" in text


def test_a_reader_that_closes_the_pipe_stops_the_command_without_a_traceback(state):
    """Was: ``streamlearn inspect --state DIR | head -1`` ended in a BrokenPipeError traceback."""
    proc = subprocess.Popen([sys.executable, "-m", "streamlearn.cli", "inspect", "--state", state],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()  # before the command (still importing) writes a line
    err = proc.stderr.read().decode()
    assert proc.wait(60) == 141, err
    assert "Traceback" not in err and "Exception ignored" not in err, err


def test_inspect_explains_text_as_the_model_reads_it_and_notes_upper_case_tokens(state):
    with Snapshot.open(state) as snap:
        want = snap.explain([{"text": "FREE Prize noon"}], k=2).values[0]
    cli = [sys.executable, "-m", "streamlearn.cli", "inspect", "--state", state, "-k", "2", "--json"]
    got = json.loads(subprocess.run(cli + ["--text", "FREE Prize noon"], capture_output=True, text=True,
                                    check=True).stdout)
    assert got["tokens"] == want.tokens and got["contributions"] == pytest.approx(want.contributions)
    upper = subprocess.run(cli + ["--tokens", "FREE prize"], capture_output=True, text=True, check=True)
    assert "'FREE'" in upper.stderr and "--text" in upper.stderr
    quiet = subprocess.run(cli + ["--tokens", "free prize"], capture_output=True, text=True, check=True)
    assert quiet.stderr == ""
    both = subprocess.run(cli + ["--tokens", "a", "--text", "a"], capture_output=True, text=True)
    assert both.returncode == 2 and "not both" in both.stderr
    on_cpu = json.loads(subprocess.run(cli + ["--text", "FREE Prize noon", "--device", "cpu"], capture_output=True,
                                       text=True, check=True).stdout)
    assert on_cpu["contributions"] == pytest.approx(want.contributions)
    for flags, says in ((["--text", "a", "--verify"], "run them as two commands"),
                        (["--output", "spam"], "error: --output and -k go with --tokens or --text")):
        refused = subprocess.run(cli + flags, capture_output=True, text=True)  # was: --verify skipped, exit 0
        assert refused.returncode == 2 and says in refused.stderr, refused.stderr
    alone = subprocess.run(cli[:6] + ["--output", "spam"], capture_output=True, text=True)  # was: "--output go with"
    assert alone.returncode == 2 and "error: --output goes with --tokens or --text" in alone.stderr, alone.stderr
    bad = subprocess.run(cli + ["--text", "a", "--device", "gpu"], capture_output=True, text=True)
    assert bad.returncode == 2 and "learner.device must be 'auto', 'cpu', 'cuda' or 'cuda:N', got 'gpu'" in bad.stderr


BLANK = "text is empty or only whitespace"


@pytest.mark.parametrize("body, code, says", [
    ({"text": "a", "tokens": ["b"]}, "invalid-request", "exactly one of"),
    ({"records": [{"text": "a"}], "output": "spam"}, "invalid-request", "its own output"),
    ({"text": "a", "k": 0}, "invalid-request", "k"),
    ({"records": [{"text": "a"}] * 17}, "invalid-request", "records"),
    ({"text": "a", "output": "no-such-label"}, "bad-record", "no-such-label"),
    ({"text": "   "}, "invalid-request", BLANK),
    ({"records": [{"text": "\t\n"}]}, "invalid-request", BLANK),
    ({"text": ""}, "invalid-request", BLANK),
])
def test_bad_explain_requests_are_422_saying_why(state, body, code, says):
    r = TestClient(create_app(Settings(state=state))).post("/v1/explain", json=body)
    assert r.status_code == 422 and r.json()["error"] == code
    assert says in r.text, r.text


def test_next_item_explains_a_history_longer_than_its_input_giving_older_items_no_weights():
    """Was: a 500 (IndexError) for 24 or more items: the input holds the last learner.history."""
    lrn = token_learner("next-item")
    items = [f"i{j % 7}" for j in range(30)]
    e = lrn.explain_many([{"tokens": items}])[0]
    read = lrn.cfg.learner.history
    assert e.tokens == items and all(w is None for w in e.importance[:-read])
    feats = lrn.featurizer.featurize([items[-read:]], 128)
    assert e.rows[-read:] == feats["buckets"][0][:read].tolist()


@pytest.mark.parametrize("task", ["next-token", "next-item"])
def test_a_query_longer_than_the_input_is_answered_from_its_end(task):
    """Was: from its first hashing.max_tokens tokens, so the prefix's end (what comes next
    follows from it) or the newest items of a history were dropped without a word."""
    lrn = token_learner(task, "hashing.max_tokens=16")
    words = ["i1", "i2", "i3", "i4", "i5", "i6"] if task == "next-item" else ["free", "prize", "see", "you", "at"]
    long = [words[j % len(words)] for j in range(40)] + ["noon" if task == "next-token" else "i0"]
    got, end = lrn.topk_many([{"tokens": long}, {"tokens": long[-16:]}], k=5)
    assert got.tokens == end.tokens and got.scores == pytest.approx(end.scores)


def test_an_mlm_query_of_max_tokens_without_a_mask_keeps_its_last_token():
    """Was: a query of exactly hashing.max_tokens tokens and no [MASK] lost its last token
    to the appended mask (the start was kept), so it answered another question."""
    lrn = token_learner("mlm", "hashing.max_tokens=16")
    words = (["see", "you", "at", "noon", "free", "prize", "now"] * 3)[:15] + ["lunch"]
    full, asked = lrn.topk_many([{"tokens": words}, {"tokens": words[1:] + ["[MASK]"]}], k=5)
    assert full.tokens == asked.tokens and full.scores == pytest.approx(asked.scores)
    dropped = lrn.topk_many([{"tokens": words[:15] + ["[MASK]"]}], k=5)[0]
    assert dropped.scores != pytest.approx(full.scores)  # the old answer differs: the test can fail


def test_a_long_next_token_query_is_explained_by_the_tokens_the_model_reads():
    """Was: hashing.max_tokens tokens listed, the first with no rows and no importance:
    the model reads [BOS] and the last max_tokens - 1."""
    lrn = token_learner("next-token", "hashing.max_tokens=16")
    long = [["free", "prize", "see", "you", "at"][j % 5] for j in range(40)]
    e = lrn.explain_many([{"tokens": long}], k=3)[0]
    assert e.tokens == long[-15:] and all(imp is not None for imp in e.importance)


def test_mlm_reads_a_window_around_the_mask_of_a_long_query_and_takes_mask_in_any_case():
    lrn = token_learner("mlm", "hashing.max_tokens=16")
    long = ["see", "you", "at", "noon"] * 10 + ["free", "[MASK]", "now"] + ["lunch", "at", "the", "usual", "place"] * 6
    at = long.index("[MASK]")
    window = long[at - 8:at + 8]
    got, near = lrn.topk_many([{"tokens": long}, {"tokens": window}], k=5)
    assert got.tokens == near.tokens and got.scores == pytest.approx(near.scores)
    upper, lower = lrn.topk_many([{"text": "claim your [MASK] prize"}, {"text": "claim your [mask] prize"}], k=5)
    assert upper.tokens == lower.tokens
    # explicit tokens too: [mask] there is the position to fill, not a word (was: a mask appended at the end)
    listed = lrn.topk_many([{"tokens": ["claim", "your", m, "prize"]} for m in ("[MASK]", "[mask]", "[Mask]")], k=5)
    assert listed[0].tokens == upper.tokens
    assert all(t.tokens == listed[0].tokens and t.scores == pytest.approx(listed[0].scores) for t in listed)


@pytest.mark.parametrize("query", [{"text": "claim your [MASK] prize"}, {"text": "claim your [mask]"}])
def test_a_mask_asked_of_a_next_token_model_says_it_is_for_mlm(query):
    """Was: answered 200 with what follows "[", "mask", "]", another question than the one asked."""
    lrn = token_learner("next-token")
    with pytest.raises(RecordError, match=r"bad-value: \[MASK\] marks a position for an mlm model"):
        lrn.topk_many([query], k=5)
    with pytest.raises(RecordError, match="mlm model"):
        lrn.explain_many([query], k=5)
    assert len(lrn.topk_many([{"text": "claim your mask"}], k=5)[0].tokens) == 5  # the word alone is a word


def test_next_item_lists_k_answers_when_k_is_above_the_default_beam():
    """Was: 125 of k=300 with 300 items known (the beam search stopped at learner.beam)."""
    lrn = Learner(Config().override(*SMALL, "learner.task=next-item", "learner.beam=4"))
    lrn.learn_many([{"key": f"u{i % 5}", "item": f"i{i % 40}"} for i in range(400)])
    top = lrn.topk_many([{"key": "u1"}], k=30)[0]
    assert len(top.tokens) == 30 and len(set(top.tokens)) == 30
