"""The hashed transformer, its heads, the objectives' corruption, the row-wise optimizer."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from streamlearn.batching import Batch
from streamlearn.config import Config, OptimConfig
from streamlearn.device import Device
from streamlearn.embeddings import build_embedding, to_tensors
from streamlearn.exceptions import ConfigError, RecordError
from streamlearn.heads import HashedHead, LabelHead, SampledHead, TFreeHead, multi_hot
from streamlearn.hashing import multi_hash, tfree_hashes
from streamlearn.model import HashedTransformer
from streamlearn.objectives import (
    INTACT, MASK_TOKEN, RANDOM, SHUFFLED, Histories, LabelCapacityError, LabelTable, mlm_mask,
    shuffle_random,
)
from streamlearn.optim import DenseAdamW, RowOptimizer
from streamlearn.outputs import HashedCode, PatternCode, SampledCode, output_code, unique_rows
from streamlearn.featurize import PatternSpace
from streamlearn.tasks import build_task

SMALL = ("embedding.K=500", "embedding.B=64", "embedding.d=16", "embedding.tfree_rows=256",
         "model.d_model=16", "model.heads=2", "model.ffn=32", "model.out_B=64", "model.max_labels=8")
CPU = Device.pick("cpu")


pytestmark = pytest.mark.usefixtures("one_torch_thread")


HASHED_MLM = ("learner.task=mlm", "model.output=auto", "model.counts=none")  # Superbloom's head, not mlm's default


def small(*overrides: str) -> Config:
    return Config().override(*SMALL, *overrides)


def build(*overrides: str) -> tuple[HashedTransformer, object]:
    """A model and its task, as a Learner builds them (the task makes the head)."""
    torch.manual_seed(0)
    cfg = small(*overrides)
    featurizer, embedding = build_embedding(cfg.embedding, cfg.hashing.seed)
    task = build_task(cfg, featurizer)
    return HashedTransformer(cfg, embedding, lambda: task.make_head(cfg.model.d_model, embedding)), task


def feats_of(model, token_lists):
    return to_tensors(model.embedding.featurizer.featurize(token_lists, max_len=16))


def classify(model, feats, n_labels):
    """Label logits of the classify head over the pooled states."""
    return model.head(model.pool(model.encode(feats), feats["mask"]), n_labels)


def read_slots(model, task, feats, slots, rows, cols):
    """The mlm task's readout at (rows[i], cols[i]) with ``slots`` masked."""
    batch = Batch(False, -1, int(feats["mask"].shape[0]), slots=slots.numpy(), rows=rows.numpy(), cols=cols.numpy())
    return task.readout(model, batch, feats, CPU)


# ---------------------------------------------------------------------------- shapes

@pytest.mark.parametrize("layers", [0, 1, 3])
@pytest.mark.parametrize("positions", [False, True])
def test_encode_and_classify_shapes(layers, positions):
    model, _ = build(f"model.layers={layers}", f"model.positions={str(positions).lower()}")
    feats = feats_of(model, [["a", "b", "c"], ["d"], ["e", "f"]])
    assert model.encode(feats).shape == (3, 3, 16)
    assert classify(model, feats, n_labels=5).shape == (3, 5)
    assert model.depth == layers


@pytest.mark.parametrize("layers", [0, 2])
def test_padding_does_not_change_a_sequence_output(layers):
    model = build(f"model.layers={layers}")[0].eval()
    alone = classify(model, feats_of(model, [["a", "b"]]), 4)
    padded = classify(model, feats_of(model, [["a", "b"], ["c", "d", "e", "f", "g"]]), 4)[:1]
    torch.testing.assert_close(alone, padded, rtol=1e-5, atol=1e-6)


def test_depth_zero_is_a_bag_of_embeddings():
    model, _ = build("model.layers=0")  # embedding width == d_model: no projection, no encoder
    feats = feats_of(model, [["x", "y", "y"]])
    bag = model.embedding(feats).sum(1) / 3 ** 0.5  # (1, d): sum over sqrt(n), n = 3
    expected = bag @ model.head.weight[:3].t() + model.head.bias[:3]
    torch.testing.assert_close(classify(model, feats, 3), expected)


