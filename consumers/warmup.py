"""The worker's warm-up window: the topic's first records, read to size a new model.

A new model whose config leaves a size to the stream (next-item's ``model.out_B=0``,
:mod:`streamlearn.sizing`) needs the stream before learning starts. :func:`read_window`
reads the first ``learner.sizing_window`` records of the topic, every partition merged
in (timestamp, partition, offset) order, with a consumer that joins no group and commits
nothing (the replay source's, :class:`~streamlearn.replay.sources.KafkaSource`). The
worker then learns from the start of the log as on any fresh state, those records
included: the window is read twice and learned once, and no offset moves because of it.

A topic that holds fewer records than the window is sized from those it holds when the
worker starts; an empty one is waited for (its first record), since there is nothing to
size from, unless the worker stops when idle (``--until-idle``): after that long the
window is empty (the size is then the rule's least) and the worker stops as usual.

A new model given no task (none stored, none set) first takes the task the topic's first
records say (:func:`topic_task`, the rule ``replay`` applies to a topic or a file).
"""
from __future__ import annotations

import contextlib
import itertools
import logging
import time

from ..config import Config
from ..records import Record

log = logging.getLogger(__name__)

_WAIT_S = 1.0  # between looks at an empty topic
_LOG_EVERY_S = 30.0


def read_window(cfg: Config, topic: str, idle_s: float | None = None) -> list[Record]:
    """The first ``cfg.learner.sizing_window`` records of ``topic`` (undecodable
    messages skipped: the worker dead-letters them when it learns), waiting while the
    topic is empty: at most ``idle_s`` seconds, then none (None: until a record comes).
    Raises :class:`~streamlearn.replay.sources.ReplaySourceError` when the broker or the
    topic cannot be reached within ``worker.connect_timeout_s``."""
    from ..replay.sources import KafkaRange, KafkaSource

    w = cfg.worker
    waited, logged = 0.0, 0.0
    while True:
        source = KafkaSource(w.bootstrap, KafkaRange(topic), max_bytes=w.max_record_bytes,
                             timeout_s=w.connect_timeout_s, security=cfg.kafka)
        if source.estimate() > 0:
            break
        if idle_s is not None and waited >= idle_s:
            log.info("topic %r stayed empty for %.1f s: nothing to size the model from", topic, waited)
            return []
        if waited - logged >= _LOG_EVERY_S or not waited:
            log.info("topic %r is empty: waiting for its first records to size the model (%s=0)", topic,
                     "model.out_B")
            logged = waited
        time.sleep(_WAIT_S)
        waited += _WAIT_S
    with contextlib.closing(iter(source)) as items:
        records = (item.record for item in items if item.record is not None)
        window = list(itertools.islice(records, cfg.learner.sizing_window))
    log.info("warm-up window: the first %d records of %r", len(window), topic)
    return window


def topic_task(cfg: Config, topic: str) -> str | None:
    """The task of a new model given none, as the topic's first records say
    (:func:`~streamlearn.datasets.task_of_fields`): ``"next-item"`` when each holds a key
    and an item; None (classify) when one holds a label, or the topic holds no record yet.
    Text without labels raises :class:`~streamlearn.datasets.TokenStreamQuestion`: a
    classify model would send every record to the dead-letter topic.

    The topic is looked up as the worker's start-up looks it up (:class:`.connect.StartUp`,
    the same steps retried within ``worker.connect_timeout_s``), so a broker that cannot be
    reached, or a topic that does not exist, ends the start-up here with the error the
    fetch thread would give, in the same time (was: a second wait of that length)."""
    import threading

    from ..broker import describe_topic
    from ..datasets import task_of_fields
    from ..replay.sources import KafkaRange, KafkaSource, first_records
    from .connect import StartUp

    w = cfg.worker
    startup = StartUp(w, threading.Event())
    try:
        startup.step(f"looking up topic {topic!r}", lambda: describe_topic(w.bootstrap, topic, startup.wait_s(10.0),
                                                                            cfg.kafka))
        records = startup.step(f"reading the first records of {topic!r}", lambda: first_records(
            KafkaSource(w.bootstrap, KafkaRange(topic), max_bytes=w.max_record_bytes, timeout_s=startup.wait_s(10.0),
                        security=cfg.kafka)))
    except BaseException as exc:
        if not isinstance(exc, Exception) and startup.failure:  # a stop signal: what the start-up had reached
            exc.add_note(startup.failure)
        raise
    task = task_of_fields([set(r.to_dict()) for r in records], f"topic {topic!r}")
    if task is not None:
        log.info("no task given: the first records of %r hold a key and an item, so this new model is %s "
                 "(--task to choose another)", topic, task)
    elif not records:
        log.info("no task given, and topic %r holds no record yet: this new model is classify (--task to choose "
                 "another)", topic)
    return task
