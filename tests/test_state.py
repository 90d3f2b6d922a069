"""The state store contract, run over both backends (LMDB in tmp_path, and in-memory),
plus snapshot consistency under a concurrent writer, compaction and ``streamlearn inspect``.
Crash, map, disk and permission faults are in test_state_faults.py."""
from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from streamlearn.cli import main as cli_main
from streamlearn.config import StoreConfig
from streamlearn.exceptions import ConfigError
from streamlearn.state import (
    SCHEMA_VERSION, Checkpoint, Manifest, NotAStoreError, StateError, StoreBusyError, TableSpec,
    open_store, shard_of,
)
from streamlearn.state.faultcheck import UNIFORM

BACKENDS = pytest.mark.parametrize("store", ["lmdb", "memory"], indirect=True)
E = TableSpec("emb.E", rows=1000, width=4)
OPT = TableSpec("emb.E.adagrad", rows=1000, width=1)
P = TableSpec("emb.P", rows=50, width=2, dtype="float64")
CFG = StoreConfig(shards=4, map_size_gb=0.05)


@pytest.fixture
def store(request, tmp_path):
    with open_store(tmp_path / "state", CFG, backend=request.param) as s:
        s.declare_tables([E, OPT, P])
        yield s


def reader(store):
    """A second, read-only store on the same state (another handle, as a query service has)."""
    return open_store(store.path, CFG, readonly=True, backend=store.backend)


def rows(table, ids, fill=None, seed=0):
    ids = np.asarray(ids)
    rng = np.random.default_rng(seed)
    if fill is not None:
        return ids, np.full((len(ids), table.width), fill, table.dtype)
    return ids, rng.standard_normal((len(ids), table.width)).astype(table.dtype)


# -- tables -----------------------------------------------------------------------------
@BACKENDS
def test_declare_is_idempotent_and_a_changed_spec_is_refused(store):
    store.declare_tables([E, OPT])
    assert store.manifest().tables == {t.name: t for t in (E, OPT, P)}
    with pytest.raises(StateError, match="width"):
        store.declare_tables([TableSpec("emb.E", rows=1000, width=8)])


@BACKENDS
@pytest.mark.parametrize("spec", [
    TableSpec("", 10, 2), TableSpec("a/b", 10, 2), TableSpec("t", 0, 2),
    TableSpec("t", 10, -1), TableSpec("t", 10, 2, dtype="object"), TableSpec("t", 10.5, 2),
])
def test_bad_table_specs_are_refused(store, spec):
    with pytest.raises(StateError):
        store.declare_tables([spec])
    assert "t" not in store.manifest().tables


# -- commit and read --------------------------------------------------------------------
@BACKENDS
def test_rows_round_trip_and_unwritten_rows_are_not_found(store):
    ids, vals = rows(E, [7, 3, 999, 0])
    store.commit(Checkpoint(step=1, rows={"emb.E": (ids, vals)}))
    got, found = store.read_rows("emb.E", np.array([3, 5, 999, 7, 0, 3]))
    assert found.tolist() == [True, False, True, True, True, True]
    np.testing.assert_array_equal(got[[0, 2, 3, 4, 5]], vals[[1, 2, 0, 3, 1]])
    assert (got[1] == 0).all() and got.dtype == np.float32 and got.shape == (6, 4)
    empty, found = store.read_rows("emb.P", np.array([1, 2]))
    assert not found.any() and empty.shape == (2, 2) and empty.dtype == np.float64


@BACKENDS
def test_later_commits_overwrite_and_repeated_ids_keep_the_last_value(store):
    store.commit(Checkpoint(step=1, rows={"emb.E": rows(E, [1, 2, 3], fill=1.0)}))
    ids = np.array([2, 5, 2, 2])
    vals = np.arange(16, dtype=np.float32).reshape(4, 4)
    store.commit(Checkpoint(step=2, rows={"emb.E": (ids, vals)}))
    got, found = store.read_rows("emb.E", np.array([1, 2, 3, 5]))
    assert found.all()
    np.testing.assert_array_equal(got, [[1] * 4, vals[3], [1] * 4, vals[1]])