def test_depth_zero_mlm_reads_the_pooled_context_outside_the_slots():
    model, task = build("model.layers=0", "learner.task=mlm", "model.positions=false")
    feats = feats_of(model, [["a", "b", "c"], ["d", "e", "f"]])
    slots = torch.tensor([[False, True, False], [True, False, True]])
    rows, cols = torch.tensor([0, 1, 1]), torch.tensor([1, 0, 2])
    e = model.embedding(feats)  # (2, 3, 16)
    expected = torch.stack([(e[0, 0] + e[0, 2]) / 2 ** 0.5, e[1, 1], e[1, 1]])
    torch.testing.assert_close(read_slots(model, task, feats, slots, rows, cols), expected)


def test_with_layers_mlm_reads_the_final_state_at_the_slot():
    model, task = build("model.layers=1", "learner.task=mlm")
    model.eval()
    feats = feats_of(model, [["a", "b", "c"]])
    slots = torch.tensor([[False, True, False]])
    h = model.encode(feats, slots)
    out = read_slots(model, task, feats, slots, torch.tensor([0]), torch.tensor([1]))
    torch.testing.assert_close(out, h[0, 1:2])


@pytest.mark.parametrize("layers", [1, 2])
def test_query_readout_equals_the_training_readout_on_padded_batches(layers):
    # Queries run in eval + inference mode, where torch may take its fused encoder fast
    # path; its padding handling must give the slot the state training computes, or
    # prequential recall (bench/depth.py) measures a different model than the one learned.
    model, task = build(f"model.layers={layers}", "learner.task=mlm", "embedding.scheme=bloom")
    feats = feats_of(model, [["a", "b", "c", "d", "e"], ["f", "g"], ["h"]])
    slots = torch.zeros_like(feats["mask"])
    rows, cols = torch.tensor([0, 1, 2]), torch.tensor([4, 0, 0])
    slots[rows, cols] = True
    trained = read_slots(model.train(), task, feats, slots, rows, cols)
    with torch.inference_mode():
        queried = read_slots(model.eval(), task, feats, slots, rows, cols)
    torch.testing.assert_close(queried, trained, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(trained[0], trained[1])  # the slots read their own context


@pytest.mark.parametrize("layers", [1, 2])
def test_causal_states_and_gradients_are_those_with_the_padding_mask(layers):
    # Padding follows each record's tokens, so under the causal mask no token attends to it
    # and the causal encoder passes no padding mask (torch's fused causal kernel): every
    # token's state must be the floats torch's own layers give with the padding mask, and
    # every gradient those floats' to rounding (the encoder's functional ops keep the batch
    # first where torch's module goes sequence first, so the weight gradients sum the
    # same products in another order).
    model, _ = build(f"model.layers={layers}", "model.positions=true")
    feats = feats_of(model, [list("abcdefghij"), ["k", "l", "m"], ["n"]])
    mask = feats["mask"]
    enc = model.encoder
    T = mask.shape[1]
    future = torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1)
    weights = torch.randn(int(mask.sum()), 16, generator=torch.Generator().manual_seed(1))

    def run(encode):
        model.zero_grad()
        states = encode(model.embedding(feats))[mask]
        (states * weights).sum().backward()
        return states.detach(), [p.grad.to_dense() for p in model.parameters() if p.grad is not None]

    def with_padding_mask(x):
        h = enc.proj(x) + enc.pos.weight[:T]
        return enc.layers(h, mask=future, src_key_padding_mask=~mask, is_causal=True)

    states, grads = run(lambda x: enc(x, mask, causal=True))
    want_states, want_grads = run(with_padding_mask)
    assert torch.equal(states, want_states)
    assert len(grads) == len(want_grads)
    for g, w in zip(grads, want_grads):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6)
    assert not torch.equal(states, run(lambda x: enc(x, mask))[0])  # the mask is causal: the states differ


