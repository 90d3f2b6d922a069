"""Whether the offsets a state stores still name records of the topic's log.

The state keeps, per partition, the next offset to consume (and, since it writes one for
every partition of the topic, the partition count). The log can lose what they point
into: a broker restarted without its data (the embedded broker keeps it in memory), a
topic deleted and created again (Tansu creates a missing topic with 4 partitions on any
metadata request). A stored offset past the new log's end would make the consumer wait
there while new records arrive below it: nothing learned, nothing logged, lag 0. So a
worker compares the two before it reads (and its probe again while it runs) and stops
with :class:`OffsetsLostError`, unless ``worker.on_lost_offsets = "restart-from-start"``
says to read the affected partitions again from the log's start.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..exceptions import StreamlearnError
from ..wording import counted

RESTART = "restart-from-start"


class OffsetsLostError(StreamlearnError):
    """The stored offsets do not fit the topic's log: the broker lost records or the
    topic was created again."""


@dataclass(frozen=True)
class TopicLog:
    """What the broker holds of a topic now: per partition, the first offset it still
    has (``begins``) and the offset after its last record (``ends``)."""

    topic: str
    begins: dict[int, int]
    ends: dict[int, int]
    topic_id: str | None = None  # the broker's id of the topic (None: it gives none)

    @property
    def partitions(self) -> int:
        return len(self.ends)


@dataclass(frozen=True)
class Mismatch:
    """How stored offsets differ from the log (see :func:`compare`).

    ``beyond``: partition -> (stored offset, log end) where the stored offset is past the
    end; ``recorded``: the partition count the state recorded (None: it recorded none);
    ``partitions``: the count now; ``recreated``: (stored id, id now) when the topic's id
    changed (it was deleted and created again: the ids say so even where a new log of the
    same width has grown past every stored offset).
    """

    topic: str
    beyond: dict[int, tuple[int, int]]
    recorded: int | None
    partitions: int
    recreated: tuple[str, str] | None = None

    @property
    def count_changed(self) -> bool:
        return self.recorded is not None and self.recorded != self.partitions

    def restart(self) -> list[int]:
        """The partitions ``restart-from-start`` reads again from the log's start.

        A partition past its end, and, when the count changed too (the topic was created
        again), every partition: no stored offset names the same records then. A count
        that only grew, every stored offset within its log, is what adding partitions
        looks like: the known partitions keep their offsets (the new ones start at the
        log's start, as any partition the state has not seen)."""
        if self.recreated or self.count_changed and (self.beyond or self.partitions < (self.recorded or 0)):
            return list(range(self.partitions))
        return sorted(self.beyond)

    def describe(self) -> str:
        """One sentence: what differs, in the topic's words."""
        parts = []
        if self.recreated:
            parts.append("it was deleted and created again (its id was {}, now {})".format(*self.recreated))
        if self.beyond:
            each = ", ".join(f"partition {p} at {stored:,} but the log ends at {end:,}"
                             for p, (stored, end) in sorted(self.beyond.items()))
            parts.append(f"stored offsets are beyond the log's end ({each})")
        if self.count_changed:
            parts.append(f"the topic has {counted(self.partitions, 'partition')}, the state recorded {self.recorded}")
        return f"topic {self.topic!r}: " + "; ".join(parts)

    def error(self, when: str = "") -> OffsetsLostError:
        """The error to stop with; ``when`` tells when it was found (" while the worker ran")."""
        return OffsetsLostError(
            f"{self.describe()}{when}: the broker lost records the state had consumed, or the topic was "
            f"created again, so reading on would skip or mix up records. Refusing to go "
            f"on. To read the affected partitions again from the log's start, restart with "
            f"--on-lost-offsets {RESTART} (worker.on_lost_offsets); to keep this state as it is, "
            f"point the worker at the topic it was trained on")


def recorded_partitions(stored: dict[int, int]) -> int | None:
    """The partition count a state recorded: it writes an offset for every partition of
    the topic, so the highest partition + 1 (None: nothing stored yet)."""
    return max(stored) + 1 if stored else None


def compare(stored: dict[int, int], log: TopicLog, stored_id: str | None = None) -> Mismatch | None:
    """None when every stored offset is within its partition's log, the partition count
    is the one the state recorded and the topic's id the one it stored (``stored_id``;
    None: not known); else what differs.

    >>> log = TopicLog("t", begins={0: 0, 1: 0}, ends={0: 10, 1: 4})
    >>> compare({0: 10, 1: 3}, log) is None
    True
    >>> compare({0: 12, 1: 3}, log).describe()
    "topic 't': stored offsets are beyond the log's end (partition 0 at 12 but the log ends at 10)"
    >>> compare({0: 5, 1: 3, 2: 0}, log).restart()
    [0, 1]
    >>> again = TopicLog("t", begins={0: 0, 1: 0}, ends={0: 10, 1: 4}, topic_id="b2")
    >>> compare({0: 10, 1: 3}, again, stored_id="a1").restart()
    [0, 1]
    """
    beyond = {p: (offset, log.ends[p]) for p, offset in stored.items()
              if p in log.ends and offset > log.ends[p]}
    recreated = ((stored_id, log.topic_id) if stored_id and log.topic_id and stored_id != log.topic_id
                 else None)
    mismatch = Mismatch(log.topic, beyond, recorded_partitions(stored), log.partitions, recreated)
    return mismatch if beyond or mismatch.count_changed or recreated else None


def starts(stored: dict[int, int], log: TopicLog, restart: list[int]) -> dict[int, int]:
    """The next offset to read per partition of ``log``: the stored one, else (a partition
    the state has not seen, or one in ``restart``) the log's start; never below the log's
    start (records deleted by retention are gone from Kafka: see :func:`deleted`).

    >>> starts({0: 7, 1: 2, 2: 0}, TopicLog("t", {0: 0, 1: 1, 2: 3}, {0: 9, 1: 2, 2: 5}), restart=[1])
    {0: 7, 1: 1, 2: 3}
    """
    return {p: log.begins[p] if p in restart or p not in stored else max(stored[p], log.begins[p])
            for p in sorted(log.ends)}


def deleted(stored: dict[int, int], log: TopicLog) -> dict[int, tuple[int, int]]:
    """Partition -> (stored offset, log start) where retention deleted records the state
    had not consumed yet.

    >>> deleted({0: 4, 1: 9}, TopicLog("t", {0: 6, 1: 0}, {0: 20, 1: 20}))
    {0: (4, 6)}
    """
    return {p: (offset, log.begins[p]) for p, offset in stored.items()
            if p in log.begins and offset < log.begins[p]}
