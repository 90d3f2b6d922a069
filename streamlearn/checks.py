"""Contract checks every embedding scheme must pass (in the manner of ``river.checks``).

Each check takes a factory ``make() -> TokenEmbedding`` that builds a fresh module
(with its featurizer, ``module.featurizer``) from one fixed config and seed, and raises
AssertionError when the contract is broken. :func:`yield_checks` lists them; the test suite runs every check over every
scheme, and a new scheme gets the whole suite by being added to that one list.

>>> from streamlearn.config import EmbeddingConfig
>>> from streamlearn.embeddings import build_embedding
>>> make = lambda: build_embedding(EmbeddingConfig(scheme="bloom", d=4, B=64), seed=0)[1]
>>> for check in yield_checks():
...     check(make)
"""
from __future__ import annotations

import copy
import io
import pickle
from typing import Callable, Iterator, Sequence

import numpy as np
import torch

from .embeddings import TokenEmbedding, to_tensors

Factory = Callable[[], TokenEmbedding]

BATCH: list[list] = [
    ["the", "cat", "sat", "on", "the", "mat"],
    ["a"],
    [],
    ["new", "tokens", "every", "minute", "item:42", 42],
]
LATER: list[list] = [["the", "cat", "never", "seen", "before"], ["mat", "zebra"]]
UNSEEN: list[list] = [["", " ", "ünïcode", "🤖", "x" * 300, "\x00", "tab\there", "Ω≈ç√", 9_999_999_999]]
MAX_LEN = 5


def yield_checks() -> Iterator[Callable[[Factory], None]]:
    """Every contract check, in a stable order."""
    yield check_features_follow_the_contract
    yield check_same_seed_same_output
    yield check_input_not_mutated
    yield check_unseen_tokens_work
    yield check_state_dict_round_trip
    yield check_deepcopy_keeps_the_output
    yield check_batch_order_independence
    yield check_padding_is_zero_and_gets_no_gradient
    yield check_rows_touched_equal_sparse_gradients
    yield check_featurizer_is_pure


def embed(emb: TokenEmbedding, token_lists: Sequence[Sequence], max_len: int = MAX_LEN) -> torch.Tensor:
    return emb(to_tensors(emb.featurizer.featurize(token_lists, max_len)))


# ---------------------------------------------------------------------------- checks

def check_features_follow_the_contract(make: Factory) -> None:
    """numpy arrays only; ``mask`` bool (N, T) with T = min(max_len, longest) >= 1;
    ids int64, codes uint8; output (N, T, out_dim)."""
    emb = make()
    feats = emb.featurizer.featurize(BATCH, MAX_LEN)
    assert all(isinstance(a, np.ndarray) for a in feats.values()), "featurize must return numpy only"
    assert feats["mask"].dtype == np.bool_ and feats["mask"].shape == (len(BATCH), MAX_LEN)
    assert feats["mask"].sum(1).tolist() == [min(len(t), MAX_LEN) for t in BATCH]
    assert all(a.dtype in (np.int64, np.uint8) for k, a in feats.items() if k != "mask")
    assert emb.featurizer.featurize([["a"], []], MAX_LEN)["mask"].shape == (2, 1)
    assert emb.featurizer.featurize([[]], MAX_LEN)["mask"].shape == (1, 1)
    assert tuple(embed(emb, BATCH).shape) == (len(BATCH), MAX_LEN, emb.out_dim)


def check_same_seed_same_output(make: Factory) -> None:
    """Two modules from the same config and seed agree exactly, batch after batch."""
    a, b = make(), make()
    for batch in (BATCH, LATER):
        fa, fb = a.featurizer.featurize(batch, MAX_LEN), b.featurizer.featurize(batch, MAX_LEN)
        assert sorted(fa) == sorted(fb) and all(np.array_equal(fa[k], fb[k]) for k in fa)
        assert torch.equal(a(to_tensors(fa)), b(to_tensors(fb)))


def check_input_not_mutated(make: Factory) -> None:
    """featurize leaves the token lists alone; forward leaves the features alone."""
    emb = make()
    batch = copy.deepcopy(BATCH)
    feats = emb.featurizer.featurize(batch, MAX_LEN)
    assert batch == BATCH, "featurize mutated its input"
    tensors = to_tensors(feats)
    before = {k: t.clone() for k, t in tensors.items()}
    emb(tensors).sum().backward()
    assert all(torch.equal(before[k], tensors[k]) for k in before), "forward mutated its features"


def check_unseen_tokens_work(make: Factory) -> None:
    """Any str or int token gets a finite vector; an int equals its decimal string."""
    emb = make()
    out = embed(emb, UNSEEN, max_len=len(UNSEEN[0]))
    assert out.shape == (1, len(UNSEEN[0]), emb.out_dim) and torch.isfinite(out).all()
    as_str = embed(emb, [[str(t) for t in UNSEEN[0]]], max_len=len(UNSEEN[0]))
    assert torch.equal(out, as_str)