@pytest.mark.parametrize("dropout", [0.0, 0.25])
@pytest.mark.parametrize("causal", [False, True], ids=["padding-mask", "causal"])
def test_the_encoders_functional_layers_are_torchs_own_layers(causal, dropout):
    """The encoder runs torch's pre-LN TransformerEncoderLayer over the layers' own weights
    in functional ops (model._pre_ln_layer): training states bit for bit torch's module
    path's, a record without tokens included; with dropout, eval states alike to rounding
    (torch's module takes its fused inference kernel there), and training draws masks."""
    torch.manual_seed(0)
    model, _ = build("model.layers=2", "model.positions=true", f"model.dropout={dropout}")
    enc = model.encoder
    with torch.no_grad():
        for w in enc.parameters():  # no two norms alike, as after training
            w.add_(torch.randn_like(w) * 0.1)
    x = torch.randn(3, 10, model.embedding.out_dim)
    mask = torch.ones(3, 10, dtype=torch.bool)
    mask[1, 6:], mask[2, :] = False, False
    future = torch.triu(torch.ones(10, 10, dtype=torch.bool), diagonal=1)

    def torchs(x):
        h = enc.proj(x) + enc.pos.weight[:10]
        if causal:
            return enc.layers(h, mask=future, is_causal=True)
        pad = ~mask
        pad[:, 0] = False
        return enc.layers(h, src_key_padding_mask=pad)

    if dropout == 0:
        states = enc.train()(x, mask, causal=causal)
        assert torch.isfinite(states).all()  # the record without tokens too
        assert torch.equal(states[mask], torchs(x)[mask])
    else:
        torch.manual_seed(1)
        a = enc.train()(x, mask, causal=causal)
        assert not torch.equal(a, enc(x, mask, causal=causal))  # another draw
    with torch.no_grad():
        torch.testing.assert_close(enc.eval()(x, mask, causal=causal)[mask], torchs(x)[mask], rtol=1e-5, atol=1e-5)


def test_positions_make_order_matter_and_sets_do_not():
    torch.manual_seed(0)
    for positions, differs in ((False, False), (True, True)):
        model = build("model.layers=1", f"model.positions={str(positions).lower()}")[0].eval()
        model.head.weight.data.normal_()
        ab = classify(model, feats_of(model, [["a", "b"]]), 4)
        ba = classify(model, feats_of(model, [["b", "a"]]), 4)
        assert (not torch.allclose(ab, ba, atol=1e-6)) == differs


def test_empty_row_gives_finite_output_at_depth():
    model = build("model.layers=2")[0].eval()
    out = classify(model, feats_of(model, [["a"], []]), 3)
    assert torch.isfinite(out).all()


# ---------------------------------------------------------------------------- heads

def test_label_head_reads_only_seen_labels_and_unseen_rows_get_no_gradient():
    head = LabelHead(4, max_labels=6)
    x = torch.randn(5, 4)
    logits = head(x, n_labels=2)
    assert logits.shape == (5, 2)
    F.cross_entropy(logits, torch.tensor([0, 1, 1, 0, 1])).backward()
    assert head.weight.grad[2:].abs().sum() == 0 and head.bias.grad[2:].abs().sum() == 0
    assert head.weight.grad[:2].abs().sum() > 0


def test_hashed_head_loss_is_sum_over_hashes_of_cross_entropy():
    code = HashedCode(2, 5, lambda tokens: multi_hash(tokens, 2, 5, 0, "out"))
    torch.manual_seed(0)
    head = HashedHead(4, code, width=3)
    x = torch.randn(3, 4)
    logits = head(x)
    assert logits.shape == (3, 2, 5)
    targets = torch.tensor([[0, 4], [1, 1], [3, 2]])
    w = torch.tensor([1.0, 2.0, 0.5])
    by_hand = sum(
        w[i] * sum(-torch.log_softmax(logits[i, j], -1)[targets[i, j]] for j in range(2)) for i in range(3)
    ) / 3
    torch.testing.assert_close(head.loss(logits, {"hashes": targets}, w), by_hand)


def _head_grads(head: HashedHead, x: torch.Tensor, targets: torch.Tensor, w: torch.Tensor, fit: bool,
                tied: torch.Tensor | None = None) -> list[torch.Tensor]:
    params = [x, *head.parameters(), *([tied] if tied is not None else [])]
    for p in params:
        p.grad = None
    if fit:
        loss = head.fit_loss(x, {"hashes": targets}, w, tied)
    else:  # autograd through cross_entropy of the whole (n, m, size) logits
        loss = head.loss(head(x, tied), {"hashes": targets}, w)
    loss.backward()
    return [loss.detach(), *(p.grad.clone() for p in params)]


