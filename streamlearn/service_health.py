"""Can the service still read its state? :class:`StateWatch` says, before each snapshot
call and at ``/healthz``.

A snapshot keeps answering from the LMDB file it mapped even after the state directory
was deleted or replaced: an open file outlives its name, so a deleted directory would be
served from forever, with ``/healthz`` saying "ok". The watch therefore checks, before each
snapshot call, that ``DIR/data.mdb`` is still the file the service opened (same device
and inode) and is as long as its last commit needs (a mapped file cut short would kill
the process on its next read), and remembers whether the last snapshot call could read the store. Every
failure becomes a :class:`StateUnavailableError` (HTTP 503) whose message says what is
wrong and what to do.
"""
from __future__ import annotations

import os
from typing import Any, Callable, TypeVar

import lmdb

from .decoding import DecodingError
from .exceptions import RecordError, StreamlearnError
from .snapshot import TaskMismatchError
from .state import StateError, check_readable, data_file_identity

__all__ = ["StateUnavailableError", "StateWatch"]

DATA_FILE = "data.mdb"  # LMDB's data file in a state directory (subdir=True)
REQUEST_ERRORS = (RecordError, DecodingError, TaskMismatchError)  # the query's fault, not the state's

T = TypeVar("T")


class StateUnavailableError(StreamlearnError):
    """The state directory cannot be read (any more); the message says what to do."""


class StateWatch:
    """The state directory ``path`` of one snapshot: :meth:`guard` (a query) and
    :meth:`probe` (a refresh) run a snapshot call after checking the directory, and
    record whether the store could be read; :meth:`problem` is what ``/healthz``
    reports (None while all is well).

    Thread-safe in the way the service uses it: calls run on one worker thread, and
    ``problem`` only reads a reference that call replaces whole.
    """

    def __init__(self, path: str):
        self.path = os.path.abspath(path)
        self._file = os.path.join(self.path, DATA_FILE)
        self._identity = data_file_identity(self.path)
        self._failure: tuple[str, bool] | None = None  # (message, raised by a query)

    def check(self) -> None:
        """Raise :class:`StateUnavailableError` if ``DIR/data.mdb`` is gone or is another
        file than the one opened, or was cut short. Microseconds (a ``stat``, two small reads)."""
        try:
            now = data_file_identity(self.path)
        except FileNotFoundError:
            raise StateUnavailableError(
                f"the state directory {self.path} (or its {DATA_FILE}) was deleted after the service "
                "opened it: answers would come from a file no worker writes; restore the directory "
                "and restart streamlearn serve"
            ) from None
        except OSError as exc:
            raise StateUnavailableError(
                f"cannot stat {self._file}: {exc}; give the service's user access to the state "
                "directory and restart streamlearn serve"
            ) from exc
        if now != self._identity:
            raise StateUnavailableError(
                f"{self._file} was replaced after the service opened it (another store was created "
                f"in {self.path}): restart streamlearn serve to answer from the new one"
            )
        try:
            check_readable(self.path)  # a mapped file cut short kills the process on its next read
        except StateError as exc:
            raise StateUnavailableError(
                f"{exc}; the service stopped reading it: restore the state directory (docs/state.md) "
                "and restart streamlearn serve"
            ) from exc

    def guard(self, call: Callable[..., T], *args: Any) -> T:
        """A query: ``call(*args)`` after :meth:`check`, recording the outcome. An LMDB
        error is re-raised as a :class:`StateUnavailableError`; a query's own error (bad
        record, wrong task) says nothing about the state and leaves the record as it was.
        A successful query clears any failure."""
        return self._run(call, args, query=True)

    def probe(self, call: Callable[..., T], *args: Any) -> T:
        """A refresh (``/healthz``, ``/metrics``): like :meth:`guard`, but its success
        clears only a failure of an earlier probe. Rows that a query could not read stay
        a failure until a query succeeds: a refresh reads the manifest, not those rows."""
        return self._run(call, args, query=False)

    def _run(self, call: Callable[..., T], args: tuple, query: bool) -> T:
        # The directory's own faults are not recorded: problem() checks it again each time,
        # so a directory moved back is healthy at once (was: /healthz kept the query's
        # "deleted" until the next query, which a deployment gated on it never sends).
        self.check()
        try:
            result = call(*args)
        except REQUEST_ERRORS:
            raise
        except StreamlearnError as exc:
            self._failure = (str(exc), query)
            raise
        except lmdb.Error as exc:
            error = StateUnavailableError(
                f"reading {self.path} failed ({type(exc).__name__}: {exc}): the state directory is "
                f"damaged or was changed underneath the service; check it with `streamlearn inspect "
                f"--state {self.path}`, then restart streamlearn serve"
            )
            self._failure = (str(error), query)
            raise error from exc
        if query or (self._failure is not None and not self._failure[1]):
            self._failure = None
        return result

    def problem(self) -> str | None:
        """Why the state cannot be read now (the directory check, then the last snapshot
        call's failure), or None."""
        try:
            self.check()
        except StateUnavailableError as exc:
            return str(exc)
        failure = self._failure
        return None if failure is None else failure[0]
