"""Loading the compiled kernels (:mod:`streamlearn.compiled`, :mod:`streamlearn.compiled_text`,
:mod:`streamlearn.compiled_counts`) in a thread, and the parts that use them, built when they are loaded.

A process pays numba's import (0.15 s) and its first call (0.2-0.4 s, whichever kernel;
each further kernel's load 5-13 ms) before a kernel runs. :func:`start_loading` does it
in a thread. This module imports neither numba nor torch, so a program can start that
thread before its own imports, or leave numba out of its start entirely.

Two ways to wait for the thread:

- by default a part that needs a kernel waits for it (:func:`loaded`): every step of a
  replay or a library learner runs the same code from its first record, so its results
  are the same run after run;
- parts built inside :func:`learning_meanwhile` (the worker's learner) run numpy's and
  torch's code until the thread is done, then their kernels (:class:`WhenLoaded`). A
  worker's first records are learned while numba is still loading: its import and first
  call are GIL-bound Python work, about 0.3 s of a worker's start on two cores when they
  run beside torch's import (bench/startup.py). Both codes compute the same step
  (tests/test_compiled.py); the compiled one rounds differently in the last bits, and a
  worker's record order across partitions already depends on fetch timing.
"""
from __future__ import annotations

import atexit
import contextlib
import sys
import threading
from contextvars import ContextVar
from typing import Callable, Generic, Iterator, TypeVar

from .exceptions import StreamlearnError

T = TypeVar("T")

_loading: threading.Thread | None = None
_lock = threading.Lock()
_ready = False  # the thread is done and the kernels are loaded
_failure: list[BaseException] = []  # what the loading thread raised, if it did
_skip_blas_probe = False  # set by in_a_command()
_meanwhile: ContextVar[bool] = ContextVar("streamlearn_compiled_meanwhile", default=False)


def in_a_command() -> None:
    """Say that this process is a streamlearn command's: it runs no numba code of its own,
    so the loading thread skips numba's BLAS probe (:class:`_SkipBlasProbe`)."""
    global _skip_blas_probe
    _skip_blas_probe = True


def start_loading() -> None:
    """Load the kernels in a thread (once per process; about 7 s to compile classify's the
    first time on a machine and as many again for the count part's, then loads from
    numba's cache)."""
    global _loading
    with _lock:
        if _loading is None:
            _loading = threading.Thread(target=_load_or_keep_failure, args=(_skip_blas_probe,),
                                        name="streamlearn-compile", daemon=True)
            _loading.start()
            # a program that exits while the thread is in numba's compiler (it built a
            # learner and stopped) was aborted at shutdown ("terminate called without an
            # active exception", SIGABRT): the interpreter waits for it first
            atexit.register(settle)


def start_loading_for(cfg) -> None:
    """:func:`start_loading` where ``cfg``'s learner will run the kernels (classify with
    ``learner.compiled``): a command calls it before importing torch, so numba's start-up
    overlaps what of torch's releases the GIL."""
    if cfg.learner.compiled and cfg.learner.task == "classify":
        start_loading()


class _SkipBlasProbe:
    """An import finder that refuses ``scipy.linalg`` to the loading thread alone.

    numba's first compile or cache load imports ``numba.np.arraymath``, which imports
    ``scipy.linalg`` (when scipy is installed, as river installs it) only to learn whether
    ``np.dot`` and ``np.linalg`` can be compiled: about 0.25 s of the thread's 0.65 s
    under cProfile, on two cores the command's own imports keep busy. The kernels use
    neither; refused, numba records that it has no BLAS for this process. Other threads
    import scipy.linalg as ever, and so does this one once the probe is done."""

    def __init__(self) -> None:
        self.thread = threading.get_ident()

    def find_spec(self, name, path=None, target=None):
        if name == "scipy.linalg" and threading.get_ident() == self.thread:
            raise ImportError("scipy.linalg: not needed by streamlearn's kernels (streamlearn.compiled)")
        return None


def _load_or_keep_failure(skip_blas_probe: bool) -> None:
    try:
        if skip_blas_probe and "numba.np.arraymath" not in sys.modules and "scipy.linalg" not in sys.modules:
            probe = _SkipBlasProbe()
            sys.meta_path.insert(0, probe)
            try:
                import numba.np.arraymath  # noqa: F401 - its BLAS probe, refused
            finally:
                sys.meta_path.remove(probe)
        from .compiled import load_kernels
        load_kernels()
    except Exception as exc:  # reported by loaded(), in the thread that needs the kernels
        _failure.append(exc)


def loaded() -> None:
    """Wait until :func:`start_loading`'s thread is done (started here if it was not).
    Raises :class:`~streamlearn.exceptions.StreamlearnError` naming the cause and the way
    back to torch's step (``learner.compiled=false``) where the kernels could not be built."""
    global _ready
    if _ready:
        return
    start_loading()
    _loading.join()
    if _failure:
        raise StreamlearnError(f"the compiled kernels (classify's step, the count part's counting) could not be "
                               f"built here ({_failure[0]!r}); set learner.compiled=false to run torch's step and "
                               "numpy's counting instead") from _failure[0]
    _ready = True


def loaded_now() -> bool:
    """Whether the kernels are loaded, without waiting: False while the thread runs (it is
    started here if it was not); raises as :func:`loaded` does where it failed."""
    if not _ready:
        start_loading()
        if _loading.is_alive():
            return False
        loaded()
    return True


def settle() -> None:
    """Wait for the loading thread where one runs, its failure ignored (for a process about
    to exit: the thread is a daemon, and one still in numba's compiler when the interpreter
    shuts down would leave numba's cache unwritten, so every short run on a new machine
    would compile again)."""
    if _loading is not None:
        _loading.join()


@contextlib.contextmanager
def learning_meanwhile() -> Iterator[None]:
    """The :class:`WhenLoaded` parts built inside run their uncompiled code until the kernels
    are loaded, instead of waiting for them; the thread starts at their first use."""
    token = _meanwhile.set(True)
    try:
        yield
    finally:
        _meanwhile.reset(token)


class WhenLoaded(Generic[T]):
    """A part that runs kernels (a compiled step, a text hasher), built by ``build``:
    at once, or, where built inside :func:`learning_meanwhile`, at the first call that
    finds the kernels loaded. Called, it answers the part, or None until it is built (the
    caller runs its uncompiled code then); ``build`` may answer None too (no kernel applies).
    Once built it stays, so a caller goes from its uncompiled code to the kernels once."""

    __slots__ = ("_build", "_waits", "part")

    def __init__(self, build: Callable[[], T | None]):
        self._build: Callable[[], T | None] | None = build
        self._waits = not _meanwhile.get()
        self.part: T | None = None
        if self._waits:
            self()

    def __call__(self) -> T | None:
        build = self._build
        if build is not None and (self._waits or loaded_now()):
            self._build = None  # a second thread calling meanwhile gets None: its uncompiled code
            self.part = build()
        return self.part