@pytest.mark.parametrize("tie", [False, True])
def test_hashed_head_fit_loss_equals_the_loss_of_the_logits_with_the_same_gradients(tie):
    """fit_loss reads the answers' log-probabilities through AnswerLogSoftmax, whose
    backward is written by hand: loss and every gradient (the states, the transform, the
    bias, the own or the tied table) equal autograd's through the full logits."""
    code = HashedCode(3, 7, lambda tokens: multi_hash(tokens, 3, 7, 0, "out"), table="E" if tie else None)
    torch.manual_seed(0)
    head = HashedHead(4, code, width=5)
    tied = nn.Parameter(torch.randn(7, 5)) if tie else None
    x = torch.randn(6, 4, requires_grad=True)
    targets = torch.randint(0, 7, (6, 3))
    w = torch.tensor([1.0, 2.0, 0.5, 0.0, 1.0, 3.0])
    for fast, slow in zip(_head_grads(head, x, targets, w, True, tied), _head_grads(head, x, targets, w, False, tied)):
        torch.testing.assert_close(fast, slow)


def test_hashed_head_fit_loss_under_bf16_autocast_runs_and_stays_close():
    """The CUDA path's dtypes (a bf16 product under autocast, float32 softmax), on the CPU."""
    code = HashedCode(2, 64, lambda tokens: multi_hash(tokens, 2, 64, 0, "out"))
    torch.manual_seed(0)
    head = HashedHead(16, code, width=16)
    x = torch.randn(8, 16, requires_grad=True)
    targets, w = torch.randint(0, 64, (8, 2)), torch.ones(8)
    reference = _head_grads(head, x, targets, w, False)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = head.fit_loss(x, {"hashes": targets}, w)
    assert loss.dtype == torch.float32
    for p in [x, *head.parameters()]:
        p.grad = None
    loss.backward()
    assert x.grad.dtype == x.dtype and head.table.grad.dtype == torch.float32
    torch.testing.assert_close(loss.detach(), reference[0], atol=0.05, rtol=0.02)
    torch.testing.assert_close(head.table.grad, reference[2 + [p is head.table for p in head.parameters()].index(True)],
                               atol=0.02, rtol=0.1)


def sampled_code(negatives: int = 4) -> SampledCode:
    return SampledCode(2, 16, lambda tokens: multi_hash(tokens, 2, 16, 0, "out"), negatives)


def test_sampled_head_is_cross_entropy_over_the_candidates_and_reaches_only_their_rows():
    code = sampled_code()
    torch.manual_seed(0)
    head = SampledHead(4, code)
    with torch.no_grad():
        head.O.normal_()
        head.Ob.normal_()
    index = code.new_index()
    index.add([f"t{i}" for i in range(10)])
    targets = code.step_targets(code.targets(["t1", "t2", "t1"]), index, np.random.default_rng(0))
    cands, answer = targets["choices"], targets["answer"]
    assert len(np.unique(cands, axis=0)) == len(cands) <= 2 + code.negatives
    np.testing.assert_array_equal(cands[answer], code.ids(["t1", "t2", "t1"]))
    x, w = torch.randn(3, 4), torch.tensor([1.0, 2.0, 0.5])
    loss = head.fit_loss(x, CPU.tensors(targets), w)
    z = head.transform(x)[:, 0]
    vec = head.O[torch.from_numpy(cands)].sum(1)  # a token's vector: the sum of its rows
    bias = head.Ob[torch.from_numpy(cands)].sum(1)[:, 0]
    logp = torch.log_softmax(z @ vec.t() + bias, -1)
    by_hand = -sum(w[i] * logp[i, answer[i]] for i in range(3)) / 3
    torch.testing.assert_close(loss, by_hand)
    loss.backward()
    grad = head.O.grad.coalesce()
    assert set(grad.indices()[0].tolist()) == set(cands.ravel().tolist())  # sparse: the candidates' rows only


def test_sampled_head_answers_over_every_candidate_exactly():
    code = sampled_code()
    torch.manual_seed(0)
    head = SampledHead(4, code)
    with torch.no_grad():
        head.O.normal_()
    index = code.new_index()
    index.add([f"t{i}" for i in range(10)])
    scores = head(torch.randn(2, 4), None, **CPU.tensors(code.scoring_inputs(index)))
    assert scores.shape == (2, 10)
    torch.testing.assert_close(scores.exp().sum(1), torch.ones(2))
    top = code.decode(scores.detach().numpy(), index, 3, beam=1)
    for row, t in zip(scores.detach().numpy(), top):
        best = np.argsort(-row, kind="stable")[:3]
        assert t.exact and t.tokens == [f"t{i}" for i in best]
    excluded = code.decode(scores.detach().numpy(), index, 3, 1, exclude=[np.array([best[0]]), np.array([], int)])
    assert f"t{best[0]}" not in excluded[0].tokens


