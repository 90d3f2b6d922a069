"""Shared fixtures: one real embedded broker per test session; a fresh topic and group per test.

- ``broker``: bootstrap address ``"127.0.0.1:PORT"`` of the session's Tansu broker;
- ``embedded_broker``: the :class:`~streamlearn.broker.EmbeddedBroker` itself;
- ``topic`` / ``group``: unique names (the topic is *not* created: Tansu would auto-create it
  with 4 partitions on first use, so create it with ``make_topic`` when the count matters);
- ``make_topic(partitions=1)``: create a fresh topic and return its name;
- ``consume(topic, n, timeout_s=10)``: read ``n`` messages from every partition, from the start;
- ``tmpfs(size)``: a small tmpfs mounted for the test (a real full disk).

Consumer groups on Tansu: a join waits up to ``max_poll_interval_ms`` for members, so tests
that use groups set it to about 3000 ms (``GROUP_TIMEOUTS``).

Every test that requests one of these broker fixtures is marked ``broker`` by the root
conftest.py; ``pytest -m "not broker"`` is the fast lane.
"""
from __future__ import annotations

import subprocess
import time
import uuid

import pytest
import torch

from streamlearn.broker import EmbeddedBroker, create_topic

GROUP_TIMEOUTS = {"max_poll_interval_ms": 3000, "session_timeout_ms": 3000, "heartbeat_interval_ms": 500}


@pytest.fixture(scope="module")
def one_torch_thread():
    """One intra-op thread for a module's tiny models, restored afterwards: on a shared
    2-core machine OpenMP oversubscription makes them several times slower. A module
    opts in with ``pytestmark = pytest.mark.usefixtures("one_torch_thread")``."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def tmpfs(tmp_path):
    """``tmpfs(size)``: mount a tmpfs of ``size`` (``"3m"``) and return its path: a real
    ENOSPC from the kernel once it is full. Skips where mounting needs privileges we lack."""
    mounted = []

    def mount(size: str = "3m"):
        mnt = tmp_path / f"tmpfs{len(mounted)}"
        mnt.mkdir()
        out = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mnt)],
                             capture_output=True, text=True)
        if out.returncode != 0:
            pytest.skip(f"mounting a small tmpfs needs root/CAP_SYS_ADMIN: {out.stderr.strip()}")
        mounted.append(mnt)
        return mnt

    try:
        yield mount
    finally:
        for mnt in mounted:
            subprocess.run(["umount", "-l", str(mnt)], check=False)


@pytest.fixture(scope="session")
def embedded_broker():
    broker = EmbeddedBroker().start()
    try:
        yield broker
    finally:
        broker.stop()


@pytest.fixture(scope="session")
def broker(embedded_broker) -> str:
    return embedded_broker.bootstrap


@pytest.fixture
def topic() -> str:
    return f"test-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def group() -> str:
    return f"group-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def make_topic(broker):
    def make(partitions: int = 1) -> str:
        name = f"test-{uuid.uuid4().hex[:12]}"
        assert create_topic(broker, name, partitions) == partitions
        return name

    return make


@pytest.fixture
def consume(broker):
    def read(topic: str, n: int, timeout_s: float = 10.0) -> list:
        return consume_from(broker, topic, n, timeout_s)

    return read


def consume_from(bootstrap: str, topic: str, n: int, timeout_s: float = 10.0) -> list:
    """The first ``n`` messages of every partition of ``topic`` (fewer if the time runs out),
    ordered by (partition, offset)."""
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, auto_offset_reset="earliest")
    try:
        partitions = consumer.partitions_for_topic(topic) or set()
        consumer.assign([TopicPartition(topic, p) for p in sorted(partitions)])
        consumer.seek_to_beginning()
        out: list = []
        deadline = time.monotonic() + timeout_s
        while len(out) < n and time.monotonic() < deadline:
            for batch in consumer.poll(timeout_ms=200).values():
                out.extend(batch)
        return sorted(out, key=lambda m: (m.partition, m.offset))
    finally:
        consumer.close()


@pytest.fixture
def store_as_before():
    """``write(learner, path, *keys)``: commit ``learner``'s whole state to a new store at
    ``path`` with its stored config lacking the dotted ``keys``, as the version before
    those keys wrote it; returns that config (a dict)."""
    import json

    from streamlearn import checkpoint
    from streamlearn.state import Checkpoint, open_store

    def write(learner, path, *keys: str) -> dict:
        old = learner.cfg.to_dict()
        for key in keys:
            section, name = key.split(".")
            del old[section][name]
        specs, rows, blobs, kv = checkpoint.write(learner, full=True)
        blobs[checkpoint.CONFIG_BLOB] = json.dumps(old).encode()  # as that version wrote it
        with open_store(path, learner.cfg.store) as store:
            store.declare_tables(specs)
            store.commit(Checkpoint(step=learner.steps, rows=rows, blobs=blobs, kv=kv, config=old))
        return old

    return write