def check_state_dict_round_trip(make: Factory) -> None:
    """A fresh module loading a trained module's state_dict (through bytes) computes
    the same outputs, on seen and on new tokens."""
    trained = make()
    embed(trained, BATCH)  # lets stateful schemes (the plain dictionary) grow
    _perturb(trained)
    buffer = io.BytesIO()
    torch.save(trained.state_dict(), buffer)
    buffer.seek(0)
    loaded = make()
    loaded.load_state_dict(torch.load(buffer, weights_only=True))
    # New tokens first, in an order unlike BATCH's: a dictionary that was not restored
    # would number them differently.
    for batch in (LATER[::-1], BATCH):
        assert torch.equal(embed(trained, batch), embed(loaded, batch))


def check_deepcopy_keeps_the_output(make: Factory) -> None:
    """copy.deepcopy (used for snapshots and model averaging) gives an equal module."""
    emb = make()
    embed(emb, BATCH)
    _perturb(emb)
    clone = copy.deepcopy(emb)
    for batch in (BATCH, LATER):
        assert torch.equal(embed(emb, batch), embed(clone, batch))


def check_batch_order_independence(make: Factory) -> None:
    """A record's vectors do not depend on the other records or their order. (The
    batch is featurized once first, so a growing dictionary already holds its tokens.)"""
    emb = make()
    emb.featurizer.featurize(BATCH, MAX_LEN)
    forward = embed(emb, BATCH)
    backward = embed(emb, BATCH[::-1])
    assert torch.allclose(forward, backward.flip(0), atol=1e-6, rtol=0)
    for i, tokens in enumerate(BATCH):
        alone = embed(emb, [tokens])
        assert torch.allclose(forward[i, :alone.shape[1]], alone[0], atol=1e-6, rtol=0)


def check_padding_is_zero_and_gets_no_gradient(make: Factory) -> None:
    """Padding cells are exactly 0, and a padded record gives the same gradients as the
    same record alone (padding adds nothing to any parameter's gradient)."""
    emb = make()
    short, long = ["the", "cat"], ["a", "b", "c", "d", "e"]
    emb.featurizer.featurize([short, long], MAX_LEN)
    padded = embed(emb, [short, long])
    assert torch.count_nonzero(padded[0, len(short):]) == 0, "padding is not zero"
    padded[0].pow(2).sum().backward()
    with_padding = _grads(emb)
    emb.zero_grad(set_to_none=True)
    embed(emb, [short]).pow(2).sum().backward()
    alone = _grads(emb)
    assert with_padding.keys() == alone.keys()
    for name in alone:
        assert torch.allclose(with_padding[name], alone[name], atol=1e-6), f"padding changed grad of {name}"


def check_rows_touched_equal_sparse_gradients(make: Factory) -> None:
    """Row tables get sparse gradients on exactly ``rows_touched``; other parameters
    get dense ones."""
    emb = make()
    feats = emb.featurizer.featurize(BATCH, MAX_LEN)
    emb(to_tensors(feats)).pow(2).sum().backward()
    touched, tables = emb.featurizer.rows_touched(feats), emb.row_tables()
    assert sorted(touched) == sorted(tables), "rows_touched and row_tables name different tables"
    for name, table in tables.items():
        assert table.grad is not None and table.grad.is_sparse, f"{name} has no sparse gradient"
        rows = table.grad.coalesce().indices()[0].numpy()
        assert touched[name].dtype == np.int64 and np.array_equal(rows, touched[name]), name
    row_params = {id(t) for t in tables.values()}
    for name, p in emb.named_parameters():
        if id(p) not in row_params:
            assert p.grad is not None and not p.grad.is_sparse, f"{name} should have a dense gradient"


def check_featurizer_is_pure(make: Factory) -> None:
    """The featurizer holds no torch object and survives pickling (so ingest can run in
    another process) with the same arrays."""
    emb = make()
    emb.featurizer.featurize(BATCH, MAX_LEN)  # a dictionary grows first: pickling must keep it
    held = [k for k, v in vars(emb.featurizer).items() if isinstance(v, (torch.Tensor, torch.nn.Module))]
    assert not held, f"the featurizer holds torch objects: {held}"
    clone = pickle.loads(pickle.dumps(emb.featurizer))
    for batch in (BATCH, LATER):
        a = emb.featurizer.featurize(batch, MAX_LEN, grow=False)
        b = clone.featurize(batch, MAX_LEN, grow=False)
        assert sorted(a) == sorted(b) and all(np.array_equal(a[k], b[k]) for k in a), "pickling changed the features"


# ---------------------------------------------------------------------------- helpers

def _perturb(emb: TokenEmbedding) -> None:
    """Stand-in for training: move every parameter by a seeded random step."""
    g = torch.Generator().manual_seed(1234)
    with torch.no_grad():
        for p in emb.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.01)


def _grads(emb: TokenEmbedding) -> dict[str, torch.Tensor]:
    return {
        name: (p.grad.to_dense() if p.grad.is_sparse else p.grad).clone()
        for name, p in emb.named_parameters() if p.grad is not None
    }
