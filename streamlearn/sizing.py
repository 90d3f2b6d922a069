"""Sizes that follow the stream: a distinct-count sketch over a warm-up window.

Some sizes must fit the stream: next-item's hashed output space ``model.out_B`` should
grow with the catalogue, which a user should not have to know. A task lists the keys it
derives (``streamlearn.tasks.Entry.derived``); such a key left at :data:`DERIVE` (0, the
task's default) is derived when a NEW model is built by the worker or replay:

1. the first ``learner.sizing_window`` records (the warm-up window) are read before
   learning starts: replay reads them from its source, the worker from its topic with a
   consumer that commits nothing; both then learn those records as usual, from the start;
2. a :class:`DistinctSketch` (HyperLogLog) counts the distinct ids the task names in them
   (next-item: the items; :meth:`~streamlearn.tasks.base.Task.catalogue_id`);
3. :func:`out_B_for` turns the estimate into a size: the next power of two at or above
   :data:`HEADROOM` x the estimate (a half: with next-item's 4 hashes per item, buckets
   each shared by a few items learn faster than more of them; the rounding up leaves
   0.5-1x the window's items), at least :data:`OUT_B_MIN` and at most :data:`OUT_B_MAX`;
4. the model is built with that value, and the checkpoint stores it in the config
   together with the :class:`Sizing` record (the estimate, the window read).

A stored model is never sized again: a restart whose config leaves the key at 0 takes
the stored value (:func:`streamlearn.checkpoint.read_full`), and one that sets another
value is refused like any change of a model key. A value the user sets on a fresh model
wins and no window is read. A :class:`~streamlearn.learner.Learner` built directly from a
config that still says 0 gets :data:`OUT_B_MIN` (the value derived for MovieLens' 1,682
items); :func:`sized_config` sizes a config from a sample of records instead.

>>> sketch = DistinctSketch()
>>> sketch.add([f"item{i % 1000}" for i in range(5000)])
>>> abs(sketch.estimate() - 1000) < 1000 * 3 * sketch.error
True
>>> out_B_for(1123), out_B_for(4181), out_B_for(6594), out_B_for(0)
(2048, 4096, 4096, 2048)
"""
from __future__ import annotations

import itertools
import math
from dataclasses import asdict, dataclass
from typing import Any, Iterable, Mapping

import numpy as np

from .config import DERIVE, Config
from .exceptions import RecordError
from .hashing import derive_seed, hash64
from .records import Record, from_dict

__all__ = ["DERIVE", "DistinctSketch", "HEADROOM", "OUT_B_MAX", "OUT_B_MIN", "Sizing", "derived_keys",
           "out_B_for", "sized_config"]

# out_B >= HEADROOM x the items seen in the window. With 4 hashes per item (next-item's
# model.out_m) fewer buckets than items won on every stream that moves (bench/shapes.py, seed 0):
# taste-10k (4,181 in its window) 0.0399 / 0.0402 / 0.0380 / 0.0366 at 2048 / 4096 / 8192 /
# 16384, MovieLens (1,100) 0.1621 / 0.1653 / 0.1640 / 0.1616 at 1024 / 2048 / 4096 / 8192,
# taste (2,189) 0.0844 / 0.0883 / 0.0871 at 1024 / 2048 / 4096; the Markov worlds and routes
# level (docs/choosing-a-configuration.md "Fewer buckets than items").
HEADROOM = 0.5
OUT_B_MIN = 2048  # MovieLens-100K's 1,682 items (and a config that says 0 outside the worker and replay)
OUT_B_MAX = 1 << 20  # 64-wide rows: 256 MiB of output weights per hash, plus their optimizer state
RULE = (f"next power of two >= {HEADROOM:g} x the distinct items of the warm-up window, "
        f"in [{OUT_B_MIN}, 2^{OUT_B_MAX.bit_length() - 1}]")
_SKETCH_SEED = derive_seed(0, "sizing/hll")  # fixed: an estimate must not depend on a process or a config


