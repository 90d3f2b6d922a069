"""Attacks on a state directory, each against real LMDB files: a deleted meta record, an
emptied, truncated or missing data.mdb, overwritten pages, every E value set to NaN with the
B-tree intact, a full disk during a commit. Each must be refused with a one-line error that
names the directory and the damage (never a silent reset, a raw lmdb error or a SIGBUS),
leave the files as they were, and lose or re-learn nothing; ``--reset`` is the one explicit
way to start over. Commit-protocol faults (SIGKILL, full map) are in test_state_faults.py."""
from __future__ import annotations

import hashlib
import json
import logging
import os
import subprocess
import sys
import threading
import time

import lmdb
import numpy as np
import pytest
import torch

from streamlearn import checkpoint
from streamlearn.cli import main as cli_main
from streamlearn.config import Config, StoreConfig
from streamlearn.consumers import RunOptions, Worker, read_audit
from streamlearn.consumers.checkpoint import Checkpointer, open_learner
from streamlearn.learner import Learner
from streamlearn.state import (
    Checkpoint, DamagedStoreError, DiskFullError, NotAStoreError, StateError, TableSpec, check_readable,
    open_store,
)

from test_worker import SMALL, applied_once, offsets_of, produce, stream

pytestmark = pytest.mark.usefixtures("one_torch_thread")

E = TableSpec("emb.E", rows=50_000, width=16)
CFG = StoreConfig(shards=2, map_size_gb=0.05)
META_RECORDS = ["format", "schema_version", "shards", "shard_fn", "tables", "manifest"]


def small_state(path, step: int = 5) -> np.ndarray:
    """A state with rows of emb.E, a blob, a kv entry and offsets; returns the row ids."""
    ids = np.arange(0, E.rows, 7)
    values = np.random.default_rng(step).standard_normal((len(ids), E.width)).astype(np.float32)
    with open_store(path, CFG) as store:
        store.declare_tables([E])
        store.commit(Checkpoint(step=step, offsets={"t:0": 500}, records_applied={"t:0": 500},
                                rows={"emb.E": (ids, values)}, blobs={"learner.meta": b"m"},
                                kv={"history": {b"user": b"items"}}))
    return ids


def raw_env(path) -> lmdb.Environment:
    """The directory's LMDB environment as an attacker (or a bad disk) sees it."""
    return lmdb.open(str(path), max_dbs=64, map_size=2**30)


def digest(path) -> str:
    """Every file in the directory, by name and content: 'left as it was' means equal."""
    h = hashlib.sha256()
    for name in sorted(os.listdir(path)):
        full = os.path.join(path, name)
        h.update(name.encode())
        if os.path.isfile(full) and name != "lock.mdb":  # lock.mdb: LMDB's reader table
            with open(full, "rb") as f:
                h.update(f.read())
    return h.hexdigest()


def refused(call, error=DamagedStoreError, *words: str) -> str:
    with pytest.raises(error) as info:
        call()
    message = str(info.value)
    assert "\n" not in message, message
    for word in words:
        assert word in message, message
    return message


def cli(*argv: str) -> subprocess.CompletedProcess:
    """The real command in its own process: a SIGBUS there fails the test, not pytest."""
    return subprocess.run([sys.executable, "-m", "streamlearn.cli", *argv], capture_output=True, text=True,
                          timeout=120)


# ---------------------------------------------------------------------------- meta records

@pytest.mark.parametrize("key", META_RECORDS)
def test_a_missing_meta_record_is_refused_by_readers_and_writers_and_nothing_is_reset(tmp_path, key):
    path = tmp_path / "s"
    small_state(path)
    env = raw_env(path)
    with env.begin(write=True) as txn:
        assert txn.delete(key.encode(), db=env.open_db(b"meta", txn=txn))
    env.close()
    before = digest(path)
    for readonly in (True, False):
        refused(lambda readonly=readonly: open_store(path, CFG, readonly=readonly), DamagedStoreError,
                str(path), f"'{key}' is missing", "--reset")
    assert digest(path) == before  # no fresh manifest written over the rows


