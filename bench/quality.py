"""Prequential quality on real streams, each against its peer measured in the same run.

    python bench/quality.py [--quick] [--out results.json] [--threads 2] [--data /work/shared/data]

Protocol: for each mini-batch of B records in stream order, predict all of them, then
learn the batch (one optimizer step); one pass. Streams from --data (skipped when absent):

1. SMS Spam Collection (5,574) and AG News (5,581 = the 5,000-row sample, then the first
   581 rows): accuracy of the library defaults, of defaults + word bigrams and of
   defaults + the Naive Bayes part (learner.nb_weight=0.2) (3 seeds each; --quick: 1)
   and of a 1-layer transformer, against river MultinomialNB on
   BagOfWords(lowercase) (predict_one then learn_one, same order) and Vowpal Wabbit
   --oaa --ngram 2 when installed. A record whose label first appears in its batch
   counts as a miss. Target: accuracy >= NB.
2. MovieLens 100K as next-item events in timestamp order: recall@10 over the items seen
   so far, excluding the user's rated items, against first-order Markov and popularity
   (same candidates, same exclusion). Target: >= 1.2x Markov. --quick: first 30,000 events.
3. Synthetic set completion (Superbloom's claim), heavy hashing: --set-ids ids (4,000;
   20,000 learns nothing measurable in a few minutes) in clusters of 20, a Bloom input
   of B = ids / 20 rows (20 ids per row and hash), m = 2, tied output; models of 0 to 3
   layers with the same transformer parameter count (0 = the bag, CBOW); recall@1/@10 of
   one masked id per set, overall and per quarter of the stream. Target: 2+ layers clearly
   above 1 layer. 300,000 sets; --quick: 20,000.
4. Step cost: median learn_batch time of the text and the MovieLens configurations
   against the same configuration with embedding.scheme=plain (a bounded-dictionary
   nn.Embedding table of the same width d, same optimizer), interleaved; records/s of
   every configuration come from its own run (learn_batch time only).

Prints a markdown table; --out writes every figure as JSON.
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import quality_eval as ev  # noqa: E402
import quality_streams as streams  # noqa: E402

TEXT_BATCH = 16  # the default learner.batch_size
TEXT_CONFIGS = {  # on top of the library defaults (depth 0; docs/choosing-a-configuration.md)
    "defaults": (),
    "defaults + bigrams": ("hashing.ngrams=2",),
    "defaults + Naive Bayes part": ("learner.nb_weight=0.2",),
    "1 layer": ("model.layers=1",),
}
SEEDS = (0, 1, 2)

NEXT_ITEM = ("model.tie_output=false", "model.out_B=4096", "embedding.K=100000", "embedding.B=20000",
             "optim.dense_lr=0.01")
NEXT_ITEM_BATCH = 256

SET_CLUSTER, SET_SIZES = 20, (4, 10)
SET_BASE = ("embedding.m=2", "embedding.scheme=bloom", "embedding.d=32", "model.d_model=32", "model.heads=4",
            "optim.sparse_lr=0.05", "optim.dense_lr=0.002")
SET_DEPTHS = {0: 320, 1: 320, 2: 128, 3: 64}  # layers -> ffn: equal transformer parameters for 1..3
SET_BATCH = 128


def seeded(overrides, seed: int) -> tuple[str, ...]:
    return (*overrides, f"learner.seed={seed}", f"hashing.seed={seed}")


def text_results(name: str, records: list[dict], quick: bool) -> dict:
    """Every text configuration on one stream, with its peers."""
    out = {"dataset": name, "records": len(records), "batch": TEXT_BATCH, "configs": {}}
    for label, overrides in TEXT_CONFIGS.items():
        seeds = SEEDS[:1] if quick or label == "1 layer" else SEEDS
        runs = [ev.classify(records, seeded(overrides, s), TEXT_BATCH) for s in seeds]
        accs = [r["accuracy"] for r in runs]
        out["configs"][label] = {
            "overrides": list(overrides), "seeds": list(seeds), "accuracy_per_seed": accs,
            "accuracy": sum(accs) / len(accs), "accuracy_min": min(accs), "params": runs[0]["params"],
            "learn_records_per_s": sum(r["learn_records_per_s"] for r in runs) / len(runs)}
    out["river_nb"] = streams.river_nb(records)
    out["vw_oaa_bigrams"] = streams.vw_oaa(records)
    return out


def set_results(quick: bool, n_ids: int, n_sets: int | None = None) -> dict:
    sets = streams.set_stream(n_ids, SET_CLUSTER, n_sets or (20_000 if quick else 300_000), SET_SIZES)
    base = (*SET_BASE, f"embedding.B={n_ids // 20}")
    out = {"ids": n_ids, "cluster": SET_CLUSTER, "set_sizes": list(SET_SIZES), "records": len(sets),
           "ids_per_row_and_hash": 20, "models": {}, "ids_sharing_their_digest": shared_digests(base, n_ids)}
    for layers, ffn in SET_DEPTHS.items():
        overrides = (*base, f"model.layers={layers}", f"model.ffn={ffn}")
        r = ev.set_completion(sets, overrides, SET_BATCH, eval_rows=32)
        r["overrides"] = list(overrides)
        out["models"][f"{layers} layers"] = r
    return out


def shared_digests(overrides, n_ids: int) -> float:
    """Share of the ids whose Bloom digest (the set of their m rows) another id also has:
    no model can tell those apart, whatever its depth."""
    model = ev.learner("mlm", overrides, SET_BATCH).model
    digests = np.sort(model.embedding.hash_ids([f"id{i}" for i in range(n_ids)]), axis=1)  # (n_ids, m)
    _, inverse, counts = np.unique(digests, axis=0, return_inverse=True, return_counts=True)
    return float((counts[inverse.ravel()] > 1).mean())


def step_costs(text: list[dict] | None, events: list[dict] | None, quick: bool) -> dict:
    steps = 40 if quick else 150
    out = {}
    if text:
        out["text"] = ev.step_cost(text, "classify", (), TEXT_BATCH, steps)
    if events:
        out["next-item"] = ev.step_cost(events, "next-item", NEXT_ITEM, NEXT_ITEM_BATCH, steps // 3)
    return out


# ---------------------------------------------------------------------------- report

def table(results: dict) -> str:
    rows = ["| stream | streamlearn | peer | ratio | target | met | learn_many records/s |", "|---|---|---|---|---|---|---|"]
    for key in ("sms", "ag_news"):
        r = results.get(key)
        if not r:
            continue
        vw = r["vw_oaa_bigrams"]
        peer = f"NB {r['river_nb']:.4f}" + (f", VW {vw:.4f}" if vw is not None else ", VW not installed")
        for label, c in r["configs"].items():
            ratio = c["accuracy"] / r["river_nb"]
            acc = f"{c['accuracy']:.4f}" + (f" (min {c['accuracy_min']:.4f}, {len(c['seeds'])} seeds)" if len(c["seeds"]) > 1 else "")
            rows.append(f"| {r['dataset']} accuracy, {label} | {acc} | {peer} | {ratio:.3f} x NB | >= 1.0 x NB | "
                        f"{'yes' if ratio >= 1 else 'NO'} | {c['learn_records_per_s']:,.0f} |")
    m = results.get("movielens")
    if m:
        ratio = m["recall@10_model"] / m["recall@10_markov"]
        rows.append(f"| MovieLens recall@10 ({m['events']:,} events) | {m['recall@10_model']:.4f} | "
                    f"Markov {m['recall@10_markov']:.4f}, popularity {m['recall@10_popularity']:.4f} | "
                    f"{ratio:.2f} x Markov | >= 1.2 x Markov | {'yes' if ratio >= 1.2 else 'NO'} | "
                    f"{m['learn_records_per_s']:,.0f} |")
    s = results.get("sets")
    if s:
        one = s["models"]["1 layers"]["recall@10_last_quarter"]
        for name, r in s["models"].items():
            rows.append(f"| sets, {name} ({r['params']:,} params) recall@1 / @10 (last quarter) | "
                        f"{r['recall@1']:.4f} / {r['recall@10']:.4f} ({r['recall@1_last_quarter']:.4f} / "
                        f"{r['recall@10_last_quarter']:.4f}) | 1 layer @10: {one:.4f} | - | 2+ layers > 1 layer | - | "
                        f"{r['learn_records_per_s']:,.0f} |")
    lines = ["\n".join(rows)]
    if m:
        b = m["beam"]
        lines.append(f"MovieLens beam check: public topk_many (beam {b['beam']}) certified exact on "
                     f"{b['certified_exact']:.1%} and equal to exhaustive top-10 on {b['same_top_k_as_exhaustive']:.1%} "
                     f"of {b['queries']} user queries")
    if s:
        lines.append("sets recall@10 by quarter of the stream: " + "; ".join(
            f"{name}: " + " ".join(f"{x:.4f}" for x in r["recall@10_by_quarter"]) for name, r in s["models"].items()))
        lines.append(f"sets: {s['ids']:,} ids in clusters of {s['cluster']}, {s['ids_per_row_and_hash']} ids per row "
                     f"and hash, {s['ids_sharing_their_digest']:.1%} of ids share their whole digest; "
                     f"{s['records']:,} sets of {s['set_sizes'][0]}-{s['set_sizes'][1]} ids")
    for name, c in results.get("step_cost", {}).items():
        lines.append(f"step cost {name}: {c['step_ms']:.2f} ms vs plain nn.Embedding scheme {c['plain_step_ms']:.2f} ms "
                     f"= {c['ratio']:.2f}x (batch {c['batch']}, median of {c['steps']})")
    return "\n\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1 seed, 30k MovieLens events, 20k sets")
    parser.add_argument("--out", type=Path, help="write the results as JSON here")
    parser.add_argument("--threads", type=int, default=2, help="torch intra-op threads (default 2)")
    parser.add_argument("--data", type=Path, default=Path("/work/shared/data"))
    parser.add_argument("--set-ids", type=int, default=4_000, help="ids of the synthetic set stream (default 4,000)")
    parser.add_argument("--sets", type=int, help="length of the synthetic set stream (default 300,000; --quick 20,000)")
    parser.add_argument("--only", nargs="*", choices=("sms", "ag_news", "movielens", "sets", "step_cost"))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    want = set(args.only or ("sms", "ag_news", "movielens", "sets", "step_cost"))
    results: dict = {"quick": args.quick, "torch_threads": torch.get_num_threads(), "torch": torch.__version__,
                     "python": platform.python_version(), "seconds": {}}
    loaders = {"sms": streams.sms, "ag_news": streams.ag_news}
    data = {}
    for key, load in loaders.items():
        try:
            data[key] = load(args.data)
        except Exception as exc:  # a missing or unreadable file skips that stream, said so
            print(f"skipping {key}: {exc}", file=sys.stderr)
    try:
        events = streams.movielens(args.data)
        data["movielens"] = events[:30_000] if args.quick else events
    except Exception as exc:
        print(f"skipping movielens: {exc}", file=sys.stderr)
    for key in ("sms", "ag_news"):
        if key in want and key in data:
            t = time.perf_counter()
            results[key] = text_results({"sms": "SMS", "ag_news": "AG News"}[key], data[key], args.quick)
            results["seconds"][key] = time.perf_counter() - t
    if "movielens" in want and "movielens" in data:
        t = time.perf_counter()
        results["movielens"] = ev.next_item(data["movielens"], NEXT_ITEM, NEXT_ITEM_BATCH)
        results["movielens"]["overrides"] = list(NEXT_ITEM)
        results["seconds"]["movielens"] = time.perf_counter() - t
    if "sets" in want:
        t = time.perf_counter()
        results["sets"] = set_results(args.quick, args.set_ids, args.sets)
        results["seconds"]["sets"] = time.perf_counter() - t
    if "step_cost" in want:
        t = time.perf_counter()
        results["step_cost"] = step_costs(data.get("ag_news"), data.get("movielens"), args.quick)
        results["seconds"]["step_cost"] = time.perf_counter() - t
    print(table(results))
    print(f"\ntorch threads {results['torch_threads']}; seconds per part: "
          + ", ".join(f"{k} {v:.0f}" for k, v in results["seconds"].items()))
    if args.out:
        args.out.write_text(json.dumps(results, indent=2, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
