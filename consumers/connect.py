"""Kafka clients for the worker, created with retries while the broker is unreachable.

A worker started before its broker (or during an outage) must neither crash nor spin: it
tries, logs the attempt, and waits an exponentially growing delay (capped at
``worker.retry_max_s``) before the next one, until it connects or is asked to stop.

Every client is built with the ``[kafka]`` section's TLS / SASL options (``security``, a
:class:`~streamlearn.config.KafkaConfig`; None: PLAINTEXT). A config that cannot connect
(:class:`~streamlearn.exceptions.ConfigError`) is raised at once, never retried.
"""
from __future__ import annotations

import logging
import socket
import threading
from typing import Any, Callable, TypeVar

from ..broker import client_options, create_topic, topic_partitions
from ..config import KafkaConfig, WorkerConfig
from ..exceptions import ConfigError, StreamlearnError

log = logging.getLogger(__name__)

T = TypeVar("T")
_BOOTSTRAP_TIMEOUT_MS = 5_000
_FETCH_HEADROOM = 64 * 1024  # record-batch framing around a record of max_record_bytes


class Backoff:
    """Delays ``first_s``, doubling, capped at ``cap_s``; :meth:`reset` after a success.

    >>> b = Backoff(cap_s=1.0, first_s=0.25)
    >>> [b.next() for _ in range(4)]
    [0.25, 0.5, 1.0, 1.0]
    """

    def __init__(self, cap_s: float, first_s: float = 0.1):
        self.cap_s, self.first_s = max(cap_s, first_s), first_s
        self._next = first_s

    def next(self) -> float:
        delay = self._next
        self._next = min(self._next * 2, self.cap_s)
        return delay

    def reset(self) -> None:
        self._next = self.first_s


def reachable(bootstrap: str, timeout_s: float = 1.0) -> bool:
    """True if some bootstrap server accepts a TCP connection.

    Checked before building a Kafka client: kafka-python starts an IO thread in each
    client's constructor and leaves it behind when the bootstrap fails, so retrying the
    constructor against a dead broker would pile up threads.
    """
    for server in bootstrap.split(","):
        host, _, port = server.strip().rpartition(":")
        try:
            with socket.create_connection((host or "localhost", int(port)), timeout=timeout_s):
                return True
        except (OSError, ValueError):
            continue
    return False


def retry(what: str, cfg: WorkerConfig, attempt: Callable[[], T], stop: threading.Event) -> T | None:
    """``attempt()`` until it succeeds (its result) or ``stop`` is set (None).

    An unreachable broker and Kafka's retriable errors are retried with backoff and logged;
    other errors propagate, a :class:`ConfigError` first of all (retrying cannot fix it).
    """
    from kafka.errors import KafkaError

    backoff, tries = Backoff(cfg.retry_max_s), 0
    while not stop.is_set():
        tries += 1
        try:
            if not reachable(cfg.bootstrap):
                raise ConnectionRefusedError(f"no server of {cfg.bootstrap} accepts connections")
            return attempt()
        except ConfigError:
            raise
        except (KafkaError, OSError, StreamlearnError) as exc:
            if isinstance(exc, KafkaError) and not getattr(exc, "retriable", True):
                raise
            delay = backoff.next()
            log.warning("%s failed (broker %s, attempt %d: %s); retrying in %.1f s",
                        what, cfg.bootstrap, tries, _short(exc), delay)
            stop.wait(delay)
    return None


def _short(exc: BaseException) -> str:
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return text[:160]


def new_consumer(cfg: WorkerConfig, security: KafkaConfig | None = None) -> Any:
    """A group consumer that never commits on its own and starts where the worker seeks."""
    from kafka import KafkaConsumer

    return KafkaConsumer(
        **client_options(security),
        bootstrap_servers=cfg.bootstrap,
        group_id=cfg.group,
        enable_auto_commit=False,  # Kafka commits are advisory and follow the LMDB commit
        auto_offset_reset="earliest",  # only for a position gone by retention; we always seek
        max_partition_fetch_bytes=max(1 << 20, cfg.max_record_bytes + _FETCH_HEADROOM),
        session_timeout_ms=cfg.session_timeout_ms,
        heartbeat_interval_ms=cfg.heartbeat_interval_ms,
        max_poll_interval_ms=cfg.max_poll_interval_ms,
        reconnect_backoff_max_ms=int(cfg.retry_max_s * 1000),
        bootstrap_timeout_ms=_BOOTSTRAP_TIMEOUT_MS,
    )


def new_producer(cfg: WorkerConfig, security: KafkaConfig | None = None) -> Any:
    """The dead-letter producer: acknowledged by all replicas, retried by the client."""
    from kafka import KafkaProducer

    return KafkaProducer(
        **client_options(security),
        bootstrap_servers=cfg.bootstrap,
        acks="all",
        linger_ms=5,
        max_request_size=cfg.dlq_max_bytes + _FETCH_HEADROOM,
        max_block_ms=1_000,  # a send never stalls the fetch thread long; unsent letters are retried
        reconnect_backoff_max_ms=int(cfg.retry_max_s * 1000),
        bootstrap_timeout_ms=_BOOTSTRAP_TIMEOUT_MS,
    )


def dlq_partitions(cfg: WorkerConfig, topic: str, dlq_topic: str, security: KafkaConfig | None = None) -> int:
    """Create the dead-letter topic (as many partitions as ``topic``) unless it exists;
    return its partition count."""
    partitions = topic_partitions(cfg.bootstrap, topic, security=security)
    return create_topic(cfg.bootstrap, dlq_topic, partitions, security=security)


def close_quietly(close: Callable[[], Any], what: str) -> None:
    """Run ``close()``; a failure is logged, not raised (the state is already committed)."""
    try:
        close()
    except Exception as exc:
        log.warning("closing the %s failed: %s", what, _short(exc))
