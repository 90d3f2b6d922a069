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
