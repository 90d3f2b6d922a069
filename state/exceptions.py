"""Errors of the state store. All derive from :class:`StateError`, itself a
:class:`~streamlearn.exceptions.StreamlearnError`; LMDB's own errors are wrapped at the
boundary (``raise ... from exc``) with a message that says what to change.
"""
from __future__ import annotations

from ..exceptions import StreamlearnError


class StateError(StreamlearnError):
    """The state store cannot do what was asked; the message says what to change."""


class NotAStoreError(StateError):
    """The path is missing, or holds something that is not a streamlearn state directory."""


class MapFullError(StateError):
    """The LMDB map is full and ``store.grow_map`` is off (or growing failed)."""


class StorePermissionError(StateError, PermissionError):
    """The operating system refused access to the state directory or its files."""


class DiskFullError(StateError, OSError):
    """The disk (or the file size limit) refused the write; the last checkpoint is intact."""


class StoreBusyError(StateError):
    """Another writer holds the state directory."""


class DamagedStoreError(StateError):
    """The state directory held a model but cannot be trusted as it is: a file cut short,
    a meta record missing, a page or a stored value overwritten. Nothing is reset or
    re-learned silently; the message names the directory, the damage and the way out
    (restore a copy, or start over explicitly with ``reset=True`` / ``--reset``)."""


RECOVER = ("restore the directory from a copy, or start a new model there with "
           "`streamlearn worker --reset` (it moves this state aside)")


def damaged(path: str, problem: str) -> DamagedStoreError:
    """The one-line error for a damaged state directory: where, what, and the way out."""
    return DamagedStoreError(f"state {path} is damaged: {problem}; {RECOVER}")
