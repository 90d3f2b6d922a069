"""Kafka consumer workers (installed as ``streamlearn.consumers``).

A :class:`Worker` joins a consumer group, decodes and validates records, dead-letters the
bad ones, trains a :class:`~streamlearn.learner.Learner` and checkpoints it to the state
store together with the offsets it consumed. ``streamlearn worker`` runs one; see
docs/operations.md for running, stopping, recovering and monitoring it.
"""
from ..checkpoint import read_audit
from .fetcher import FetchPlan
from .worker import RunOptions, RunSummary, Worker, WorkerError

__all__ = ["FetchPlan", "RunOptions", "RunSummary", "Worker", "WorkerError", "read_audit"]
