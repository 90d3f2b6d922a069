"""The ``streamlearn`` command: one entry point, one module per subcommand.

Each module of this package exposes ``register(subparsers)``, which adds its parser
and sets ``func`` to the function that runs it. Library errors are printed as one line
(what went wrong and what to change) with exit status 2, never as a traceback.
"""
from __future__ import annotations

import argparse
import importlib
import logging
import pkgutil
import sys

from .._version import __version__
from ..exceptions import StreamlearnError


def topic_arg(text: str) -> str:
    """``--topic``'s type: a name Kafka takes (:func:`~streamlearn.broker.topic_problem`),
    refused with argparse's one-line usage error before any client is built."""
    from ..broker import topic_problem

    problem = topic_problem(text)
    if problem:
        raise argparse.ArgumentTypeError(problem)
    return text


def bootstrap_arg(text: str) -> str:
    """``--bootstrap``'s type: ``worker.bootstrap``'s rule (host:port, comma-separated),
    said at once by every command (was: produce and replay waited 10 s on 'nohostport',
    then said they could not reach it)."""
    from ..config import WorkerConfig

    try:
        WorkerConfig(bootstrap=text)
    except StreamlearnError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc
    return text


def command_modules() -> list[str]:
    """Subcommand module names, sorted (``--help`` lists them in this order)."""
    return sorted(m.name for m in pkgutil.iter_modules(__path__) if not m.name.startswith("_"))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="streamlearn",
        description="Train hash-embedding transformers online from Kafka streams; "
        "query live snapshots; replay logs for evaluation.",
    )
    parser.add_argument("--version", action="version", version=f"streamlearn {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in command_modules():
        importlib.import_module(f"{__name__}.{name}").register(sub)
    return parser


# kafka-python loggers that write requests and raw bytes at DEBUG; -v leaves them at INFO.
WIRE_LOGGERS = ("kafka.protocol", "kafka.net", "kafka.conn")


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    # kafka-python logs every failed connection attempt; commands report broker trouble
    # themselves (as errors naming --bootstrap), so its lines only show with -v.
    logging.getLogger("kafka").setLevel(logging.DEBUG if args.verbose else logging.CRITICAL)
    for wire in WIRE_LOGGERS:  # kafka-python's request dumps: a SASL PLAIN login's bytes hold the password
        logging.getLogger(wire).setLevel(logging.INFO if args.verbose else logging.NOTSET)
    if not getattr(args, "func", None):
        parser.print_help()
        return 0
    try:
        code = int(args.func(args) or 0)
        sys.stdout.flush()  # here, so a closed pipe is caught below, not at exit
        return code
    except KeyboardInterrupt:
        return 130
    except StreamlearnError as exc:
        if interrupted(exc):
            return 130
        print(f"streamlearn {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        if not _stdout_closed():
            raise  # another pipe broke: not the reader of our output going away
        # the reader of stdout went away (``streamlearn inspect ... | head``): stop as a
        # shell tool does, without a traceback, and without a second one at exit when
        # Python flushes the dead pipe
        silence_stdout()
        return 141
    except Exception as exc:
        if interrupted(exc):
            return 130
        raise


def interrupted(exc: BaseException) -> bool:
    """Whether a KeyboardInterrupt is in ``exc``'s ``__cause__`` / ``__context__`` chain:
    Ctrl-C inside a numba function surfaces as ``SystemError: CPUDispatcher(...) returned
    a result with an exception set`` caused by it (was: that traceback, exit 1, not 130)."""
    seen: set[int] = set()
    todo: list[BaseException | None] = [exc]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        if isinstance(e, KeyboardInterrupt):
            return True
        seen.add(id(e))
        todo += [e.__cause__, e.__context__]
    return False


def silence_stdout() -> None:
    """Point stdout at /dev/null once its reader has gone: what is still buffered, and
    Python's flush at exit, then write nowhere instead of raising BrokenPipeError again."""
    import os

    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def _stdout_closed() -> bool:
    """Whether stdout is a pipe whose reader has gone (poll says POLLERR)."""
    import select

    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        return any(event & select.POLLERR for _, event in poller.poll(0))
    except (OSError, ValueError, AttributeError):
        return True