def test_sampled_head_tables_are_row_tables_a_query_reads_whole():
    model, task = build("learner.task=next-token", "model.output=sampled", "model.counts=none")
    assert set(model.row_tables()) >= {"O", "Ob"} and task.whole_tables(model) == {"O", "Ob"}
    model, task = build("learner.task=next-token", "model.output=sampled", "model.counts=kn3")
    # hashed slots: read whole; and next-token's pair cache (a query reads every cached pair)
    assert task.whole_tables(model) == {"O", "Ob", "lm.kn3", "lm.kn12", "lm.stats", "lm.pairs"}
    assert not set(model.dense_parameters()) & {"head.O", "head.Ob"}


def test_untied_hasher_matches_the_decoding_index_default():
    from streamlearn.decoding import CandidateIndex
    code = output_code(small("learner.task=mlm", "model.tie_output=false", "hashing.seed=7"), featurizer=None)
    index = CandidateIndex.superbloom(m=2, size=64, seed=7)
    index.add(["a", "b", "c"])
    np.testing.assert_array_equal(code.targets(["a", "b", "c"])["hashes"], index.hashes)
    np.testing.assert_array_equal(code.new_index().ids([]), index.ids([]))


def test_tfree_head_is_multilabel_bce_against_the_trigram_pattern():
    torch.manual_seed(0)
    head = TFreeHead(4, PatternCode(PatternSpace(2, 32, 0), None), width=3)
    x = torch.randn(2, 4)
    logits = head(x)
    ids, offsets = tfree_hashes(["cat", "house"], m=2, v=32, seed=0)
    target = multi_hot(torch.from_numpy(ids), torch.from_numpy(offsets), 32)
    assert target.shape == (2, 32)
    assert set(torch.nonzero(target[0]).flatten().tolist()) == set(ids[offsets[0]:offsets[1]].tolist())
    w = torch.ones(2)
    by_hand = sum(
        -(target[i] * F.logsigmoid(logits[i]) + (1 - target[i]) * F.logsigmoid(-logits[i])).sum() for i in range(2)
    ) / 2
    targets = {"ids": torch.from_numpy(ids), "offsets": torch.from_numpy(offsets)}
    torch.testing.assert_close(head.loss(logits, targets, w), by_hand)


@pytest.mark.parametrize("scheme", ["hash", "bloom", "hashing-trick", "tfree"])
def test_tying_shares_the_input_table(scheme):
    tied, task = build(*HASHED_MLM, f"embedding.scheme={scheme}", "model.tie_output=true")
    table = tied.embedding.row_tables()["E"]
    assert task.code.table == "E" and tied.head.table is None
    assert task.whole_tables(tied) == {"E"}
    assert all(p is not table for p in tied.dense_parameters().values())
    untied, task = build(*HASHED_MLM, f"embedding.scheme={scheme}", "model.tie_output=false")
    assert task.code.table is None and untied.head.table is not None
    assert task.whole_tables(untied) == set()
    # Tied, the output loss reaches the input table through the output matmul.
    x = torch.randn(2, 16)
    tied.head(x, table).sum().backward()
    assert table.grad is not None


def test_tied_output_hashes_are_the_input_hashes():
    model, task = build(*HASHED_MLM, "embedding.scheme=bloom", "embedding.m=3")
    assert task.code.m == 3 and task.code.size == 64
    np.testing.assert_array_equal(task.code.targets(["a", "b"])["hashes"],
                                  model.embedding.featurizer.hash_ids(["a", "b"]))


def test_untiable_scheme_gets_its_own_table():
    model, task = build(*HASHED_MLM, "embedding.scheme=hashformer-pool", "model.tie_output=true")
    assert task.code.table is None and model.head.table is not None
    assert task.code.size == 64 and task.code.m == 2


def test_config_errors_say_what_to_change():
    with pytest.raises(ConfigError, match="model.positions=true"):
        build("learner.shuffle_random=0.5")
    with pytest.raises(ConfigError, match="divisible"):
        build("model.layers=1", "model.heads=3")  # heads only matter with layers
    with pytest.raises(ConfigError, match="model.output"):
        build("model.output=softmax", "learner.task=mlm")


# ---------------------------------------------------------------------------- objectives