@BACKENDS
def test_commit_does_not_mutate_its_inputs_and_reads_are_independent_copies(store):
    ids, vals = np.array([9, 4, 9]), np.ones((3, 4), np.float64)
    ids0, vals0 = ids.copy(), vals.copy()
    store.commit(Checkpoint(step=1, rows={"emb.E": (ids, vals)}))
    assert np.array_equal(ids, ids0) and np.array_equal(vals, vals0)
    got, _ = store.read_rows("emb.E", np.array([4, 9]))
    got[:] = 5  # writable, and writing to it changes nothing stored
    again, _ = store.read_rows("emb.E", np.array([4, 9]))
    assert (again == 1).all()


@BACKENDS
def test_blobs_and_kv_set_delete_and_namespaces_do_not_overlap(store):
    store.commit(Checkpoint(step=1, blobs={"dense": b"w1", "labels": b"L"},
                            kv={"h": {b"u1": b"a", b"u2": b"b"}, "h2": {b"u1": b"other"}}))
    store.commit(Checkpoint(step=2, blobs={"dense": b"w2", "labels": None},
                            kv={"h": {b"u2": None, b"u0": b"c"}}))
    assert store.read_blob("dense") == b"w2" and store.read_blob("labels") is None
    assert store.read_blob("never") is None
    assert list(store.iter_kv("h")) == [(b"u0", b"c"), (b"u1", b"a")]
    assert list(store.iter_kv("h2")) == [(b"u1", b"other")]
    assert store.read_kv("h", b"u2") is None and store.read_kv("h2", b"u1") == b"other"
    assert list(store.iter_kv("nothing")) == []


@BACKENDS
def test_manifest_merges_offsets_per_partition_and_keeps_config(store):
    assert store.manifest().step == 0 and store.manifest().commits == 0
    assert store.manifest().committed_at is None
    before = time.time()
    store.commit(Checkpoint(step=10, offsets={"a:0": 5, "a:1": 7}, records_applied={"a:0": 5},
                            config={"d": 64}, metrics={"loss": float("nan"), "n": np.int64(3)}))
    store.commit(Checkpoint(step=20, offsets={"a:1": 9, "b:0": 1}, records_applied={"a:1": 2}))
    m = store.manifest()
    assert (m.step, m.commits) == (20, 2)
    assert m.offsets == {"a:0": 5, "a:1": 9, "b:0": 1}
    assert m.records_applied == {"a:0": 5, "a:1": 2}
    assert m.config == {"d": 64} and m.metrics == {"loss": None, "n": 3}
    assert before <= m.committed_at <= time.time() and m.schema_version == SCHEMA_VERSION == 2
    assert json.loads(json.dumps(m.to_dict()))["tables"]["emb.E"] == {"rows": 1000, "width": 4, "dtype": "float32"}


@BACKENDS
def test_a_reader_sees_each_new_manifest_and_its_tables(store):
    """A reader polls the manifest on every query (the LMDB store keeps the last parse
    while the stored bytes are unchanged): a commit or a declared table must show at once."""
    with reader(store) as ro:
        assert ro.manifest().commits == 0
        store.commit(Checkpoint(step=10, offsets={"a:0": 5}))
        assert (ro.manifest().step, ro.manifest().commits, ro.manifest().offsets) == (10, 1, {"a:0": 5})
        store.commit(Checkpoint(step=10, offsets={"a:0": 6}))  # same step, new offsets
        assert (ro.manifest().commits, ro.manifest().offsets) == (2, {"a:0": 6})
        store.declare_tables([TableSpec("extra", rows=10, width=1)])
        assert "extra" in ro.manifest().tables


@BACKENDS
def test_the_change_log_names_the_rows_each_recent_commit_wrote(store):
    """A serving snapshot at commit c reads only the rows commits c+1..n wrote; where the
    log does not reach back it is told so (None) and reads everything."""
    from streamlearn.state.changes import CHANGE_LOG

    store.commit(Checkpoint(step=1, rows={"emb.E": rows(E, [5, 1, 5]), "emb.P": rows(P, [3])}))
    store.commit(Checkpoint(step=2, rows={"emb.E": rows(E, [9, 1])}, offsets={"t:0": 4}))
    store.commit(Checkpoint(step=3, offsets={"t:0": 8}))  # offsets only: no row
    with reader(store) as ro, ro.snapshot():
        n = ro.manifest().commits
        assert n == 3 and ro.changed_rows(3, 3) == {} and ro.changed_rows(2, 3) == {}
        got = ro.changed_rows(0, 3)
        assert sorted(got) == ["emb.E", "emb.P"]
        assert got["emb.E"].tolist() == [1, 5, 9] and got["emb.P"].tolist() == [3]
        assert ro.changed_rows(1, 2)["emb.E"].tolist() == [1, 9] and "emb.P" not in ro.changed_rows(1, 2)
        assert ro.changed_rows(3, 2) is None and ro.changed_rows(-1, 3) is None
    for step in range(4, 4 + CHANGE_LOG):
        store.commit(Checkpoint(step=step, rows={"emb.E": rows(E, [step])}))
    n = store.manifest().commits
    assert store.changed_rows(n - CHANGE_LOG, n)["emb.E"].tolist() == list(range(4, 4 + CHANGE_LOG))
    assert store.changed_rows(n - CHANGE_LOG - 1, n) is None  # the oldest record is gone