@pytest.mark.parametrize("key, value, words", [
    ("manifest", b'{"step": 5, "offs', "fails its checksum"),
    ("schema_version", b"two", "not a number"),
    ("shards", b"0", "fails its checksum"),
])
def test_an_overwritten_meta_record_is_refused(tmp_path, key, value, words):
    path = tmp_path / "s"
    small_state(path)
    env = raw_env(path)
    with env.begin(write=True) as txn:
        txn.put(key.encode(), value, db=env.open_db(b"meta", txn=txn))
    env.close()
    refused(lambda: open_store(path, readonly=True), DamagedStoreError, str(path), key, words)


def test_a_manifest_edited_to_still_parse_fails_its_checksum(tmp_path):
    """The offsets are the exactly-once truth: one changed digit must not pass."""
    path = tmp_path / "s"
    small_state(path)
    env = raw_env(path)
    with env.begin(write=True) as txn:
        meta = env.open_db(b"meta", txn=txn)
        stored = txn.get(b"manifest", db=meta)
        assert b'"t:0": 500' in stored
        txn.put(b"manifest", stored.replace(b'"t:0": 500', b'"t:0": 900'), db=meta)
    env.close()
    refused(lambda: open_store(path, readonly=True), DamagedStoreError, "'manifest' fails its checksum")


@pytest.mark.parametrize("db", ["blobs", "kv", "rows:emb.E:001"])
def test_a_missing_database_is_refused(tmp_path, db):
    path = tmp_path / "s"
    small_state(path)
    env = raw_env(path)
    with env.begin(write=True) as txn:
        txn.drop(env.open_db(db.encode(), txn=txn), delete=True)
    env.close()
    for readonly in (True, False):
        refused(lambda readonly=readonly: open_store(path, CFG, readonly=readonly), DamagedStoreError, f"database '{db}' is missing")


# ---------------------------------------------------------------------------- data.mdb itself

def test_an_empty_data_mdb_is_refused_not_started_afresh(tmp_path):
    path = tmp_path / "s"
    small_state(path)
    os.truncate(path / "data.mdb", 0)
    for readonly in (True, False):
        refused(lambda readonly=readonly: open_store(path, CFG, readonly=readonly), DamagedStoreError, "data.mdb is empty")
    assert os.path.getsize(path / "data.mdb") == 0  # LMDB did not initialise a new environment in it


@pytest.mark.parametrize("keep", [0.5, 0.02])
def test_a_truncated_data_mdb_is_refused_before_it_is_mapped(tmp_path, keep):
    """Was: SIGBUS (exit 135, no output) in inspect and in the worker."""
    path = tmp_path / "s"
    small_state(path)
    size = os.path.getsize(path / "data.mdb")
    os.truncate(path / "data.mdb", int(size * keep))
    out = cli("inspect", "--state", str(path))
    assert out.returncode == 2, (out.returncode, out.stderr)
    assert "cut short" in out.stderr or "too short" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1 and str(path) in out.stderr
    out = cli("worker", "--topic", "t", "--state", str(path), "--bootstrap", "127.0.0.1:1",
              "--set", "store.shards=2", "--until-idle", "1")
    assert out.returncode == 2 and "damaged" in out.stderr and "Traceback" not in out.stderr, out.stderr


def test_check_readable_tells_a_long_lived_reader_its_file_was_cut(tmp_path):
    path = tmp_path / "s"
    ids = small_state(path)
    record = check_readable(path)
    assert record.used_bytes <= os.path.getsize(path / "data.mdb") and record.page_size == 4096
    with open_store(path, readonly=True) as reader:
        assert reader.read_rows("emb.E", ids[:3])[1].all()
        os.truncate(path / "data.mdb", record.used_bytes - 4096)
        # A read now could SIGBUS; the reader asks first (what serve does before each refresh).
        refused(lambda: check_readable(path), DamagedStoreError, "cut short")
    refused(lambda: check_readable(tmp_path / "nowhere"), NotAStoreError, "no data.mdb")


def test_a_missing_data_mdb_is_refused_when_the_directory_held_a_state(tmp_path):
    path = tmp_path / "s"
    small_state(path)
    os.remove(path / "data.mdb")  # lock.mdb and the writer lock's mark remain
    refused(lambda: open_store(path, CFG), DamagedStoreError, "data.mdb is missing")
    os.remove(path / "lock.mdb")  # only the writer lock file, which remembers
    refused(lambda: open_store(path, CFG), DamagedStoreError, "data.mdb is missing")
    assert not (path / "data.mdb").exists()


