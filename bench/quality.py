"""Prequential quality on real streams, each against its peer measured in the same run.

    python bench/quality.py [--quick] [--out results.json] [--threads 2] [--data DIR]

Protocol: for each mini-batch of B records in stream order, predict all of them, then
learn the batch (one optimizer step); one pass. Streams from the datasets folder (--data,
default ../shared/data); a stream whose files are absent is replaced by a synthetic one of
its shape and size, labelled SYNTHETIC in the table and the JSON (bench/data.py):

1. SMS Spam Collection (5,574) and AG News (5,581 = the 5,000-row sample, then the first
   581 rows): accuracy of the library defaults, of defaults with unigrams and of
   defaults without the Naive Bayes part (learner.nb_weight=0) (3 seeds each; --quick: 1)
   and of a 1-layer transformer (with and without the part), against river MultinomialNB on
   BagOfWords(lowercase) (predict_one then learn_one, same order) and Vowpal Wabbit
   --oaa --ngram 2 when installed. A record whose label first appears in its batch
   counts as a miss. Target: accuracy >= NB.
2. MovieLens 100K as next-item events in two orders: time, then file order (how
   `streamlearn replay` reads u.data), and time, then user, then item (events of one second
   grouped by user, ids ascending, as a ratings export sorted that way arrives): recall@10
   over the items seen so far, excluding the user's rated items, against first-order Markov
   and popularity (same candidates, same exclusion). Target: >= 1.2x Markov in both.
   --quick: first 30,000 events.
Superbloom's depth claim (set completion under heavy hashing) is measured by bench/depth.py.
3. Step cost: median learn_batch time of the text and the MovieLens configurations
   against the same configuration with embedding.scheme=plain (a bounded-dictionary
   nn.Embedding table of the same width d, same optimizer), interleaved; records/s of
   every configuration come from its own run (learn_batch time only).

Prints a markdown table; --out writes every figure as JSON.
"""
from __future__ import annotations

import json
import platform
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))


import quality_eval as ev
from streamlearn.config import Config, LearnerConfig
import quality_streams as streams
from data import Stream, add_data_option, ag_news, data_dir, events_stream, text_stream
from options import parser_for, positive_int, run_main

TEXT_BATCH = LearnerConfig.batch_size  # the default learner.batch_size
# on top of the library defaults (depth 0, bigrams and digit shapes, Naive Bayes part 0.1;
# docs/choosing-a-configuration.md; bench/shapes.py runs every text stream against per-record peers)
TEXT_CONFIGS = {
    "defaults": (),
    "defaults with unigrams": ("hashing.ngrams=1",),
    "defaults without the Naive Bayes part": ("learner.nb_weight=0",),
    "1 layer": ("model.layers=1",),
    "1 layer without the Naive Bayes part": ("model.layers=1", "learner.nb_weight=0"),
}
SEEDS = (0, 1, 2)

NEXT_ITEM = ()  # learner.task=next-item brings the settings users get (streamlearn.tasks.REGISTRY)
NEXT_ITEM_BATCH = Config().override("learner.task=next-item").learner.batch_size  # the task's default


def seeded(overrides, seed: int) -> tuple[str, ...]:
    return (*overrides, f"learner.seed={seed}", f"hashing.seed={seed}")


