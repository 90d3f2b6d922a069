"""The learning tasks: one module per task, one class each, picked once from the config.

A task (:class:`~streamlearn.tasks.base.Task`) owns everything that differs between
tasks: what a record must hold and what a batch of them becomes (its
:class:`~streamlearn.batching.Preparer`), its head, its loss, how the model's states are
read out, how answers are decoded, and what a replay asks and scores. The learner,
the model, the snapshot and replay call it and never ask which task it is.

Adding a task is one new module here and one entry in :data:`REGISTRY`
(tests/test_tasks.py checks that every module is registered). An entry also holds the
task's defaults: the settings that suit the task better than the global defaults, which
the config applies to every key the user did not set (:func:`task_defaults`). This
package's ``__init__`` imports nothing heavy: the config reads it.

>>> sorted(REGISTRY)
['classify', 'mlm', 'next-item', 'next-token']
>>> task_defaults("next-item")[0]
'hashing.tokenizer=ids'
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    from ..config import Config
    from ..featurize import Featurizer
    from .base import Task

__all__ = ["REGISTRY", "Entry", "build_task", "task_class", "task_defaults", "task_derived"]


class Entry(NamedTuple):
    """A task: ``path`` "module:Class" in this package (imported when first used),
    ``defaults``, dotted ``section.key=value`` settings (docs/choosing-a-configuration.md
    says why each), and ``derived``, the size keys that may be 0: derived from the
    stream's warm-up window when a worker or replay builds a new model
    (:mod:`streamlearn.sizing`)."""

    path: str
    defaults: tuple[str, ...] = ()
    derived: tuple[str, ...] = ()


# The global defaults are classify's (the default task): word bigrams and digit shapes, and
# texts of up to 4,096 tokens (about 2,000 words with their bigrams: a bag of words loses what
# a cut drops, and reviews and articles run past 128, docs/choosing-a-configuration.md).
# A token task predicts the tokens themselves, one word each, so it keeps words alone, in
# windows of 128 tokens (its records are cut to 32 words; attention grows with the square).
# Token streams: a sampled softmax over hashed output rows plus the Kneser-Ney count part (each
# task names its order), mini-batches of 8 records, output rows slower than input rows
# (docs/choosing-a-configuration.md)
_TOKEN_STREAM = ("hashing.ngrams=1", "hashing.shapes=false", "hashing.max_tokens=128", "model.positions=true",
                 "model.output=sampled",
                 "model.negatives=128", "optim.output_lr=0.01", "learner.batch_size=8")

REGISTRY: dict[str, Entry] = {
    "classify": Entry("classify:Classify"),
    # depth 0: a layer did not pay (choosing-a-configuration.md); the trigram: its chain reads both sides
    "mlm": Entry("mlm:MaskedToken", (*_TOKEN_STREAM, "model.counts=kn3")),
    # opaque ids, not words; an own output space sized from the stream (out_B=0: streamlearn.sizing), each
    # item in 4 of its buckets (out_m); the transition counts of the last 1 and 2 items, their
    # log-probability added to the network's logits with a learned weight (a product of experts);
    # batches of 64: items new within a batch are unknown until its step, and a catalog that
    # grows or a popularity that shifts pays for that (docs/choosing-a-configuration.md)
    "next-item": Entry("next_item:NextItem", (
        "hashing.tokenizer=ids", "hashing.max_tokens=128", "model.tie_output=false", "model.out_B=0", "model.out_m=4", "embedding.K=100000",
        "embedding.B=20000", "optim.dense_lr=0.01", "learner.batch_size=64", "model.counts=transitions",
        "model.count_slots=262144"), derived=("model.out_B",)),
    # a 4-gram order on the count part's trigram, the last 1,000 (previous token, token) pairs
    # mixed into it; a feed-forward half as wide (recall level on four streams, ~1.06-1.09x the
    # records/s); batches of 16 once the model is warm; Adagrad sums that decay, so frequent rows
    # keep learning (docs/choosing-a-configuration.md)
    "next-token": Entry("next_token:NextToken", (*_TOKEN_STREAM, "optim.row_decay=0.95",
                                                 "model.counts=kn4", "model.recent_pairs=1000",
                                                 "model.layers=1", "model.ffn=128",
                                                 "learner.double_batch_after=250")),
}


def task_class(name: str) -> type["Task"]:
    """The class of task ``name`` (a key of :data:`REGISTRY`)."""
    module, _, cls = REGISTRY[name].path.partition(":")
    return getattr(importlib.import_module(f"{__name__}.{module}"), cls)


def task_defaults(name: str) -> tuple[str, ...]:
    """Task ``name``'s defaults (``()`` for a name that is no task: the config refuses it)."""
    entry = REGISTRY.get(name)
    return entry.defaults if entry is not None else ()


def task_derived(name: str) -> tuple[str, ...]:
    """The keys task ``name`` may derive from the stream (``()`` for a name that is no task)."""
    entry = REGISTRY.get(name)
    return entry.derived if entry is not None else ()


def build_task(cfg: "Config", featurizer: "Featurizer") -> "Task":
    """The task of ``cfg.learner.task``, over the embedding's ``featurizer``."""
    return task_class(cfg.learner.task)(cfg, featurizer)