def test_a_new_state_starts_only_in_an_empty_directory(tmp_path):
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "todo.txt").write_text("x")
    refused(lambda: open_store(tmp_path / "notes", CFG), NotAStoreError, "not empty", "todo.txt")
    assert sorted(os.listdir(tmp_path / "notes")) == ["streamlearn-writer.lock", "todo.txt"]
    # A creation killed before its rename leaves only leftovers: the next writer starts over.
    leftovers = tmp_path / "killed"
    leftovers.mkdir()
    (leftovers / "data.mdb.new").write_bytes(b"\0" * 4096)
    (leftovers / "data.mdb.new-lock").write_bytes(b"")
    with open_store(leftovers, CFG) as store:
        assert store.manifest().step == 0
    assert sorted(os.listdir(leftovers)) == ["data.mdb", "lock.mdb", "streamlearn-writer.lock"]


# ---------------------------------------------------------------------------- pages and rows

READ_ALL = """
import sys
from streamlearn.state import open_store
with open_store(sys.argv[1], readonly=True) as store:
    try:
        sum(len(ids) for ids, _ in store.iter_rows("emb.E"))
    except Exception as exc:
        print(type(exc).__name__, exc)
"""


def test_overwritten_pages_give_a_one_line_error_and_verify_names_the_database(tmp_path):
    """Was: raw lmdb tracebacks. Pages overwritten with garbage in the middle of the file
    (where the rows' B-tree leaves are); the reads run in child processes, since LMDB trusts
    its pages (docs/state.md, "What LMDB does not check")."""
    path = tmp_path / "s"
    small_state(path)
    record = check_readable(path)
    with open(path / "data.mdb", "r+b") as f:
        f.seek(record.page_size * (record.last_page // 3))
        f.write(np.random.default_rng(3).bytes(record.page_size * 8))
    out = subprocess.run([sys.executable, "-c", READ_ALL, str(path)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.startswith("DamagedStoreError"), out
    assert str(path) in out.stdout and "lmdb." not in out.stdout and len(out.stdout.strip().splitlines()) == 1
    out = cli("inspect", "--state", str(path), "--verify")
    assert out.returncode == 1, out.stderr
    assert "DAMAGED" in out.stdout and "database rows:emb.E:" in out.stdout, out.stdout


def test_zeroed_pages_that_make_lmdb_abort_are_named_by_verify_which_goes_on(tmp_path):
    """LMDB asserts (SIGABRT) when a cursor steps onto a zeroed leaf: verify's child dies,
    the database is reported, and the other databases are still checked."""
    path = tmp_path / "s"
    small_state(path)
    record = check_readable(path)
    with open(path / "data.mdb", "r+b") as f:
        f.seek(record.page_size * (record.last_page // 3))
        f.write(bytes(record.page_size * 8))
    env = raw_env(path)
    with env.begin(write=True) as txn:  # and a blob, in another database
        blobs = env.open_db(b"blobs", txn=txn)
        txn.put(b"learner.meta", b"X" + txn.get(b"learner.meta", db=blobs)[1:], db=blobs)
    env.close()
    out = subprocess.run([sys.executable, "-c", READ_ALL, str(path)], capture_output=True, text=True, timeout=60)
    assert out.returncode == -6, out  # what an in-process walk meets (docs/state.md, "What LMDB does not check")
    out = cli("inspect", "--state", str(path), "--verify", "--json")
    assert out.returncode == 1, out.stderr
    problems = json.loads(out.stdout)["verify"]["problems"]
    assert any(p.startswith("database rows:emb.E:") and "SIGABRT" in p for p in problems), problems
    assert "blobs: 1 values fail their checksum (learner.meta)" in problems


def nan_rows_in_place(path, table: str, shards: int) -> int:
    """Every value of ``table`` set to NaN through LMDB (keys, lengths and B-tree intact, the
    stored checksum bytes left as they were); returns the rows changed."""
    env = raw_env(path)
    n = 0
    for shard in range(shards):
        db = env.open_db(f"rows:{table}:{shard:03d}".encode())
        with env.begin(write=True, db=db) as txn:
            for key, value in list(txn.cursor()):
                floats = (len(value) - 8) // 4
                txn.put(key, np.full(floats, np.nan, np.float32).tobytes() + value[-8:])
                n += 1
    env.close()
    return n


def trained(path, *overrides: str) -> tuple[Config, Learner]:
    cfg = Config().override(*SMALL, *overrides)
    with open_store(path, cfg.store) as store:
        learner = open_learner(store, cfg)
        learner.learn_many(stream(64))
        Checkpointer(store, learner, "t").commit({}, cfg)
    return cfg, learner


def test_nan_values_with_the_btree_intact_are_refused_on_restore_and_found_by_verify(tmp_path):
    """Was: restored and trained on."""
    path = tmp_path / "s"
    cfg, _ = trained(path)
    assert nan_rows_in_place(path, "E", 2) > 0
    with open_store(path, cfg.store) as store:
        refused(lambda: open_learner(store, cfg), DamagedStoreError, "table 'E'", "fail their checksum",
                "inspect --verify")
    out = cli("inspect", "--state", str(path), "--verify", "--json")
    assert out.returncode == 1
    verify = json.loads(out.stdout)["verify"]
    assert not verify["ok"] and verify["checksums"] and verify["checked"]["rows"] > 0
    assert any(p.startswith("table E shard") and "fail their checksum" in p for p in verify["problems"])
    assert not any(p.startswith("table P ") for p in verify["problems"])  # only what was hit


def test_bytes_overwritten_in_the_file_are_caught_by_their_checksum(tmp_path):
    """No LMDB call at all: the row's bytes changed in place on disk, page intact."""
    path = tmp_path / "s"
    ids = small_state(path)
    with open_store(path, readonly=True) as store:
        row = store.read_rows("emb.E", ids[10:11])[0][0]
    blob = (path / "data.mdb").read_bytes()
    at = blob.find(row.tobytes())
    assert at > 0 and blob.count(row.tobytes()) == 1
    with open(path / "data.mdb", "r+b") as f:
        f.seek(at + 4)
        f.write(np.float32(np.nan).tobytes())
    with open_store(path, readonly=True) as store:
        refused(lambda: store.read_rows("emb.E", ids[:20]), DamagedStoreError, f"ids {ids[10]}")
        assert store.read_rows("emb.E", ids[:10])[1].all()  # the others still read
        report = store.verify()
    assert not report.ok and report.lines() == [f"table emb.E shard {int(_shard(ids[10]))}: 1 rows fail their "
                                                f"checksum ({ids[10]})"]


def _shard(row_id: int) -> int:
    from streamlearn.state import shard_of

    return int(shard_of(np.array([row_id]), CFG.shards)[0])


def test_a_damaged_blob_or_kv_value_is_refused(tmp_path):
    path = tmp_path / "s"
    small_state(path)
    env = raw_env(path)
    with env.begin(write=True) as txn:
        blobs, kv = env.open_db(b"blobs", txn=txn), env.open_db(b"kv", txn=txn)
        txn.put(b"learner.meta", b"M" + txn.get(b"learner.meta", db=blobs)[1:], db=blobs)
        key = b"history\x00user"
        txn.put(key, txn.get(key, db=kv)[:-1] + b"\xff", db=kv)
    env.close()
    with open_store(path, readonly=True) as store:
        refused(lambda: store.read_blob("learner.meta"), DamagedStoreError, "blob 'learner.meta'")
        refused(lambda: list(store.iter_kv("history")), DamagedStoreError, "kv entry history/")
        lines = store.verify().lines()
    assert lines == ["blobs: 1 values fail their checksum (learner.meta)",
                     "kv: 1 values fail their checksum (b'history/user')"]


def test_a_healthy_state_verifies_clean(tmp_path):
    path = tmp_path / "s"
    trained(path)
    out = cli("inspect", "--state", str(path), "--verify")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "verify   OK" in out.stdout and "against their xxh3_64 checksums" in out.stdout
    assert "values checked by xxh3_64" in out.stdout


@pytest.mark.parametrize("task", ["next-token", "mlm", "next-item"])
def test_a_healthy_count_part_verifies_clean_though_its_keys_read_as_nan(tmp_path, task):
    """Was: DAMAGED. A count table's float32 words hold hashed keys and codes, and some read
    as NaN; verify leaves them out of the finite check (their checksums still hold them)."""
    path = tmp_path / "s"
    sized = ("model.out_B=64",) if task == "next-item" else ()  # no warm-up window here to derive it
    cfg = Config().override(*SMALL, f"learner.task={task}", "model.count_slots=4096", *sized)
    records = ([{"key": f"u{i % 7}", "item": f"i{(i * 5) % 11}"} for i in range(400)] if task == "next-item"
               else [{"text": r["text"]} for r in stream(200)])
    with open_store(path, cfg.store) as store:
        learner = open_learner(store, cfg)
        learner.learn_many(records)
        Checkpointer(store, learner, "t").commit({}, cfg)
        words = checkpoint.stored_word_tables(store)
        tables = learner.task.count_tables()
        assert words and set(words) <= set(tables), (words, sorted(tables))
        keys = np.concatenate([tables[name].numpy().reshape(-1) for name in words])
        assert not np.isfinite(keys).all()  # the case itself: some key words read as NaN
    out = cli("inspect", "--state", str(path), "--verify")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "verify   OK" in out.stdout


# ---------------------------------------------------------------------------- a state written before checksums

def write_schema1_state(path, ids: np.ndarray, values: np.ndarray) -> None:
    """The layout every streamlearn before schema 2 wrote: the same databases, values with no
    checksum (docs/state.md, "Values and their checksums")."""
    from streamlearn.state import shard_of

    os.makedirs(path)
    env = lmdb.open(str(path), max_dbs=64, map_size=2**26)
    manifest = {"step": 3, "offsets": {"t:0": 30}, "records_applied": {"t:0": 30}, "config": None,
                "metrics": None, "committed_at": 1.0, "commits": 1}
    with env.begin(write=True) as txn:
        meta = env.open_db(b"meta", txn=txn)
        for key, value in ((b"format", b"streamlearn-state"), (b"schema_version", b"1"), (b"shards", b"2"),
                           (b"shard_fn", b"splitmix64-mod"), (b"manifest", json.dumps(manifest).encode()),
                           (b"tables", json.dumps({E.name: {"rows": E.rows, "width": E.width,
                                                           "dtype": E.dtype}}).encode())):
            txn.put(key, value, db=meta)
        txn.put(b"dense", b"weights", db=env.open_db(b"blobs", txn=txn))
        env.open_db(b"kv", txn=txn)
        shards = shard_of(ids, 2)
        for s in range(2):
            db = env.open_db(f"rows:{E.name}:{s:03d}".encode(), txn=txn)
            for i, v in zip(ids[shards == s].tolist(), values[shards == s]):
                txn.put(i.to_bytes(8, "big"), v.tobytes(), db=db)
    env.close()


def test_a_state_written_before_checksums_still_opens_and_says_what_it_cannot_check(tmp_path):
    path = tmp_path / "old"
    ids = np.arange(0, 3000, 3)
    values = np.random.default_rng(0).standard_normal((len(ids), E.width)).astype(np.float32)
    write_schema1_state(path, ids, values)
    with open_store(path, CFG) as store:  # a writer keeps its encoding
        assert store.manifest().schema_version == 1 and store.manifest().offsets == {"t:0": 30}
        np.testing.assert_array_equal(store.read_rows("emb.E", ids)[0], values)
        assert store.read_blob("dense") == b"weights"
        store.commit(Checkpoint(step=4, offsets={"t:0": 40}, rows={"emb.E": (ids[:5], values[:5] + 1)}))
        np.testing.assert_array_equal(store.read_rows("emb.E", ids[:5])[0], values[:5] + 1)
    out = cli("inspect", "--state", str(path), "--verify")
    assert out.returncode == 0 and "no checksums" in out.stdout and "schema 1 stores no checksums" in out.stdout
    nan_rows_in_place_raw(path)
    out = cli("inspect", "--state", str(path), "--verify")
    assert out.returncode == 1 and "rows hold NaN or infinite values" in out.stdout  # still seen without checksums


def nan_rows_in_place_raw(path) -> None:
    env = raw_env(path)
    for s in range(2):
        db = env.open_db(f"rows:{E.name}:{s:03d}".encode())
        with env.begin(write=True, db=db) as txn:
            for key, value in list(txn.cursor()):
                txn.put(key, np.full(len(value) // 4, np.nan, np.float32).tobytes())
    env.close()


# ---------------------------------------------------------------------------- reset

def test_reset_moves_the_old_state_aside_and_says_what_it_held(tmp_path, caplog):
    path = tmp_path / "s"
    small_state(path, step=7)
    with caplog.at_level(logging.WARNING, logger="streamlearn.state.lmdb_store"):
        with open_store(path, CFG, reset=True) as store:
            assert store.manifest().step == 0 and store.tables() == {}
            assert "step 7, 1 commits, offsets {'t:0': 500}" in store.discarded
    assert any("discarded the previous state" in r.getMessage() for r in caplog.records)
    aside = [n for n in os.listdir(path) if n.startswith("discarded-")]
    assert len(aside) == 1 and sorted(os.listdir(path / aside[0])) == ["data.mdb", "lock.mdb"]
    with open_store(path / aside[0], readonly=True) as old:  # nothing lost: the operator can go back
        assert old.manifest().step == 7


def test_reset_starts_over_from_a_damaged_state_but_never_moves_foreign_files(tmp_path):
    path = tmp_path / "s"
    small_state(path)
    os.truncate(path / "data.mdb", 0)
    with open_store(path, CFG, reset=True) as store:
        assert store.manifest().step == 0 and "unreadable" in store.discarded and "empty" in store.discarded
    refused(lambda: open_store(path, readonly=True, reset=True), StateError, "only a writer")
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "thesis.tex").write_text("x")
    refused(lambda: open_store(tmp_path / "mine", CFG, reset=True), NotAStoreError, "thesis.tex")
    assert (tmp_path / "mine" / "thesis.tex").read_text() == "x"


def test_reset_on_the_memory_backend_starts_a_new_state():
    with open_store("mem-reset", backend="memory") as a:
        a.commit(Checkpoint(step=3))
        with open_store("mem-reset", backend="memory", reset=True) as b:
            assert b.manifest().step == 0 and "step 3" in b.discarded and b.verify().ok


# ---------------------------------------------------------------------------- the worker, end to end

def worker_args(broker: str, group: str, topic: str, state, *extra: str) -> list[str]:
    sets = [arg for item in SMALL for arg in ("--set", item)]
    return ["worker", "--topic", topic, "--state", str(state), "--bootstrap", broker, "--group", group,
            "--until-idle", "1", *sets, *extra]


def test_the_worker_refuses_a_damaged_state_and_reset_learns_every_record_once(
        broker, make_topic, group, tmp_path, capsys, caplog):
    topic = make_topic(2)
    ends = produce(broker, topic, stream(300))
    state = tmp_path / "s"
    assert cli_main(worker_args(broker, group, topic, state)) == 0
    env = raw_env(state)
    with env.begin(write=True) as txn:
        txn.delete(b"format", db=env.open_db(b"meta", txn=txn))
    env.close()
    before = digest(state)
    capsys.readouterr()
    assert cli_main(worker_args(broker, group, topic, state)) == 2  # was: exit 0, offset 0, learned twice
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "'format' is missing" in err and "--reset" in err
    assert digest(state) == before

    more = produce(broker, topic, stream(100, seed=1))
    ends = {p: ends.get(p, 0) + more.get(p, 0) for p in set(ends) | set(more)}
    with caplog.at_level(logging.WARNING):
        assert cli_main(worker_args(broker, group, topic, state, "--reset")) == 0
    assert any("discarded the previous state" in r.getMessage() for r in caplog.records)
    with open_store(state, readonly=True) as store:
        m = store.manifest()
        assert offsets_of(m.records_applied, topic) == ends == offsets_of(m.offsets, topic)
        assert m.metrics["records_learned"] == 400 and applied_once(list(read_audit(store)), ends)


def fill(directory, leave: int = 0) -> None:
    """Fill the filesystem of ``directory`` until about ``leave`` bytes are free (0: until
    the kernel says ENOSPC)."""
    fd = os.open(os.path.join(directory, "filler"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        while True:
            st = os.statvfs(directory)
            room = st.f_bavail * st.f_frsize - leave
            if room <= 0:
                return
            os.write(fd, bytes(min(room, 2**20)))
    except OSError:
        return
    finally:
        os.close(fd)


def unfill(directory) -> None:
    os.remove(os.path.join(directory, "filler"))


BIG_P = "embedding.K=200000"  # every row of P and its Adagrad state: about 30 MB on disk


def test_a_retry_after_a_full_disk_writes_only_the_dirty_rows_and_loses_none(tmpfs):
    """Was: every retry rewrote every row, which needs room for the whole state again."""
    disk = tmpfs("24m")
    cfg = Config().override(*SMALL, BIG_P, "store.map_size_gb=0.1")
    with open_store(disk / "s", cfg.store) as store:
        learner = open_learner(store, cfg)
        ckpt = Checkpointer(store, learner, "t")
        learner.learn_many(stream(16))
        ckpt.commit({}, cfg)
        fill(disk)
        learner.learn_many(stream(16, seed=1))
        with pytest.raises(DiskFullError, match="free disk space"):
            ckpt.commit({}, cfg)
        failed_rows = ckpt.last_rows
        unfill(disk)
        fill(disk, leave=6 * 2**20)  # room for the dirty rows, not for a rewrite of every row
        learner.learn_many(stream(16, seed=2))
        ckpt.commit({}, cfg)
        assert failed_rows <= ckpt.last_rows < failed_rows + 2000
        assert store.manifest().commits == 2
    with open_store(disk / "s", cfg.store, readonly=True) as store:
        restored = checkpoint.read_full(store, cfg)
    for name, table in learner.row_tables().items():  # nothing lost: the failed commit's rows too
        assert torch.equal(restored.row_tables()[name], table), name
    assert restored.steps == learner.steps


def test_a_worker_resumes_checkpointing_once_the_disk_has_room_without_a_restart(
        broker, make_topic, group, tmpfs):
    disk = tmpfs("24m")
    topic = make_topic(1)
    first = produce(broker, topic, wide_stream(200))[0]
    cfg = Config().override(*SMALL, BIG_P, "store.map_size_gb=0.1", f"worker.bootstrap={broker}",
                            f"worker.group={group}", "worker.checkpoint_seconds=0.3", "worker.checkpoint_every=100")
    worker = Worker(cfg, RunOptions(topic, str(disk / "s")))
    registry = worker.metrics.registry
    result = {}
    thread = threading.Thread(target=lambda: result.update(summary=worker.run()))
    thread.start()
    try:
        wait_for(lambda: committed_offset(disk / "s", topic) == first)
        fill(disk)
        produce(broker, topic, wide_stream(200, seed=1))  # new tokens: new rows, new pages
        wait_for(lambda: (registry.get_sample_value("streamlearn_worker_checkpoint_failures_total") or 0) >= 2)
        assert committed_offset(disk / "s", topic) == first
        unfill(disk)
        fill(disk, leave=6 * 2**20)
        wait_for(lambda: committed_offset(disk / "s", topic) == first + 200)
    finally:
        worker.stop()
        thread.join(30)
    assert result["summary"].saved and result["summary"].records == 400
    with open_store(disk / "s", readonly=True) as store:
        m = store.manifest()
        assert m.metrics["records_learned"] == 400 and offsets_of(m.records_applied, topic) == {0: first + 200}
        assert applied_once(list(read_audit(store)), {0: first + 200})


def wide_stream(n: int, seed: int = 0) -> list[dict]:
    """Records of rare random tokens: each one dirties rows no other record touched."""
    rng = np.random.default_rng(seed)
    return [{"text": " ".join(f"w{t}" for t in rng.integers(0, 10**6, 8)), "label": f"c{i % 3}"}
            for i in range(n)]


def committed_offset(state, topic: str) -> int | None:
    try:
        with open_store(state, readonly=True) as store:
            return offsets_of(store.manifest().offsets, topic).get(0)
    except NotAStoreError:
        return None


def wait_for(condition, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


def test_a_stop_signal_waits_until_resets_moves_are_done():
    """--reset moves data.mdb and then lock.mdb aside: a SIGTERM between the two (the worker
    stops at once during start-up) left a state read as damaged. The moves hold it back."""
    import signal

    from streamlearn.state.lmdb_store import hold_stop_signals

    import threading
    import time

    got: list[int] = []
    busy = threading.Event()  # another thread, as a worker has: it may take the signal at the OS level
    threading.Thread(target=lambda: busy.wait(10), daemon=True).start()
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: got.append(signum))
    try:
        with hold_stop_signals():
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.1)
            assert got == []  # held back (was: taken by the other thread, run at once)
        assert got == [signal.SIGTERM]  # delivered once the moves are done
    finally:
        busy.set()
        signal.signal(signal.SIGTERM, previous)
