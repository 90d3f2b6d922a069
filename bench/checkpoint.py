"""Checkpoint and snapshot-read throughput of the LMDB store, each against bare py-lmdb on
the same rows in the same run.

    python bench/checkpoint.py [--rows 1000000] [--width 64] [--reps 5] [--dir DIR]

Measures (d = --width float32 rows, a table of --rows rows, store.sync=True for both):

1. full-table write: every row, into the empty table and again over it (what a
   non-incremental checkpoint costs), Store.commit vs bare putmulti;
2. incremental checkpoints of 1% and 10% dirty rows (random ids): Store.commit rows/s vs a
   bare ``cursor.putmulti`` of the same rows (keys sorted, one txn) -> ratio, target >= 0.5;
   and the 1%-dirty commit time / full-table overwrite time, target <= 5%;
3. random row reads from a read-only snapshot in batches: Store.read_rows rows/s vs bare
   ``txn.get`` per key (one short txn per batch, values joined into one numpy buffer)
   -> ratio, target >= 0.5;
4. a learner's restore: Store.load_table of the whole table (every row read and its
   checksum checked) vs a bare cursor scan into the same array -> ratio.

The store's values carry an 8-byte checksum each (schema 2) that the bare rows do not, so
the ratios include its cost (encoding on commit, checking on every read).

Bare references get the fastest encoding we know (``.view("V8").tolist()`` for keys,
``.view("V{bytes}").tolist()`` for values), so the ratios measure the store's own overhead:
sharding, validation, manifest, found-mask. Times are medians over --reps.
"""
from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from itertools import islice
from pathlib import Path

import lmdb
import numpy as np

from options import at_least, between, parser_for, positive_int, run_main
from streamlearn.config import MAX_SHARDS, StoreConfig
from streamlearn.state import Checkpoint, TableSpec, open_store


def bare_items(ids: np.ndarray, values: np.ndarray):
    """(key, value) pairs sorted by key, encoded the fastest way we know."""
    order = np.argsort(ids)
    keys = ids[order].astype(">u8").view("V8").tolist()
    rows = values.view(f"V{values.shape[1] * values.itemsize}").ravel()
    return zip(keys, np.take(rows, order).tolist())


def bare_write(env: lmdb.Environment, db, ids: np.ndarray, values: np.ndarray) -> float:
    t = time.perf_counter()
    items = bare_items(ids, values)
    with env.begin(write=True, db=db) as txn:
        with txn.cursor() as cur:
            cur.putmulti(items)
    return time.perf_counter() - t


def store_write(store, table: str, step: int, ids: np.ndarray, values: np.ndarray) -> float:
    t = time.perf_counter()
    store.commit(Checkpoint(step=step, offsets={"bench:0": step}, records_applied={"bench:0": step},
                            rows={table: (ids, values)}))
    return time.perf_counter() - t


def bare_read(env: lmdb.Environment, db, ids: np.ndarray, width: int) -> np.ndarray:
    keys = ids.astype(">u8").view("V8").tolist()
    with env.begin(db=db) as txn:  # bytes: faster than buffers=True views in py-lmdb
        get = txn.get
        buf = bytearray().join([get(k) for k in keys])
    return np.frombuffer(buf, np.float32).reshape(-1, width)


def timed(fn, batches) -> float:
    t = time.perf_counter()
    for b in batches:
        fn(b)
    return time.perf_counter() - t


def main() -> None:
    ap = parser_for(__doc__)
    ap.add_argument("--rows", type=at_least(100), default=1_000_000,
                    help="rows in the table, at least 100 so that 1%% is a row (default %(default)s)")
    ap.add_argument("--width", type=positive_int, default=64, help="float32 values per row (default %(default)s)")
    ap.add_argument("--reps", type=positive_int, default=5, help="timed runs of each measure, the median kept "
                    "(default %(default)s)")
    ap.add_argument("--shards", type=between(1, MAX_SHARDS), default=8,
                    help="the store's shards, store.shards (default %(default)s)")
    ap.add_argument("--dir", default=None, help="scratch directory (default: a temp dir)")
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="bench-checkpoint-", dir=args.dir))
    try:
        results = run(args, root)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(summary(results))
    print(json.dumps(results, sort_keys=True))


def summary(r: dict) -> str:
    lines = [
        f"table {r['rows']} x {r['width']} float32, {r['shards']} shards, sync=True, median of {r['reps']}",
        "| measure | store | bare lmdb | ratio (target) |",
        "|---|---|---|---|",
    ]
    for frac, key in (("1%", "dirty_0.01"), ("10%", "dirty_0.1")):
        d = r[key]
        lines.append(f"| checkpoint {frac} dirty ({d['rows']} rows), rows/s | {d['store_rows_per_s']:,.0f} | "
                     f"{d['bare_rows_per_s']:,.0f} | {d['ratio']:.2f} (>= 0.5) |")
    full = r["full_overwrite_s"]
    lines.append(f"| full-table overwrite, s | {full['store']:.2f} | {full['bare']:.2f} | |")
    lines.append(f"| full-table first write, s | {r['full_insert_s']['store']:.2f} | {r['full_insert_s']['bare']:.2f} | |")
    lines.append(f"| 1%-dirty commit / full overwrite | {r['dirty_1pct_over_full_overwrite']:.1%} | | (<= 5%) |")
    for key, d in r["reads"].items():
        lines.append(f"| snapshot reads, {key.replace('_', ' ')}, rows/s | {d['store_rows_per_s']:,.0f} | "
                     f"{d['bare_rows_per_s']:,.0f} | {d['ratio']:.2f} (>= 0.5) |")
    d = r["restore"]
    lines.append(f"| restore (load_table, every row), rows/s | {d['store_rows_per_s']:,.0f} | "
                 f"{d['bare_rows_per_s']:,.0f} | {d['ratio']:.2f} |")
    return "\n".join(lines)