class DistinctSketch:
    """HyperLogLog (Flajolet et al. 2007) over xxh3_64 of the ids: ``2^p`` one-byte
    registers; :meth:`add` is batched in numpy. The relative standard error of
    :meth:`estimate` is :attr:`error` = 1.04 / sqrt(2^p) (p=12: 1.6%); below 2.5 x 2^p
    ids it switches to linear counting, exact to within a few ids there. The same ids
    give the same registers in every process (a fixed xxhash seed, never ``hash()``).
    """

    def __init__(self, p: int = 12):
        if not 4 <= p <= 18:
            raise ValueError(f"DistinctSketch p must be in [4, 18], got {p}")
        self.p = p
        self.registers = np.zeros(1 << p, dtype=np.uint8)

    @property
    def error(self) -> float:
        """The relative standard error of :meth:`estimate`."""
        return 1.04 / math.sqrt(len(self.registers))

    def add(self, ids: Iterable[str]) -> None:
        """Count ``ids`` (strings; a repeated id counts once)."""
        ids = list(ids)
        if not ids:
            return
        h = hash64(ids, _SKETCH_SEED)  # (n,) uint64
        p = np.uint64(self.p)
        bucket = (h >> np.uint64(64 - self.p)).astype(np.int64)
        rest = (h << p) | (np.uint64(1) << (p - np.uint64(1)))  # a guard bit bounds the rank at 65 - p
        rank = (64 - _bit_length(rest) + 1).astype(np.uint8)  # leading zeros + 1
        np.maximum.at(self.registers, bucket, rank)

    def estimate(self) -> float:
        """The estimated number of distinct ids added."""
        m = len(self.registers)
        raw = 0.7213 / (1 + 1.079 / m) * m * m / float(np.sum(np.ldexp(1.0, -self.registers.astype(np.int64))))
        zeros = int(np.count_nonzero(self.registers == 0))
        if raw <= 2.5 * m and zeros:
            return m * math.log(m / zeros)  # linear counting: the small-range correction
        return raw


def _bit_length(x: np.ndarray) -> np.ndarray:
    """Bit length of each uint64 (0 for 0), exact: each 32-bit half fits a float64."""
    hi = (x >> np.uint64(32)).astype(np.float64)
    lo = (x & np.uint64(0xFFFFFFFF)).astype(np.float64)
    return np.where(hi > 0, 32 + np.frexp(hi)[1], np.frexp(lo)[1])


def out_B_for(estimate: float) -> int:
    """The output size for ``estimate`` distinct items (:data:`RULE`)."""
    want = max(1, math.ceil(HEADROOM * estimate))
    return min(OUT_B_MAX, max(OUT_B_MIN, 1 << (want - 1).bit_length()))


@dataclass(frozen=True)
class Sizing:
    """How a model's derived size was chosen (stored with its checkpoint): ``key`` was
    set to ``value`` from ``estimate`` distinct ids in the first ``records`` records of
    the stream (a window of ``window``; fewer where the stream held fewer), by ``rule``."""

    key: str
    value: int
    estimate: float
    records: int
    window: int
    rule: str = RULE

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Sizing":
        return cls(**data)

    def __str__(self) -> str:
        return (f"{self.key}={self.value} derived from ~{self.estimate:,.0f} distinct ids in the first "
                f"{self.records:,} records ({self.rule})")


def derived_keys(cfg: Config) -> tuple[str, ...]:
    """The keys of ``cfg`` left to be derived from the stream (value :data:`DERIVE`)."""
    return ("model.out_B",) if cfg.model.out_B == DERIVE else ()


def sized_config(cfg: Config, records: Iterable[Record | Mapping]) -> tuple[Config, Sizing | None]:
    """``cfg`` with its derived keys set from the first ``learner.sizing_window`` of
    ``records`` (Records or record dicts; records that cannot be decoded are skipped, as
    the learner rejects them), and the :class:`Sizing` that says how; ``(cfg, None)``
    when ``cfg`` derives nothing (an explicit size wins; ``records`` is not read). Takes
    exactly the window (or all, if fewer) from ``records``: an iterator goes on after it."""
    if not derived_keys(cfg):
        return cfg, None
    from .tasks import task_class

    task = task_class(cfg.learner.task)
    window = cfg.learner.sizing_window
    sketch, ids, read = DistinctSketch(), [], 0
    for obj in itertools.islice(records, window):  # never one more: the caller may go on reading
        read += 1
        try:
            rec = obj if isinstance(obj, Record) else from_dict(obj)
        except RecordError:
            continue
        item = task.catalogue_id(rec)
        if item is not None:
            ids.append(item)
    sketch.add(ids)
    estimate = sketch.estimate()
    value = out_B_for(estimate)
    return cfg.override(f"model.out_B={value}"), Sizing("model.out_B", value, round(estimate, 1), read, window)