def test_mlm_masking_rates_are_15_and_80_10_10():
    rng = np.random.default_rng(1)
    lists = [[f"t{i}_{j}" for j in range(200)] for i in range(100)]  # 20,000 distinct tokens
    m = mlm_mask(lists, rng)
    n = len(m.targets)
    assert abs(n / 20_000 - 0.15) < 0.01
    inputs = [m.token_lists[r][c] for r, c in zip(m.rows, m.cols)]
    masked = np.array([t == MASK_TOKEN for t in inputs])
    kept = np.array([t == orig for t, orig in zip(inputs, m.targets)])
    randomized = ~masked & ~kept
    np.testing.assert_array_equal(masked, m.slots)
    assert abs(masked.mean() - 0.8) < 0.03
    assert abs(kept.mean() - 0.1) < 0.02  # random draws almost never hit the same token here
    assert abs(randomized.mean() - 0.1) < 0.02
    assert all(lists[r][c] == t for r, c, t in zip(m.rows, m.cols, m.targets))
    # Positions not chosen are untouched.
    chosen = set(zip(m.rows.tolist(), m.cols.tolist()))
    assert all(m.token_lists[r][c] == lists[r][c] for r in range(100) for c in range(200) if (r, c) not in chosen)


def test_mlm_masks_at_least_one_token_per_record():
    rng = np.random.default_rng(0)
    m = mlm_mask([["a"], ["b", "c"], ["d", "e", "f"]] * 50, rng)
    assert set(m.rows.tolist()) == set(range(150))


def test_shuffle_random_labels_match_what_changed():
    rng = np.random.default_rng(3)
    lists = [[f"r{i}_{j}" for j in range(100)] for i in range(50)]
    out, labels = shuffle_random(lists, rng)
    flat_in = [t for ts in lists for t in ts]
    flat_out = [t for ts in out for t in ts]
    rows = np.repeat(np.arange(50), 100)
    for t_in, t_out, lab, r in zip(flat_in, flat_out, labels, rows):
        assert (lab == INTACT) == (t_in == t_out)
        if lab == SHUFFLED:
            assert t_out.startswith(f"r{r}_")  # shuffled within its own sequence
    assert abs((labels == SHUFFLED).mean() - 0.1) < 0.02
    assert abs((labels == RANDOM).mean() - 0.1) < 0.02


def test_label_table_grows_in_order_until_capacity():
    t = LabelTable(capacity=3)
    assert [t.add(x) for x in ["b", "a", "b", 1, "a"]] == [0, 1, 0, 2, 1]
    assert t.get(True) is None  # bool and int labels stay apart
    with pytest.raises(LabelCapacityError, match="label-capacity: .*model.max_labels=3"):
        t.add("new")
    assert isinstance(LabelCapacityError("x"), RecordError)
    assert len(t) == 3 and t.add("a") == 1  # a full table still maps known labels


def test_histories_keep_the_last_n_items_in_order():
    h = Histories(2)
    for item in ["a", "b", "c"]:
        h.push("u", item)
    h.push("v", "x")
    assert h.get("u") == ("b", "c") and h.get("v") == ("x",) and h.get("w") == ()
    assert h.take_dirty() == {"u": ("b", "c"), "v": ("x",)}
    assert h.take_dirty() == {}


@pytest.mark.parametrize("m, size", [(1, 7), (2, 50_000), (3, 5), (5, 50_000)])  # (5, 50k): numpy's own path
def test_unique_rows_is_numpys_unique_over_rows(m, size):
    rng = np.random.default_rng(m)
    rows = rng.integers(0, size, (300, m))
    rows[100:150] = rows[:50]  # repeats
    rows[150] = size - 1  # the largest digit in every place
    distinct, inverse = unique_rows(rows, size)
    want, want_inverse = np.unique(rows, axis=0, return_inverse=True)
    assert np.array_equal(distinct, want) and np.array_equal(inverse, want_inverse.reshape(-1))
    assert np.array_equal(distinct[inverse], rows)
    empty, none = unique_rows(rows[:0], size)
    assert empty.shape == (0, m) and none.shape == (0,)


# ---------------------------------------------------------------------------- row optimizer

def _sparse_grad(rows, values, shape):
    return torch.sparse_coo_tensor([rows], values, shape, check_invariants=True)


