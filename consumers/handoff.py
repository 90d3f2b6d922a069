"""What the fetch thread hands to the training loop, in order, through one bounded queue.

Queue order is what makes a checkpoint exact. The fetch thread puts a
:class:`CheckpointRequest` after the last batch it prepared and then waits for the answer
without preparing more; the training loop serves the request when it reaches it, that is
when every batch before it is learned and no batch after it exists. At that moment the
learner's state and the offsets of the learned batches describe the same records.
"""
from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Union

from ..learner import Batch


@dataclass
class Prepared:
    """A prepared training batch and the Kafka records it accounts for.

    ``spans``: per partition, ``(first offset, last offset, count)`` of every record the
    batch covers, learned or dead-lettered; ``(o, o - 1, 0)`` covers no record and sets
    the partition's next offset to ``o`` (the fetch thread's start positions). ``dead``: the reason code of each record sent
    to the dead-letter topic instead (their sends precede this item). ``newest_event_ms``:
    the latest event time among the batch's valid records (``ts``, else the Kafka
    timestamp), None if none has one.
    """

    batch: Batch
    spans: dict[int, tuple[int, int, int]]
    dead: list[str] = field(default_factory=list)
    newest_event_ms: int | None = None

    @property
    def records(self) -> int:
        return sum(count for _, _, count in self.spans.values())


@dataclass
class CheckpointRequest:
    """Ask the training loop for a checkpoint of everything handed over before this item.

    The loop fills ``ok``, ``offsets`` (partition -> next offset to consume, as committed)
    and ``seconds``, then sets ``done``.
    """

    reason: str
    done: threading.Event = field(default_factory=threading.Event)
    ok: bool = False
    offsets: dict[int, int] = field(default_factory=dict)
    seconds: float = 0.0

    def answer(self, ok: bool, offsets: dict[int, int], seconds: float) -> None:
        self.ok, self.offsets, self.seconds = ok, dict(offsets), seconds
        self.done.set()


@dataclass
class Finished:
    """The fetch thread's last item: it stopped, normally (``error`` None) or on an error."""

    error: BaseException | None = None
    reason: str = ""


Item = Union[Prepared, CheckpointRequest, Finished]


class Handoff:
    """A bounded FIFO from the fetch thread to the training loop.

    ``depth`` bounds how many prepared batches wait (memory, and how far preparing runs
    ahead). When the training loop stops taking items it calls :meth:`close`, which makes
    every blocked or later :meth:`put` return False instead of waiting forever.
    """

    def __init__(self, depth: int):
        self._queue: queue.Queue[Item] = queue.Queue(max(1, depth))
        self._closed = threading.Event()

    @property
    def closed(self) -> bool:
        return self._closed.is_set()

    def close(self) -> None:
        self._closed.set()

    def put(self, item: Item, slice_s: float = 0.1) -> bool:
        """Block until ``item`` is queued (True) or the handoff is closed (False)."""
        while not self._closed.is_set():
            try:
                self._queue.put(item, timeout=slice_s)
                return True
            except queue.Full:
                continue
        return False

    def get(self, timeout_s: float) -> Item | None:
        try:
            return self._queue.get(timeout=timeout_s)
        except queue.Empty:
            return None

    def wait(self, request: CheckpointRequest, timeout_s: float) -> bool:
        """Wait for ``request`` to be answered; False if the loop closed or time ran out."""
        deadline = time.monotonic() + timeout_s
        while not request.done.wait(0.05):
            if self._closed.is_set() or time.monotonic() > deadline:
                return False
        return True