def _bad_checkpoints():
    ok = rows(E, [1, 2])
    return {
        "undeclared table": Checkpoint(step=5, rows={"nope": ok}),
        "id out of range": Checkpoint(step=5, rows={"emb.E": rows(E, [1, 1000])}),
        "negative id": Checkpoint(step=5, rows={"emb.E": rows(E, [-1, 2])}),
        "float ids": Checkpoint(step=5, rows={"emb.E": (np.array([1.0, 2.0]), ok[1])}),
        "wrong width": Checkpoint(step=5, rows={"emb.E": (ok[0], np.ones((2, 3)))}),
        "string values": Checkpoint(step=5, rows={"emb.E": (ok[0], np.full((2, 4), "x"))}),
        "rows not a pair": Checkpoint(step=5, rows={"emb.E": [ok[0], ok[1]]}),
        "offset key": Checkpoint(step=5, rows={"emb.E": ok}, offsets={"topic": 3}),
        "negative offset": Checkpoint(step=5, rows={"emb.E": ok}, offsets={"t:0": -1}),
        "blob not bytes": Checkpoint(step=5, rows={"emb.E": ok}, blobs={"dense": "text"}),
        "kv key too long": Checkpoint(step=5, rows={"emb.E": ok}, kv={"h": {b"k" * 600: b"v"}}),
        "config not json": Checkpoint(step=5, rows={"emb.E": ok}, config={"f": object()}),
        "step backwards": Checkpoint(step=0, rows={"emb.E": ok}),
        "negative step": Checkpoint(step=-1, rows={"emb.E": ok}),
    }


@BACKENDS
@pytest.mark.parametrize("case", list(_bad_checkpoints()))
def test_a_bad_checkpoint_raises_and_changes_nothing(store, case):
    store.commit(Checkpoint(step=1, offsets={"t:0": 3}, rows={"emb.E": rows(E, [1], fill=7.0)}))
    before = store.manifest()
    with pytest.raises(StateError):
        store.commit(_bad_checkpoints()[case])
    assert store.manifest() == before
    got, found = store.read_rows("emb.E", np.array([1, 2]))
    assert found.tolist() == [True, False] and (got[0] == 7).all()


@BACKENDS
def test_read_rows_checks_its_ids(store):
    with pytest.raises(StateError, match="outside"):
        store.read_rows("emb.E", np.array([1000]))
    with pytest.raises(StateError, match="unknown table"):
        store.read_rows("nope", np.array([1]))
    values, found = store.read_rows("emb.E", np.zeros(0, np.int64))
    assert values.shape == (0, 4) and found.shape == (0,)


# -- iteration, restore, stats --------------------------------------------------------------
@BACKENDS
def test_iter_rows_yields_every_row_once_shard_by_shard(store):
    ids, vals = rows(E, np.random.default_rng(1).choice(1000, 300, replace=False))
    store.commit(Checkpoint(step=1, rows={"emb.E": (ids, vals)}))
    batches = list(store.iter_rows("emb.E", batch=16))
    assert max(len(b[0]) for b in batches) <= 16
    got_ids = np.concatenate([b[0] for b in batches])
    got_vals = np.concatenate([b[1] for b in batches])
    assert sorted(got_ids.tolist()) == sorted(ids.tolist())
    shards = shard_of(got_ids, store.shards)
    assert (np.diff(shards) >= 0).all()  # shard by shard
    for s in range(store.shards):
        assert (np.diff(got_ids[shards == s]) > 0).all()  # ascending within a shard
    by_id = dict(zip(ids.tolist(), vals))
    for i, v in zip(got_ids.tolist(), got_vals):
        assert np.array_equal(by_id[i], v)


