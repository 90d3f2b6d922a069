"""A stored model opened with a changed config: keys that change what the stored rows
mean are refused, naming each; keys safe between runs are allowed. Every key is in
exactly one of the two sets (config.MODEL_KEYS, config.RUN_KEYS)."""
import dataclasses
import json

import pytest

from streamlearn import checkpoint
from streamlearn.config import MODEL_KEYS, RUN_KEYS, Config, section_classes
from streamlearn.exceptions import CheckpointMismatchError
from streamlearn.learner import Learner
from streamlearn.state import Checkpoint, open_store

SMALL = ("embedding.K=2000", "embedding.B=256", "embedding.d=16", "model.d_model=16", "model.max_labels=8",
         "model.out_B=256", "embedding.tfree_rows=256", "embedding.plain_vocab=64", "learner.nb_cells=8192",
         "store.shards=2")

# A valid value other than SMALL's for every model key (each must be refused on a restart).
CHANGED = {
    "hashing.seed": "5", "hashing.tokenizer": "ids", "hashing.lowercase": "false", "hashing.ngrams": "3", "hashing.shapes": "false",
    "hashing.scripts": "false",
    "hashing.max_tokens": "64", "embedding.scheme": "bloom", "embedding.d": "8", "embedding.K": "3000",
    "embedding.B": "128", "embedding.k": "3", "embedding.m": "3", "embedding.append_p": "true",
    "embedding.combine": "concat", "embedding.init": "paper", "embedding.hashformer_hash": "lsh",
    "embedding.hashformer_bits": "64", "embedding.hashformer_pool_bits": "8", "embedding.tfree_rows": "128",
    "embedding.plain_vocab": "32", "model.layers": "1", "model.d_model": "8", "model.heads": "2",
    "model.ffn": "64", "model.positions": "true", "model.max_labels": "16", "model.out_B": "128",
    "model.out_m": "3", "model.tie_output": "false", "model.output": "tfree", "optim.sparse": "lazy-adam",
    "learner.task": "mlm", "learner.recency": "0", "learner.key_token": "false", "learner.place_weights": "false", "learner.shuffle_random": "0.5", "learner.nb_weight": "0", "learner.nb_cells": "16384", "learner.nb_skip_unseen": "false",
    "store.shards": "4", "model.counts": "kn3", "model.count_slots": "4096",
    "model.recent": "7", "model.successors": "8", "model.count_join": "mixture",
    "model.count_fit": "joint", "model.recent_pairs": "9", "model.input_ngrams": "2",
}
EXTRA = {"learner.shuffle_random": ("model.positions=true",),  # what a changed value needs to be valid
         "model.counts": ("learner.task=next-token", "model.output=sampled"),
         "model.recent": ("learner.task=next-token", "model.output=sampled", "model.counts=kn3"),
         "model.recent_pairs": ("learner.task=next-token", "model.output=sampled", "model.counts=kn3"),
         "model.input_ngrams": ("learner.task=next-token",)}


def all_keys() -> set[str]:
    return {f"{name}.{f.name}" for name, cls in section_classes().items() for f in dataclasses.fields(cls)}


def test_every_key_is_a_model_key_or_a_run_key():
    assert MODEL_KEYS.isdisjoint(RUN_KEYS)
    assert MODEL_KEYS | RUN_KEYS == all_keys(), "classify every new key in config.MODEL_KEYS or RUN_KEYS"
    assert set(CHANGED) == MODEL_KEYS, "give every model key a changed value in CHANGED"


@pytest.fixture(scope="module")
def stored(tmp_path_factory):
    path = tmp_path_factory.mktemp("state")
    cfg = Config().override(*SMALL)
    learner = Learner(cfg)
    learner.learn_many([{"text": "free prize now", "label": "spam"}, {"text": "see you at noon", "label": "ham"}])
    specs, rows, blobs, kv = checkpoint.write(learner, full=True)
    with open_store(path, cfg.store) as store:
        store.declare_tables(specs)
        store.commit(Checkpoint(step=learner.steps, rows=rows, blobs=blobs, kv=kv, config=cfg.to_dict()))
    return path


@pytest.mark.parametrize("dotted", sorted(MODEL_KEYS))
def test_a_changed_model_key_is_refused_naming_it(stored, dotted):
    if dotted == "store.shards":
        pytest.skip("the store itself refuses another shard count before any checkpoint is read")
    changed = Config().override(*SMALL, *EXTRA.get(dotted, ()), f"{dotted}={CHANGED[dotted]}")
    with open_store(stored, readonly=True) as store:
        with pytest.raises(CheckpointMismatchError, match=rf"{dotted}.*--set {dotted}=.*--reset"):
            checkpoint.read_full(store, changed)


@pytest.mark.parametrize("assignment", ["optim.sparse_lr=0.05", "optim.dense_lr=0.01", "learner.batch_size=64",
                                        "model.dropout=0.1", "learner.seed=3", "learner.nb_alpha=0.5",
                                        "worker.checkpoint_every=100", "store.map_size_gb=1"])
def test_a_changed_run_key_opens_the_stored_model(stored, assignment):
    dotted = assignment.partition("=")[0]
    assert dotted in RUN_KEYS
    with open_store(stored, readonly=True) as store:
        learner = checkpoint.read_full(store, Config().override(*SMALL, assignment))
    assert learner.labels == ["spam", "ham"]


def test_a_stored_config_older_than_a_model_key_reads_as_that_version_behaved(tmp_path):
    """A checkpoint written before ``hashing.shapes`` and ``learner.recency`` existed
    trained without digit shapes and recency tokens: it reads so, and a restart at
    today's defaults is refused, naming the keys, instead of applying them to its rows."""
    cfg = Config().override(*SMALL, "hashing.shapes=false", "learner.recency=0")
    learner = Learner(cfg)
    learner.learn_many([{"text": "call 0800 now", "label": "spam"}, {"text": "see you", "label": "ham"}])
    old = cfg.to_dict()
    del old["hashing"]["shapes"], old["learner"]["recency"]
    specs, rows, blobs, kv = checkpoint.write(learner, full=True)
    blobs[checkpoint.CONFIG_BLOB] = json.dumps(old).encode()  # as that version wrote it
    with open_store(tmp_path, cfg.store) as store:
        store.declare_tables(specs)
        store.commit(Checkpoint(step=learner.steps, rows=rows, blobs=blobs, kv=kv, config=old))
    with open_store(tmp_path, readonly=True) as store:
        stored = checkpoint.stored_config(store)
        assert (stored.hashing.shapes, stored.learner.recency) == (False, 0)
        assert checkpoint.read_full(store, cfg).labels == ["spam", "ham"]
        with pytest.raises(CheckpointMismatchError, match=r"hashing.shapes.*--set hashing.shapes=false"):
            checkpoint.read_full(store, Config().override(*SMALL))
