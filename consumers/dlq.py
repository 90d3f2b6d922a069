"""The dead-letter topic ``<topic><worker.dlq_suffix>``: bad records with their reason.

A letter keeps the original message value byte for byte, and says where it came from:

- key: ``b"topic:partition:offset"`` of the source record (unique: readers dedupe on it);
- headers: ``reason`` (``"<code>: <detail>"``, see :mod:`streamlearn.records`),
  ``source`` (the same ``topic:partition:offset``), ``timestamp`` (the source record's
  Kafka timestamp, ms), ``key`` (the source message key, when it had one), and
  ``truncated-from`` (the original size) when the value was cut to fit
  ``worker.dlq_max_bytes`` or the broker's message size limit; the full value stays in
  the source topic at the named offset.
- partition: the source partition (modulo the dead-letter topic's partition count).

Order: within a source partition, letters are written in source-offset order. The fetch
thread sends a chunk's letters sorted by offset (decoding and the learner reject records
at different stages); the producer keeps one request in flight, so its own retries
cannot overtake; and a letter the worker must send again (the broker was down) goes
back to the head of the queue, with every later letter behind it. One exception: a
letter the broker refuses as too large for its own limit (below ``worker.dlq_max_bytes``)
is sent again cut to 64 KiB after the letters behind it; its key and ``source`` header
still give its place.

Delivery is at least once: the worker flushes every letter before it commits a
checkpoint covering the letter's offset, and a crash between the send and that commit
sends the letter again on restart (same key).
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, replace
from typing import Any

log = logging.getLogger(__name__)

_CUT_FALLBACK = 64 * 1024  # value size kept when the broker refuses a letter as too large


@dataclass(frozen=True)
class Letter:
    key: bytes
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...]
    partition: int

    def cut(self, size: int) -> "Letter":
        """This letter with its value cut to ``size`` bytes (original size in a header)."""
        if self.value is None or len(self.value) <= size:
            return self
        headers = tuple(h for h in self.headers if h[0] != "truncated-from")
        original = next((v for k, v in self.headers if k == "truncated-from"), str(len(self.value)).encode())
        return replace(self, value=self.value[:size], headers=headers + (("truncated-from", original),))

    def minimal(self) -> "Letter":
        """The smallest faithful letter, for a broker that refuses this one as too large:
        the value cut to 64 KiB, headers reason, source and truncated-from only."""
        cut = self.cut(_CUT_FALLBACK)
        keep = {"reason", "source", "truncated-from"}
        return replace(cut, headers=tuple(h for h in cut.headers if h[0] in keep))


def source_id(message: Any) -> bytes:
    """``b"topic:partition:offset"`` of a consumed message."""
    return f"{message.topic}:{message.partition}:{message.offset}".encode()


def letter_for(message: Any, reason: str, partitions: int, max_bytes: int) -> Letter:
    """The dead letter of a consumed ``message`` rejected for ``reason``."""
    source = source_id(message)
    headers = [("reason", reason.encode("utf-8", "replace")), ("source", source),
               ("timestamp", str(message.timestamp).encode())]
    if message.key is not None:
        headers.append(("key", bytes(message.key)))
    letter = Letter(source, message.value, tuple(headers), message.partition % max(1, partitions))
    return letter.cut(max_bytes)


class DeadLetters:
    """Sends letters to one dead-letter topic; :meth:`flush` confirms them all.

    ``producer`` is a ``KafkaProducer`` (thread-safe); ``partitions`` the dead-letter
    topic's partition count. A send that fails (broker down, timeout) is kept and sent
    again by the next :meth:`flush`; one the broker refuses as too large is sent again cut
    to 64 KiB. Nothing is dropped.
    """

    def __init__(self, producer: Any, topic: str, partitions: int, max_bytes: int):
        self.producer, self.topic = producer, topic
        self.partitions, self.max_bytes = partitions, max_bytes
        self._unsent: list[Letter] = []
        self._in_flight: list[tuple[Letter, Any]] = []
        self.sent = 0  # letters confirmed by the broker

    @property
    def pending(self) -> int:
        """Letters not yet confirmed."""
        return len(self._unsent) + len(self._in_flight)

    def send(self, message: Any, reason: str) -> None:
        """Dead-letter a consumed ``message`` (asynchronously; see :meth:`flush`). Call it
        in source order: letters are written in the order they are sent."""
        letter = letter_for(message, reason, self.partitions, self.max_bytes)
        if self._unsent:  # an earlier letter waits to be sent again: never overtake it
            self._unsent.append(letter)
        else:
            self._send(letter)

    def _send(self, letter: Letter) -> bool:
        """Hand ``letter`` to the producer (True), or queue it to be sent again (False)."""
        from kafka.errors import KafkaError, MessageSizeTooLargeError

        try:
            future = self.producer.send(self.topic, value=letter.value, key=letter.key,
                                        headers=list(letter.headers), partition=letter.partition)
        except MessageSizeTooLargeError:  # over the producer's max_request_size
            return self._send(letter.minimal())
        except KafkaError as exc:  # e.g. no metadata within max_block_ms: the broker is down
            log.warning("dead letter %s not sent yet (%s); it will be retried", letter.key.decode(), exc)
            self._unsent.append(letter)
            return False
        self._in_flight.append((letter, future))
        return True

    def flush(self, timeout_s: float) -> bool:
        """Send what failed before, wait for every letter; True when all are confirmed."""
        from kafka.errors import KafkaError

        deadline = time.monotonic() + timeout_s
        while self.pending and time.monotonic() < deadline:
            retry, self._unsent = self._unsent, []
            for i, letter in enumerate(retry):
                if not self._send(letter):
                    self._unsent.extend(retry[i + 1:])  # the rest stays behind it, in order
                    break
            try:
                self.producer.flush(timeout=max(0.1, deadline - time.monotonic()))
            except KafkaError as exc:
                log.warning("dead-letter flush: %s", exc)
            self._settle()
            if self._unsent:
                time.sleep(min(0.5, max(0.0, deadline - time.monotonic())))
        return not self.pending

    def _settle(self) -> None:
        """Move confirmed letters out, failed ones back to the head of ``_unsent`` (every
        letter in flight was sent before every unsent one)."""
        from kafka.errors import MessageSizeTooLargeError, RecordListTooLargeError

        waiting, failed = [], []
        for letter, future in self._in_flight:
            if not future.is_done:
                waiting.append((letter, future))
            elif future.succeeded():
                self.sent += 1
            else:
                too_large = isinstance(future.exception, (MessageSizeTooLargeError, RecordListTooLargeError))
                log.warning("dead letter %s failed (%s); sending it again%s", letter.key.decode(),
                            future.exception, " cut to 64 KiB" if too_large else "")
                failed.append(letter.minimal() if too_large else letter)
        self._in_flight = waiting
        self._unsent = failed + self._unsent

    def close(self) -> None:
        """Close the producer; letters still unconfirmed stay unconfirmed (the caller has
        said so). kafka-python's close raises when its flush times out (a broker gone) and
        leaves the producer open, whose ``__del__`` then printed a traceback at exit; a
        second close with no time left marks it closed."""
        from kafka.errors import KafkaError

        try:
            self.producer.close(timeout=2)
        except KafkaError as exc:
            log.warning("closing the dead-letter producer: %s", exc)
            # kafka-python 3.0's close stops at its failed flush: its send thread and
            # unconfirmed batches are left, and __del__ retries the flush at exit
            sender = getattr(self.producer, "_sender", None)
            if sender is not None:
                sender.force_close()
            self.producer._closed = True
