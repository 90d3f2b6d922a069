"""Kafka clients for the worker, created with retries while the broker is unreachable.

A worker started before its broker (or during an outage) must neither crash nor spin: it
tries, logs the attempt, and waits an exponentially growing delay (capped at
``worker.retry_max_s``) before the next one, until it connects, is asked to stop, or
``worker.connect_timeout_s`` have passed (:class:`StartUp`): then it stops with an error
that says what it reached and what it did not, as ``produce`` and ``replay`` do. Only
start-up has that bound: a worker that loses its broker later retries until it is back.

Every client is built with the ``[kafka]`` section's TLS / SASL options (``security``, a
:class:`~streamlearn.config.KafkaConfig`; None: PLAINTEXT). A config that cannot connect
(:class:`~streamlearn.exceptions.ConfigError`) is raised at once, never retried.
"""
from __future__ import annotations

import logging
import socket
import threading
import time
from typing import Any, Callable, TypeVar

from ..broker import BrokerError, check_tls_answers, client_options, create_topic, topic_partitions
from ..config import KafkaConfig, WorkerConfig
from ..exceptions import ConfigError, StreamlearnError
from .positions import TopicLog

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


class StartUp:
    """The worker's start-up steps, all within one ``worker.connect_timeout_s`` from
    construction. A step is tried until it succeeds: an unreachable broker and Kafka's
    retriable errors are retried with backoff and logged; other errors propagate, a
    :class:`ConfigError` first of all (retrying cannot fix it).

    ``failure`` tells the last failed attempt in an operator's words: whether the broker
    accepted connections, and what failed then. Past the time limit :meth:`step` raises
    :class:`~streamlearn.broker.BrokerError` with it; when ``stop`` is set it returns None
    and the caller reports ``failure``.
    """

    def __init__(self, cfg: WorkerConfig, stop: threading.Event):
        self.cfg, self.stop = cfg, stop
        self.deadline = time.monotonic() + cfg.connect_timeout_s
        self.failure = ""

    def wait_s(self, most: float) -> float:
        """How long one attempt may wait on the broker: ``most``, or what is left of
        start-up when that is shorter (a second at least, so the last attempt can answer)."""
        return min(most, max(1.0, self.deadline - time.monotonic()))

    def step(self, what: str, attempt: Callable[[], T]) -> T | None:
        """``attempt()``'s result, or None if the worker was asked to stop first."""
        from kafka.errors import KafkaError

        backoff, tries = Backoff(self.cfg.retry_max_s), 0
        while not self.stop.is_set():
            tries += 1
            try:
                return self._attempt(what, attempt)
            except ConfigError:
                raise
            except (KafkaError, OSError, StreamlearnError) as exc:
                if isinstance(exc, KafkaError) and not getattr(exc, "retriable", True):
                    raise
                left = self.deadline - time.monotonic()
                if left <= 0:
                    raise self._gave_up() from exc
                delay = min(backoff.next(), left)  # the last attempt comes at the deadline
                log.warning("%s; retrying in %.1f s (attempt %d, giving up %g s after start-up)",
                            self.failure, delay, tries, self.cfg.connect_timeout_s)
                self.stop.wait(delay)
        return None

    def _attempt(self, what: str, attempt: Callable[[], T]) -> T:
        bootstrap = self.cfg.bootstrap
        if not reachable(bootstrap):
            self.failure = f"no server of {bootstrap} accepts connections"
            raise ConnectionRefusedError(self.failure)
        try:
            return attempt()
        except Exception as exc:
            self.failure = f"the broker at {bootstrap} accepts connections, but {what} failed: {_short(exc)}"
            raise

    def _gave_up(self) -> BrokerError:
        waited = f"{self.cfg.connect_timeout_s:g} s"
        if self.failure.startswith("no server"):
            return BrokerError(
                f"cannot reach a Kafka broker within {waited}: {self.failure}. Check --bootstrap and the "
                "[kafka] settings (a broker that wants TLS or SASL looks unreachable), start a local one "
                "with `streamlearn broker`, or wait longer with --connect-timeout")
        return BrokerError(f"gave up after {waited}: {self.failure}. Fix that, or wait longer with --connect-timeout")