@BACKENDS
def test_load_table_restores_into_an_array_and_keeps_the_init_elsewhere(store):
    ids, vals = rows(E, [3, 500, 999])
    store.commit(Checkpoint(step=1, rows={"emb.E": (ids, vals)}))
    table = np.full((E.rows, E.width), -1.0, np.float32)
    assert store.load_table("emb.E", table) == 3
    np.testing.assert_array_equal(table[ids], vals)
    assert (np.delete(table, ids, axis=0) == -1).all()


@BACKENDS
def test_stats_count_rows_per_shard(store):
    ids = np.arange(0, 1000, 3)
    store.commit(Checkpoint(step=1, rows={"emb.E": rows(E, ids)}, blobs={"dense": b"x" * 10},
                            kv={"h": {b"a": b"1", b"b": b"2"}}))
    st = store.stats()
    e = st["tables"]["emb.E"]
    assert e["stored"] == len(ids) and e["rows"] == 1000 and e["width"] == 4
    assert e["shard_rows"] == np.bincount(shard_of(ids, 4), minlength=4).tolist()
    assert all(b > 0 for b in e["shard_bytes"]) and st["tables"]["emb.P"]["stored"] == 0
    assert st["blobs"] == {"dense": 10} and st["kv"] == {"h": 2} and st["shards"] == 4


def _splitmix64_finalizer(x):
    mask = 2**64 - 1
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & mask
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & mask
    return x ^ (x >> 31)


def test_shard_of_is_stable_and_spreads_structured_ids():
    assert shard_of(np.array([0, 1, 2, 3, 2**62]), 8).tolist() == [0, 5, 2, 0, 5]
    ids = np.random.default_rng(0).integers(0, 2**63 - 1, 1000)
    for shards in (1, 7, 8, 256):
        want = [_splitmix64_finalizer(i) % shards for i in ids.tolist()]
        assert shard_of(ids, shards).tolist() == want
    strided = shard_of(np.arange(0, 8 * 40_000, 8), 8)  # plain id % 8 would put all in shard 0
    counts = np.bincount(strided, minlength=8)
    assert counts.min() > 0.9 * counts.mean()


# -- readers, snapshots -----------------------------------------------------------------------
@BACKENDS
def test_a_read_only_store_sees_commits_and_refuses_writes(store):
    ro = reader(store)
    try:
        store.commit(Checkpoint(step=1, rows={"emb.E": rows(E, [4], fill=2.0)}))
        assert ro.manifest().step == 1 and ro.read_rows("emb.E", np.array([4]))[1].all()
        store.declare_tables([TableSpec("late", rows=10, width=2)])
        store.commit(Checkpoint(step=2, rows={"late": rows(TableSpec("late", 10, 2), [3], fill=1.0)}))
        assert ro.read_rows("late", np.array([3]))[1].all()  # a table declared after open
        store.declare_tables([TableSpec("later", rows=10, width=2)])
        store.commit(Checkpoint(step=3, rows={"later": rows(TableSpec("later", 10, 2), [1], fill=5.0)}))
        with ro.snapshot():  # first seen inside a snapshot block
            assert ro.read_rows("later", np.array([1]))[0].tolist() == [[5.0, 5.0]]
        with pytest.raises(StateError, match="read-only"):
            ro.commit(Checkpoint(step=4))
        with pytest.raises(StateError, match="read-only"):
            ro.declare_tables([TableSpec("other", rows=10, width=2)])
        ro.declare_tables([E])  # already there: fine
    finally:
        ro.close()


def _uniform_commit(store, i):
    ids = np.arange(UNIFORM.rows)
    store.commit(Checkpoint(step=i, offsets={"u:0": i}, blobs={"step": str(i).encode()},
                            rows={"u": (ids, np.full((UNIFORM.rows, UNIFORM.width), i, np.float32))}))


