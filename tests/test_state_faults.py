"""Faults: a writer SIGKILLed at random instants (the directory must reopen at exactly one
complete checkpoint with its offsets), a full map, a full disk, and permission errors.
bench/state_faults.py runs the kill trials at scale (>= 50 kills)."""
from __future__ import annotations

import contextlib
import os
import random
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pytest

from streamlearn.config import StoreConfig
from streamlearn.state import (
    Checkpoint, DiskFullError, MapFullError, StorePermissionError, TableSpec, open_store,
)
from streamlearn.state.faultcheck import Reference, differences, kill_once, make_checkpoint

BIG = TableSpec("emb.E", rows=100_000, width=64)


def test_sigkill_at_random_instants_reopens_at_exactly_one_checkpoint(tmp_path):
    rng = random.Random(20240601)
    directory = tmp_path / "state"
    ref = Reference(seed=11, scale=4000)
    kills = [kill_once(directory, ref, rng, max_delay=0.5, map_mb=1.0, early=True)]
    kills += [kill_once(directory, ref, rng, max_delay=0.5, map_mb=1.0, early=False) for _ in range(5)]
    for k in kills:
        assert not k.problems, k
    assert kills[-1].step > 0, "the child never committed: the kills tested nothing"
    assert sum(k.in_commit for k in kills) >= 1, "no kill landed inside Store.commit"
    assert os.path.getsize(directory / "data.mdb") > 2**20  # the 1 MB map grew during the kills


def test_the_check_sees_a_mixed_checkpoint_and_rows_without_their_offsets(tmp_path):
    """The kill check is only worth something if it fails on a wrong state."""
    directory = tmp_path / "state"
    ref = Reference(seed=3, scale=500)
    with open_store(directory, StoreConfig(map_size_gb=0.05)) as store:
        from streamlearn.state.faultcheck import TABLES

        store.declare_tables(TABLES)
        for i in (1, 2):
            store.commit(make_checkpoint(3, i, 500))
        ref.advance_to(2)
        assert differences(store, ref) == []
        mixed = make_checkpoint(3, 3, 500)
        mixed.step, mixed.offsets, mixed.records_applied = 20, {}, {}  # rows of 3, manifest of 2
        store.commit(mixed)
        assert any("row values" in d or "stored rows" in d for d in differences(store, ref))
    ref2 = Reference(seed=3, scale=500)
    with open_store(tmp_path / "other", StoreConfig(map_size_gb=0.05)) as store:
        store.declare_tables(TABLES)
        store.commit(make_checkpoint(3, 1, 500))
        ahead = make_checkpoint(3, 2, 500)
        ahead.step, ahead.rows = 10, {}  # offsets of 2, rows of 1
        store.commit(ahead)
        ref2.advance_to(1)
        assert any(d.startswith("manifest offsets") for d in differences(store, ref2))


def _rows(n, fill, start=0):
    return np.arange(start, start + n), np.full((n, BIG.width), fill, np.float32)


def test_a_full_map_fails_with_the_setting_to_raise_and_keeps_the_last_checkpoint(tmp_path):
    cfg = StoreConfig(map_size_gb=0.001, grow_map=False)
    with open_store(tmp_path / "s", cfg) as store:
        store.declare_tables([BIG])
        store.commit(Checkpoint(step=1, offsets={"t:0": 1}, rows={"emb.E": _rows(100, 1.0)}))
        with pytest.raises(MapFullError, match=r"store\.map_size_gb \(now 0\.001\)"):
            store.commit(Checkpoint(step=2, offsets={"t:0": 2}, rows={"emb.E": _rows(10_000, 2.0)}))
        m = store.manifest()
        assert (m.step, m.offsets) == (1, {"t:0": 1})
        values, found = store.read_rows("emb.E", np.arange(200))
        assert found[:100].all() and not found[100:].any() and (values[:100] == 1).all()
    with open_store(tmp_path / "s", StoreConfig(map_size_gb=0.001, grow_map=True)) as store:
        store.commit(Checkpoint(step=2, offsets={"t:0": 2}, rows={"emb.E": _rows(10_000, 2.0)}))
        assert store.manifest().step == 2 and store.stats()["map_size"] > 2**20
        assert (store.read_rows("emb.E", np.arange(10_000))[0] == 2).all()