def _short(exc: BaseException) -> str:
    """An error's first line; a client library's cut to 160 characters, ours whole (each is
    written to say what to change)."""
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return text if isinstance(exc, StreamlearnError) else text[:160]


def new_consumer(cfg: WorkerConfig, security: KafkaConfig | None = None,
                 wait_s: float = _BOOTSTRAP_TIMEOUT_MS / 1000) -> Any:
    """A group consumer that never commits on its own and starts where the worker seeks
    (``wait_s``: for a TLS listener's answer, :func:`~streamlearn.broker.check_tls_answers`)."""
    from kafka import KafkaConsumer

    check_tls_answers(cfg.bootstrap, wait_s, security)
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
        # a missing topic is an error that names it, never a new empty topic (Tansu
        # creates one anyway on a metadata request: the worker checks counts itself)
        allow_auto_create_topics=False,
    )


def new_producer(cfg: WorkerConfig, security: KafkaConfig | None = None,
                 wait_s: float = _BOOTSTRAP_TIMEOUT_MS / 1000) -> Any:
    """The dead-letter producer: acknowledged by all replicas, retried by the client, one
    request in flight so a retried batch never lands behind a later one (letters stay in
    source order within a partition). ``wait_s`` as for :func:`new_consumer`."""
    from kafka import KafkaProducer

    check_tls_answers(cfg.bootstrap, wait_s, security)
    return KafkaProducer(
        **client_options(security),
        bootstrap_servers=cfg.bootstrap,
        acks="all",
        linger_ms=5,
        max_request_size=cfg.dlq_max_bytes + _FETCH_HEADROOM,
        max_block_ms=1_000,  # a send never stalls the fetch thread long; unsent letters are retried
        max_in_flight_requests_per_connection=1,
        allow_auto_create_topics=False,  # the worker creates the dead-letter topic itself
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


def topic_log(consumer: Any, topic: str, partitions: int, positions: dict[int, int]) -> TopicLog:
    """The first and end offset of each of ``topic``'s ``partitions`` (see
    :mod:`.positions`), asked with ``consumer`` before it is assigned or subscribed.

    A partition whose ``positions`` entry is past the end the broker reports is read at
    that position - 1, and its end taken from the fetch response's high watermark: the
    embedded broker (Tansu 0.6) answers ListOffsets with its last record batch's base
    offset + 1, short by up to a batch, while its fetch responses are exact.
    """
    from kafka import TopicPartition

    tps = [TopicPartition(topic, p) for p in range(partitions)]
    begins = consumer.beginning_offsets(tps, timeout_ms=_BOOTSTRAP_TIMEOUT_MS)
    ends = {tp.partition: o for tp, o in consumer.end_offsets(tps, timeout_ms=_BOOTSTRAP_TIMEOUT_MS).items()}
    suspects = {p: o for p, o in positions.items() if p in ends and o > ends[p]}
    ends.update(fetched_ends(consumer, topic, suspects))
    return TopicLog(topic, {tp.partition: o for tp, o in begins.items()}, ends)


def fetched_ends(consumer: Any, topic: str, at: dict[int, int], timeout_s: float = 2.0) -> dict[int, int]:
    """Partition -> end offset from a fetch response's high watermark, fetching each
    partition of ``at`` from its offset - 1; ``consumer`` is left unassigned."""
    from kafka import TopicPartition

    if not at:
        return {}
    tps = [TopicPartition(topic, p) for p in at]
    consumer.assign(tps)
    try:
        for tp in tps:
            consumer.seek(tp, max(0, at[tp.partition] - 1))
        deadline = time.monotonic() + timeout_s
        while any(consumer.highwater(tp) is None for tp in tps) and time.monotonic() < deadline:
            consumer.poll(timeout_ms=100)  # the records are not wanted, only the high watermarks
        return {tp.partition: consumer.highwater(tp) for tp in tps if consumer.highwater(tp) is not None}
    finally:
        consumer.unsubscribe()