def _check_reads(ro, keep_going, min_steps):
    """Read while a writer commits: each read is from one checkpoint (every row holds its
    step); inside a snapshot, rows, blob and manifest agree."""
    ids = np.arange(UNIFORM.rows)
    steps, reads = set(), 0
    while keep_going() and len(steps) < min_steps:
        with ro.snapshot():
            m = ro.manifest()
            values, found = ro.read_rows("u", ids)
            blob = ro.read_blob("step")
        if m.step == 0:
            continue
        assert found.all() and (values == m.step).all(), f"mixed rows in step {m.step}"
        assert blob == str(m.step).encode() and m.offsets == {"u:0": m.step}
        values, _ = ro.read_rows("u", ids[::-1])
        assert (values == values[0, 0]).all() and values[0, 0] >= m.step
        steps.add(m.step)
        reads += 1
    return steps, reads


@BACKENDS
def test_snapshot_reads_under_a_writer_thread(store):
    store.declare_tables([UNIFORM])
    ro = reader(store)
    stop = threading.Event()

    def write():
        i = 1
        while not stop.is_set():
            _uniform_commit(store, i)
            i += 1

    writer = threading.Thread(target=write)
    writer.start()
    try:
        # The writer commits until the reader has seen 30 checkpoints: a count of events, not
        # of what fits in a time window. The deadline only bounds a hang.
        deadline = time.monotonic() + 120
        steps, reads = _check_reads(ro, lambda: time.monotonic() < deadline, min_steps=30)
    finally:
        stop.set()
        writer.join()
        ro.close()
    assert len(steps) >= 30, f"only {len(steps)} distinct checkpoints seen in {reads} reads"