def test_a_writer_whose_directory_was_deleted_or_replaced_refuses_to_commit(tmp_path):
    """Was: commits into the unlinked file succeeded, and the worker said "all saved"."""
    from streamlearn.state import StateError

    for damage in ("deleted", "replaced"):
        path = tmp_path / damage
        with open_store(path, StoreConfig()) as store:
            store.commit(Checkpoint(step=1, offsets={"t:0": 1}))
            shutil.rmtree(path)
            if damage == "replaced":
                open_store(tmp_path / "other", StoreConfig()).close()
                os.rename(tmp_path / "other", path)
            with pytest.raises(StateError, match="was deleted or replaced after this process opened it"):
                store.commit(Checkpoint(step=2, offsets={"t:0": 2}))


@pytest.fixture
def tiny_fs(tmpfs):
    """A 3 MB tmpfs: a real ENOSPC from the kernel."""
    return tmpfs("3m")


def test_a_full_disk_is_reported_and_the_last_checkpoint_survives(tiny_fs):
    path = tiny_fs / "state"
    with open_store(path, StoreConfig(map_size_gb=0.05)) as store:
        store.declare_tables([BIG])
        store.commit(Checkpoint(step=1, offsets={"t:0": 1}, rows={"emb.E": _rows(1000, 1.0)}))
        with pytest.raises(DiskFullError, match="free disk space"):
            store.commit(Checkpoint(step=2, offsets={"t:0": 2}, rows={"emb.E": _rows(20_000, 2.0)}))
        assert store.manifest().step == 1
    with open_store(path, readonly=True) as store:
        m = store.manifest()
        assert (m.step, m.offsets) == (1, {"t:0": 1})
        values, found = store.read_rows("emb.E", np.arange(2000))
        assert found[:1000].all() and not found[1000:].any() and (values[:1000] == 1).all()


@contextlib.contextmanager
def _as_unprivileged_user():
    """Root ignores file modes; drop the effective uid to 'nobody' so the kernel's
    permission checks apply (as they do for any non-root user)."""
    if os.geteuid() != 0:
        yield
        return
    os.seteuid(65534)
    try:
        yield
    finally:
        os.seteuid(0)


@pytest.fixture
def shared_dir():
    """A directory others may enter (pytest's tmp dirs are private to their owner)."""
    root = Path(tempfile.mkdtemp(prefix="streamlearn-perm-"))
    os.chmod(root, 0o755)
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_permission_errors_are_reported_clearly(shared_dir):
    tmp_path = shared_dir
    path = tmp_path / "state"
    with open_store(path, StoreConfig(map_size_gb=0.01)) as store:
        store.declare_tables([BIG])
        store.commit(Checkpoint(step=1))
    # Others may read the directory but not write it, nor lock.mdb (the reader table).
    for name in os.listdir(path):
        os.chmod(path / name, 0o444)
    os.chmod(path, 0o555)
    try:
        with _as_unprivileged_user():
            with pytest.raises(StorePermissionError, match="permission denied"):
                open_store(path, StoreConfig(map_size_gb=0.01))
            with pytest.raises(StorePermissionError, match="lock.mdb"):
                open_store(path, readonly=True)
            with pytest.raises(StorePermissionError):
                open_store(tmp_path / "new", StoreConfig(map_size_gb=0.01))
    finally:
        os.chmod(path, 0o755)
    with open_store(path, readonly=True) as store:  # as the owner it still opens
        assert store.manifest().step == 1


def test_a_read_only_file_system_is_named_as_such(tmpfs):
    """Was: "permission denied ... needs write access", which no chmod mends."""
    import subprocess

    from streamlearn.state import StorePermissionError

    mnt = tmpfs("4m")
    with open_store(mnt / "s", StoreConfig(map_size_gb=0.001)) as store:
        store.commit(Checkpoint(step=1, offsets={"t:0": 1}))
    subprocess.run(["mount", "-o", "remount,ro", str(mnt)], check=True)
    with pytest.raises(StorePermissionError, match="mounted read-only"):
        open_store(mnt / "s", StoreConfig(map_size_gb=0.001))
    with pytest.raises(StorePermissionError, match="mounted read-only"):
        open_store(mnt / "new", StoreConfig(map_size_gb=0.001))
