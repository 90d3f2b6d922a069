"""The learning tasks: one module per task, one class each, picked once from the config.

A task (:class:`~streamlearn.tasks.base.Task`) owns everything that differs between
tasks: what a record must hold and what a batch of them becomes (its
:class:`~streamlearn.batching.Preparer`), its head, its loss, how the model's states are
read out, how answers are decoded, and what a replay asks and scores. The learner,
the model, the snapshot and replay call it and never ask which task it is.

Adding a task is one new module here and one line in :data:`REGISTRY`
(tests/test_tasks.py checks that every module is registered). This package's
``__init__`` imports nothing heavy: the config reads the task names from it.

>>> sorted(REGISTRY)
['classify', 'mlm', 'next-item']
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..config import Config
    from ..featurize import Featurizer
    from .base import Task

__all__ = ["REGISTRY", "build_task", "task_class"]

# task name -> "module:Class" in this package (imported when first used)
REGISTRY: dict[str, str] = {
    "classify": "classify:Classify",
    "mlm": "mlm:MaskedToken",
    "next-item": "next_item:NextItem",
}


def task_class(name: str) -> type["Task"]:
    """The class of task ``name`` (a key of :data:`REGISTRY`)."""
    module, _, cls = REGISTRY[name].partition(":")
    return getattr(importlib.import_module(f"{__name__}.{module}"), cls)


def build_task(cfg: "Config", featurizer: "Featurizer") -> "Task":
    """The task of ``cfg.learner.task``, over the embedding's ``featurizer``."""
    return task_class(cfg.learner.task)(cfg, featurizer)