def test_snapshot_reads_while_another_process_commits(tmp_path):
    """The query-service case: a reader process-side, the worker in another process."""
    path = tmp_path / "state"
    cmd = [sys.executable, "-m", "streamlearn.state.faultcheck", "uniform", str(path),
           "--map-mb", "1", "--sync", "0", "--commits", "400", "--pause-ms", "5"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().startswith("end 1")
        with open_store(path, readonly=True) as ro:
            deadline = time.monotonic() + 30
            steps, reads = _check_reads(
                ro, lambda: proc.poll() is None and time.monotonic() < deadline, min_steps=10**9)
            assert ro.manifest().step == 400
            assert ro.stats()["map_size"] > 2**20  # the reader adopted the writer's grown map
    finally:
        proc.kill()
        proc.wait()
    # The map started at 1 MB and the writer grew it; the reader adopted the new size.
    # The writer pauses 5 ms between commits, so even on a loaded machine the reader has
    # two seconds or more to see many of the 400 checkpoints.
    assert len(steps) >= 20, f"only {len(steps)} distinct checkpoints seen in {reads} reads"


# -- reopening, compaction, one writer -------------------------------------------------------
def test_state_persists_across_reopen_and_shards_must_match(tmp_path):
    path = tmp_path / "state"
    with open_store(path, CFG) as s:
        s.declare_tables([E])
        s.commit(Checkpoint(step=3, offsets={"t:0": 9}, rows={"emb.E": rows(E, [1, 2], fill=4.0)},
                            blobs={"dense": b"w"}, kv={"h": {b"k": b"v"}}))
        want = s.manifest()
    with open_store(path, CFG) as s:
        assert s.manifest() == want and s.read_blob("dense") == b"w"
        assert s.read_rows("emb.E", np.array([2]))[0].tolist() == [[4.0] * 4]
    with pytest.raises(StateError, match="store.shards=4"):
        open_store(path, StoreConfig(shards=8))
    with open_store(path, StoreConfig(shards=8), readonly=True) as ro:  # readers use the stored S
        assert ro.shards == 4 and ro.manifest() == want


@pytest.mark.parametrize("sync", [True, False])
def test_store_sync_sets_lmdb_sync_on_commit(tmp_path, sync):
    with open_store(tmp_path / "s", StoreConfig(map_size_gb=0.01, sync=sync)) as s:
        assert s.stats()["sync"] is sync


def test_one_writer_per_directory(tmp_path):
    with open_store(tmp_path / "s", CFG):
        with pytest.raises(StoreBusyError, match="another writer"):
            open_store(tmp_path / "s", CFG)
        code = "from streamlearn.state import open_store; open_store(%r)" % str(tmp_path / "s")
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        assert out.returncode != 0 and "StoreBusyError" in out.stderr


@BACKENDS
def test_compact_copies_the_whole_state(store, tmp_path):
    ids = np.arange(0, 1000, 7)
    for step in range(1, 6):  # overwrites leave free pages for compaction to drop
        store.commit(Checkpoint(step=step, offsets={"t:0": step}, rows={"emb.E": rows(E, ids, seed=step)},
                                blobs={"dense": bytes(1000 * step)}, kv={"h": {b"k%d" % step: b"v"}},
                                config={"c": 1}, metrics={"m": step}))
    dest = tmp_path / "copy"
    store.compact(str(dest))
    with open_store(dest, readonly=True) as copy:
        assert copy.manifest() == store.manifest() and copy.shards == store.shards
        for t in (E, OPT, P):
            a = sorted((i, v.tobytes()) for b in store.iter_rows(t.name) for i, v in zip(*b))
            assert sorted((i, v.tobytes()) for b in copy.iter_rows(t.name) for i, v in zip(*b)) == a
        assert copy.read_blob("dense") == bytes(5000) and list(copy.iter_kv("h")) == list(store.iter_kv("h"))
        if store.backend == "lmdb":
            before, after = store.stats(), copy.stats()
            assert after["file_bytes"] < before["file_bytes"]
            # used is what the data holds now: the free pages are on disk, not used (was: the
            # file's high-water mark, so inspect showed on disk == used and never said compact)
            assert before["used_bytes"] == after["used_bytes"] == after["file_bytes"]
            assert before["used_bytes"] < before["file_bytes"] - 10 * 4096
    with pytest.raises(StateError, match="empty directory"):
        store.compact(str(dest))


def test_compact_takes_a_map_another_process_grew(tmp_path):
    """Was: MDB_MAP_RESIZED, and a 0-byte data.mdb that read as a damaged state and
    blocked a retry ("must be a new or empty directory"). The copy is written aside and
    moved into place whole."""
    cfg = dataclasses.replace(CFG, map_size_gb=0.01, grow_map=True)
    path = tmp_path / "s"
    with open_store(path, cfg) as w:
        w.declare_tables([TableSpec("E", rows=200_000, width=64)])
        w.commit(Checkpoint(step=1, rows={"E": (np.arange(100), np.ones((100, 64), np.float32))}))
    reader = open_store(path, readonly=True)
    try:
        grow = ("import dataclasses, sys, numpy as np\n"
                "from streamlearn.state import open_store, Checkpoint\n"
                "from streamlearn.config import StoreConfig\n"
                "cfg = dataclasses.replace(StoreConfig(shards=%d), map_size_gb=0.01, grow_map=True)\n"
                "with open_store(sys.argv[1], cfg) as w:\n"
                "    w.commit(Checkpoint(step=2, rows={'E': (np.arange(60000), np.ones((60000, 64), np.float32))}))\n"
                % CFG.shards)
        subprocess.run([sys.executable, "-c", grow, str(path)], check=True, capture_output=True)
        reader.compact(str(tmp_path / "copy"))
        with open_store(tmp_path / "copy", readonly=True) as copy:
            assert copy.manifest().step == 2 and copy.stats()["tables"]["E"]["stored"] == 60_000
        assert sorted(os.listdir(tmp_path / "copy")) == ["data.mdb", "lock.mdb"]  # no partial folder left
    finally:
        reader.close()



def test_open_errors_are_clear(tmp_path):
    with pytest.raises(NotAStoreError, match="does not exist"):
        open_store(tmp_path / "missing", readonly=True)
    with pytest.raises(NotAStoreError, match="no data.mdb"):
        open_store(tmp_path, readonly=True)
    with pytest.raises(NotAStoreError):
        open_store(tmp_path / "missing", readonly=True, backend="memory")
    with pytest.raises(ConfigError, match="store.backend"):
        open_store(tmp_path, backend="rocksdb")
    with pytest.raises(ConfigError, match="store.shards"):
        open_store(tmp_path, StoreConfig(shards=0))
    (tmp_path / "file").write_text("x")
    with pytest.raises(NotAStoreError, match="not a directory"):
        open_store(tmp_path / "file")


def test_a_foreign_lmdb_environment_is_refused_untouched(tmp_path):
    import lmdb

    env = lmdb.open(str(tmp_path / "foreign"))
    with env.begin(write=True) as txn:
        txn.put(b"someone", b"else")
    env.close()
    with pytest.raises(NotAStoreError):
        open_store(tmp_path / "foreign", readonly=True)
    with pytest.raises(NotAStoreError):
        open_store(tmp_path / "foreign")
    env = lmdb.open(str(tmp_path / "foreign"))
    with env.begin() as txn:
        assert list(txn.cursor()) == [(b"someone", b"else")]
    env.close()


def test_a_store_opened_before_fork_refuses_to_work_in_the_child(tmp_path):
    with open_store(tmp_path / "s", CFG) as s:
        pid = os.fork()
        if pid == 0:
            try:
                s.manifest()
                os._exit(1)
            except StateError as exc:
                os._exit(0 if "fork" in str(exc) else 2)
            except BaseException:
                os._exit(3)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0


# -- the inspect command ----------------------------------------------------------------------
def test_inspect_prints_the_manifest_as_text_and_json(tmp_path, capsys):
    path = tmp_path / "state"
    with open_store(path, CFG) as s:
        s.declare_tables([E, OPT])
        s.commit(Checkpoint(step=42, offsets={"events:0": 100, "events:1": 7},
                            records_applied={"events:0": 100, "events:1": 7},
                            rows={"emb.E": rows(E, [1, 2, 3])}, config={"embedding": {"d": 4}},
                            metrics={"loss": 0.5}, blobs={"dense": b"abc"}))
    assert cli_main(["inspect", "--state", str(path), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["step"] == 42 and report["offsets"] == {"events:0": 100, "events:1": 7}
    assert report["records_applied"] == {"events:0": 100, "events:1": 7}
    assert report["config"] == {"embedding": {"d": 4}} and report["metrics"] == {"loss": 0.5}
    assert report["tables"]["emb.E"]["stored"] == 3 and len(report["tables"]["emb.E"]["shard_rows"]) == 4
    assert report["tables"]["emb.E.adagrad"]["stored"] == 0 and report["blobs"] == {"dense": 3}
    assert cli_main(["inspect", "--state", str(path)]) == 0
    text = capsys.readouterr().out
    assert "step     42" in text and "events:1" in text and "emb.E" in text


def test_inspect_shows_an_old_states_config_as_the_model_runs_it(tmp_path, capsys, store_as_before):
    """A key the state is older than is shown at the value it runs with (was: left out, so
    an old next-item state read as today's model)."""
    from streamlearn.config import Config
    from streamlearn.learner import Learner

    learner = Learner(Config().override("learner.task=next-item", "embedding.K=1000", "embedding.B=100",
                                        "model.out_B=256", "store.shards=2"))
    learner.learn_many([{"key": f"u{i % 3}", "item": f"i{i % 7}"} for i in range(40)])
    store_as_before(learner, tmp_path / "old", "model.count_join", "learner.key_token")
    assert cli_main(["inspect", "--state", str(tmp_path / "old"), "--json"]) == 0
    config = json.loads(capsys.readouterr().out)["config"]
    assert config["model"]["count_join"] == "mixture" and config["learner"]["key_token"] is False


def test_inspect_on_a_directory_that_is_not_a_store_says_so(tmp_path, capsys):
    assert cli_main(["inspect", "--state", str(tmp_path / "nope")]) == 2
    err = capsys.readouterr().err
    assert "does not exist" in err and "Traceback" not in err
    out = subprocess.run([sys.executable, "-m", "streamlearn.cli", "inspect", "--state", str(tmp_path)],
                         capture_output=True, text=True)
    assert out.returncode == 2 and "not a streamlearn state directory" in out.stderr
    assert "Traceback" not in out.stderr


# -- public API (the package's doctests run in the suite: see conftest.py) ----------------------
def test_public_api():
    import streamlearn.state as state

    assert {"open_store", "Store", "Checkpoint", "TableSpec", "Manifest", "StateError"} <= set(state.__all__)
    assert all(hasattr(state, name) for name in state.__all__)


@pytest.mark.parametrize("backend", ["lmdb", "memory"])
def test_a_new_store_reports_the_empty_manifest(tmp_path, backend):
    """What ``Manifest()`` means (nothing committed yet) is what a new store reports."""
    with open_store(tmp_path / "s", CFG, backend=backend) as fresh:
        assert fresh.manifest() == Manifest()
    empty = Manifest()
    assert (empty.step, empty.commits, empty.committed_at, empty.offsets, empty.tables) == (0, 0, None, {}, {})