@pytest.mark.parametrize("rule, fused", [("adagrad", False), ("adagrad", True), ("lazy-adam", False)])
def test_row_optimizer_touches_exactly_the_rows_in_the_batch(rule, fused):
    torch.manual_seed(0)
    W = nn.Parameter(torch.randn(50, 4))
    before = W.detach().clone()
    opt = RowOptimizer({"E": W}, OptimConfig(sparse=rule, sparse_lr=0.1), fused=fused)
    for step_rows in ([3, 7, 3], [7, 20]):
        W.grad = _sparse_grad(step_rows, torch.randn(len(step_rows), 4), (50, 4))
        changed = opt.step()["E"]
        assert changed.tolist() == sorted(set(step_rows))
        opt.zero_grad()
    others = [i for i in range(50) if i not in (3, 7, 20)]
    assert torch.equal(W.detach()[others], before[others])  # bit-identical
    assert not torch.equal(W.detach()[[3, 7, 20]], before[[3, 7, 20]])
    for state in opt.state_tables().values():
        assert state.shape == W.shape and state[others].abs().sum() == 0


@pytest.mark.filterwarnings("ignore:Sparse invariant checks")  # raised inside torch's Adagrad
@pytest.mark.parametrize("rule, fused, reference", [
    ("adagrad", False, lambda p: torch.optim.Adagrad([p], lr=0.1)),
    ("adagrad", True, lambda p: torch.optim.Adagrad([p], lr=0.1)),  # the closed-form steps' fused kernel
    ("lazy-adam", False, lambda p: torch.optim.SparseAdam([p], lr=0.1)),
])
def test_row_optimizer_matches_torch_reference(rule, fused, reference):
    torch.manual_seed(0)
    init = torch.randn(30, 3)
    ours, theirs = nn.Parameter(init.clone()), nn.Parameter(init.clone())
    opt, ref = RowOptimizer({"E": ours}, OptimConfig(sparse=rule, sparse_lr=0.1), fused=fused), reference(theirs)
    assert opt.fused == fused
    for _ in range(4):
        rows = torch.randint(0, 30, (6,)).tolist()
        g = torch.randn(6, 3)
        ours.grad = _sparse_grad(rows, g, (30, 3))
        theirs.grad = _sparse_grad(rows, g.clone(), (30, 3))
        opt.step()
        ref.step()
    torch.testing.assert_close(ours.detach(), theirs.detach())


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "ops"])
def test_row_decay_decays_the_sums_of_the_rows_a_step_touches(fused):
    """optim.row_decay r: G = r G + g^2 on the rows a step touches, then Adagrad's step;
    the other rows and their sums stay as they were. Hand-computed for r = 0.5, lr 0.5."""
    W = nn.Parameter(torch.zeros(4, 2))
    opt = RowOptimizer({"E": W}, OptimConfig(sparse_lr=0.5, row_decay=0.5), fused=fused)
    W.grad = _sparse_grad([1], torch.ones(1, 2), (4, 2))
    opt.step()  # G = 0.5 * 0 + 1 = 1; W -= 0.5 * 1 / 1
    W.grad = _sparse_grad([1, 2], torch.tensor([[2.0, 2.0], [1.0, -1.0]]), (4, 2))
    opt.step()  # row 1: G = 0.5 * 1 + 4 = 4.5; W -= 0.5 * 2 / sqrt(4.5). Row 2: first step
    G = opt.state_tables()["E.sum"]
    torch.testing.assert_close(G, torch.tensor([[0.0, 0.0], [4.5, 4.5], [1.0, 1.0], [0.0, 0.0]]))
    torch.testing.assert_close(W.detach(), torch.tensor([[0.0, 0.0], [-0.5 - 1 / 4.5 ** 0.5] * 2, [-0.5, 0.5],
                                                         [0.0, 0.0]]))
    full = nn.Parameter(torch.zeros(4, 2))  # a gradient reaching every row takes the whole-table path
    whole = RowOptimizer({"E": full}, OptimConfig(sparse_lr=0.5, row_decay=0.5), fused=fused)
    for g in (torch.ones(4, 2), torch.full((4, 2), 2.0)):
        full.grad = g
        whole.step()
    torch.testing.assert_close(whole.state_tables()["E.sum"], torch.full((4, 2), 4.5))
    torch.testing.assert_close(full.detach(), torch.full((4, 2), -0.5 - 1 / 4.5 ** 0.5))