def text_results(name: str, records: list[dict], quick: bool) -> dict:
    """Every text configuration on one stream, with its peers."""
    out = {"dataset": name, "records": len(records), "batch": TEXT_BATCH, "configs": {}}
    for label, overrides in TEXT_CONFIGS.items():
        seeds = SEEDS[:1] if quick or "1 layer" in label else SEEDS
        runs = [ev.classify(records, seeded(overrides, s), TEXT_BATCH) for s in seeds]
        accs = [r["accuracy"] for r in runs]
        out["configs"][label] = {
            "overrides": list(overrides), "seeds": list(seeds), "accuracy_per_seed": accs,
            "accuracy": sum(accs) / len(accs), "accuracy_min": min(accs), "params": runs[0]["params"],
            "learn_records_per_s": sum(r["learn_records_per_s"] for r in runs) / len(runs)}
    out["river_nb"] = streams.river_nb(records)
    out["vw_oaa_bigrams"] = streams.vw_oaa(records)
    return out


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
    synthetic = " (SYNTHETIC)" if results.get("sources", {}).get("movielens", "").startswith("SYNTHETIC") else ""
    for key, order in (("movielens", "time, file order"), ("movielens_user", "time, user, item order")):
        m = results.get(key)
        if not m:
            continue
        ratio = m["recall@10_model"] / m["recall@10_markov"]
        rows.append(f"| MovieLens{synthetic} recall@10 ({m['events']:,} events; {order}) | {m['recall@10_model']:.4f} | "
                    f"Markov {m['recall@10_markov']:.4f}, popularity {m['recall@10_popularity']:.4f} | "
                    f"{ratio:.2f} x Markov | >= 1.2 x Markov | {'yes' if ratio >= 1.2 else 'NO'} | "
                    f"{m['learn_records_per_s']:,.0f} |")
    m = results.get("movielens")
    lines = ["\n".join(rows)]
    if m:
        b = m["beam"]
        lines.append(f"MovieLens beam check: public topk_many (beam {b['beam']}) certified exact on "
                     f"{b['certified_exact']:.1%} and equal to exhaustive top-10 on {b['same_top_k_as_exhaustive']:.1%} "
                     f"of {b['queries']} user queries")
    for name, c in results.get("step_cost", {}).items():
        lines.append(f"step cost {name}: {c['step_ms']:.2f} ms vs plain nn.Embedding scheme {c['plain_step_ms']:.2f} ms "
                     f"= {c['ratio']:.2f}x (batch {c['batch']}, median of {c['steps']})")
    return "\n\n".join(lines)


def user_order(events: list[dict]) -> list[dict]:
    """The same next-item events in (time, user, item) order, ids compared as numbers."""
    return sorted(events, key=lambda e: (e["ts"], int(e["key"]), int(e["item"])))


def load_streams(data: Path, quick: bool) -> dict[str, Stream]:
    """SMS, AG News (both samples, labels as class names) and MovieLens, each real or its
    labelled synthetic stand-in."""
    return {"sms": text_stream("sms", data), "ag_news": ag_news(data),
            "movielens": events_stream(data, 30_000 if quick else None)}


def main() -> int:
    parser = parser_for(__doc__)
    parser.add_argument("--quick", action="store_true", help="1 seed, 30k MovieLens events")
    parser.add_argument("--out", type=Path, help="write the results as JSON here")
    parser.add_argument("--threads", type=positive_int, default=2, help="torch intra-op threads (default %(default)s)")
    add_data_option(parser)
    parser.add_argument("--only", nargs="*", choices=("sms", "ag_news", "movielens", "step_cost"),
                        help="these parts only (default: all)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    want = set(args.only or ("sms", "ag_news", "movielens", "step_cost"))
    results: dict = {"quick": args.quick, "torch_threads": torch.get_num_threads(), "torch": torch.__version__,
                     "python": platform.python_version(), "seconds": {}}
    loaded = load_streams(data_dir(args.data), args.quick)
    results["sources"] = {key: stream.source for key, stream in loaded.items()}
    for key, stream in loaded.items():
        print(f"{key}: {len(stream.records):,} records from {stream.source}", file=sys.stderr)
    data = {key: stream.records for key, stream in loaded.items()}
    for key in ("sms", "ag_news"):
        if key in want:
            t = time.perf_counter()
            name = {"sms": "SMS", "ag_news": "AG News"}[key] + (" (SYNTHETIC)" if loaded[key].synthetic else "")
            results[key] = text_results(name, data[key], args.quick)
            results["seconds"][key] = time.perf_counter() - t
    if "movielens" in want:
        for key, events in (("movielens", data["movielens"]), ("movielens_user", user_order(data["movielens"]))):
            t = time.perf_counter()
            results[key] = ev.next_item(events, NEXT_ITEM, NEXT_ITEM_BATCH)
            results[key]["overrides"] = list(NEXT_ITEM)
            results["seconds"][key] = time.perf_counter() - t
    if "step_cost" in want:
        t = time.perf_counter()
        results["step_cost"] = step_costs(data["ag_news"], data["movielens"], args.quick)
        results["seconds"]["step_cost"] = time.perf_counter() - t
    print(table(results))
    print(f"\ntorch threads {results['torch_threads']}; seconds per part: "
          + ", ".join(f"{k} {v:.0f}" for k, v in results["seconds"].items()))
    if args.out:
        args.out.write_text(json.dumps(results, indent=2, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