def run(args: argparse.Namespace, root: Path) -> dict:
    N, d = args.rows, args.width
    rng = np.random.default_rng(0)
    table = TableSpec("emb.E", rows=N, width=d)
    full = rng.standard_normal((N, d), dtype=np.float32)  # (N, d)
    all_ids = np.arange(N)
    cfg = StoreConfig(shards=args.shards, map_size_gb=16.0, sync=True)
    env = lmdb.open(str(root / "bare"), map_size=16 << 30, max_dbs=2, sync=True)
    db = env.open_db(b"emb")
    out: dict = {"rows": N, "width": d, "shards": args.shards, "reps": args.reps}
    step = 0
    with open_store(root / "store", cfg) as store:
        store.declare_tables([table])
        step += 1
        out["full_insert_s"] = {"store": store_write(store, table.name, step, all_ids, full),
                                "bare": bare_write(env, db, all_ids, full)}
        over_s, over_b = [], []
        for _ in range(max(1, args.reps // 2)):
            step += 1
            over_s.append(store_write(store, table.name, step, all_ids, full))
            over_b.append(bare_write(env, db, all_ids, full))
        out["full_overwrite_s"] = {"store": statistics.median(over_s), "bare": statistics.median(over_b)}
        for frac in (0.01, 0.1):
            st, bt = [], []
            for rep in range(args.reps):
                ids = rng.choice(N, int(N * frac), replace=False)
                vals = rng.standard_normal((len(ids), d), dtype=np.float32)
                step += 1
                if rep % 2:  # alternate who goes first: page cache and allocator warm-up
                    bt.append(bare_write(env, db, ids, vals))
                    st.append(store_write(store, table.name, step, ids, vals))
                else:
                    st.append(store_write(store, table.name, step, ids, vals))
                    bt.append(bare_write(env, db, ids, vals))
            n = int(N * frac)
            s_med, b_med = statistics.median(st), statistics.median(bt)
            out[f"dirty_{frac:g}"] = {
                "rows": n, "store_s": s_med, "bare_s": b_med,
                "store_rows_per_s": n / s_med, "bare_rows_per_s": n / b_med, "ratio": b_med / s_med,
            }
    out["dirty_1pct_over_full_overwrite"] = out["dirty_0.01"]["store_s"] / out["full_overwrite_s"]["store"]
    out["dirty_1pct_over_full_insert"] = out["dirty_0.01"]["store_s"] / out["full_insert_s"]["store"]
    env.close()
    reads = read_bench(root, cfg, table, rng, args.reps)
    out["restore"] = reads.pop("restore")
    out["reads"] = reads
    return out


def read_bench(root: Path, cfg: StoreConfig, table: TableSpec, rng, reps: int) -> dict:
    env = lmdb.open(str(root / "bare"), readonly=True, max_dbs=2, map_size=0)
    db = env.open_db(b"emb", create=False)
    results = {}
    with open_store(root / "store", cfg, readonly=True) as store:
        check = rng.integers(0, table.rows, 1000)
        assert np.array_equal(store.read_rows(table.name, check)[0], bare_read(env, db, check, table.width))
        for batch in (64, 1024):
            n_batches = max(1, 200_000 // batch)
            st, bt = [], []
            for _ in range(reps):
                batches = [rng.integers(0, table.rows, batch) for _ in range(n_batches)]
                st.append(timed(lambda b: store.read_rows(table.name, b), batches))
                bt.append(timed(lambda b: bare_read(env, db, b, table.width), batches))
            n = batch * n_batches
            s_med, b_med = statistics.median(st), statistics.median(bt)
            results[f"batch_{batch}"] = {"store_rows_per_s": n / s_med, "bare_rows_per_s": n / b_med,
                                         "ratio": b_med / s_med}
        results["restore"] = restore_bench(store, env, db, table, reps)
    env.close()
    return results


def restore_bench(store, env: lmdb.Environment, db, table: TableSpec, reps: int) -> dict:
    out = np.zeros((table.rows, table.width), np.float32)  # (N, d)
    st, bt = [], []
    for _ in range(max(1, reps // 2)):
        t = time.perf_counter()
        n = store.load_table(table.name, out)
        st.append(time.perf_counter() - t)
        bt.append(bare_scan(env, db, out))
    s_med, b_med = statistics.median(st), statistics.median(bt)
    return {"rows": n, "store_s": s_med, "bare_s": b_med, "store_rows_per_s": n / s_med,
            "bare_rows_per_s": n / b_med, "ratio": b_med / s_med}


def bare_scan(env: lmdb.Environment, db, out: np.ndarray, batch: int = 65536) -> float:
    """Every row by cursor, in batches joined into numpy, as the store restores."""
    t = time.perf_counter()
    with env.begin(db=db) as txn:
        cur = txn.cursor()
        cur.first()
        pairs = iter(cur.iternext())
        while chunk := list(islice(pairs, batch)):
            ids = np.frombuffer(b"".join(k for k, _ in chunk), ">u8").astype(np.int64)
            out[ids] = np.frombuffer(bytearray().join(v for _, v in chunk), np.float32).reshape(len(chunk), -1)
    return time.perf_counter() - t


if __name__ == "__main__":
    sys.exit(run_main(main))