def test_row_decay_is_for_adagrad_and_at_most_one():
    """Lazy Adam's moments decay by their own betas: a row_decay beside it is refused,
    naming the key, as is one outside (0, 1]."""
    with pytest.raises(ConfigError, match=r"optim.row_decay=0.9 decays Adagrad's sums .*'lazy-adam'") as exc:
        Config().override("optim.sparse=lazy-adam", "optim.row_decay=0.9")
    assert exc.value.key == "optim.row_decay"
    for bad in ("0", "1.5"):
        with pytest.raises(ConfigError, match=r"optim.row_decay must be in \(0, 1\]"):
            Config().override(f"optim.row_decay={bad}")
    assert Config().optim.row_decay == 1.0
    assert Config().override("learner.task=next-token").optim.row_decay == 0.95
    assert Config().override("learner.task=mlm").optim.row_decay == 1.0


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "foreach"])
def test_dense_adamw_is_torchs_adamw_bit_for_bit(fused):
    """The dense optimizer against torch.optim.AdamW (the same kernels: fused or foreach)
    over decayed matrices and undecayed biases, one of them sitting out the first steps
    (its step count lags the others', so each tensor's bias correction is its own)."""
    torch.manual_seed(0)
    shapes = [(40, 30), (3,), (5, 2), (200,)]
    inits = [torch.randn(s) for s in shapes]
    ours = [nn.Parameter(t.clone()) for t in inits]
    theirs = [nn.Parameter(t.clone()) for t in inits]
    opt = DenseAdamW(ours, lr=0.01, weight_decay=0.1, fused=fused)
    ref = torch.optim.AdamW([{"params": [theirs[0], theirs[2]], "weight_decay": 0.1},
                             {"params": [theirs[1], theirs[3]], "weight_decay": 0.0}], lr=0.01,
                            **({"fused": True} if fused else {"foreach": True}))
    for step in range(5):
        grads = [torch.randn(s) for s in shapes]
        for i, (a, b, g) in enumerate(zip(ours, theirs, grads)):
            late = i == 2 and step < 2
            a.grad, b.grad = (None, None) if late else (g.clone(), g.clone())
        opt.step()
        ref.step()
    for a, b in zip(ours, theirs):
        assert torch.equal(a.detach(), b.detach())


def test_row_optimizer_dense_gradient_updates_only_rows_it_reaches():
    W = nn.Parameter(torch.ones(5, 2))
    opt = RowOptimizer({"E": W}, OptimConfig(sparse="lazy-adam", sparse_lr=0.1))
    grad = torch.zeros(5, 2)
    grad[1] = 1.0
    grad[4, 0] = -2.0
    W.grad = grad
    assert opt.step()["E"].tolist() == [1, 4]
    assert torch.equal(W.detach()[[0, 2, 3]], torch.ones(3, 2))


def test_row_optimizer_rejects_unknown_rule_and_mismatched_state():
    W = nn.Parameter(torch.zeros(2, 2))
    with pytest.raises(ConfigError, match="optim.sparse"):
        RowOptimizer({"E": W}, OptimConfig(sparse="sgd"))
    opt = RowOptimizer({"E": W}, OptimConfig(sparse="adagrad"))
    with pytest.raises(ConfigError, match="optim.sparse=lazy-adam"):
        opt.load_state_dict({"rule": "lazy-adam", "steps": 3})


@pytest.mark.parametrize("rule", ["adagrad", "lazy-adam"])
def test_row_optimizer_full_table_path_equals_the_row_path(rule):
    torch.manual_seed(0)
    init, grads = torch.randn(7, 3), [torch.randn(6, 3) for _ in range(3)]
    full = nn.Parameter(init[:6].clone())  # every row gets a gradient: the whole-table path
    rows = nn.Parameter(init.clone())  # row 6 never does: the gather/scatter path
    opt_full = RowOptimizer({"E": full}, OptimConfig(sparse=rule, sparse_lr=0.1))
    opt_rows = RowOptimizer({"E": rows}, OptimConfig(sparse=rule, sparse_lr=0.1))
    for g in grads:
        full.grad = g.clone()
        rows.grad = _sparse_grad(list(range(6)), g.clone(), (7, 3))
        assert opt_full.step()["E"].tolist() == opt_rows.step()["E"].tolist() == list(range(6))
    torch.testing.assert_close(full.detach(), rows.detach()[:6])
    assert torch.equal(rows.detach()[6], init[6])
    for name, t in opt_full.state_tables().items():
        torch.testing.assert_close(t, opt_rows.state_tables()[name][:6])
