"""Superbloom's depth claim on heavily hashed synthetic set streams: 0 to 3 layers.

    python bench/depth.py [--stream partners|clusters] [--quick] [--out depth.json] [--seeds 2]
                          [--sets 400000] [--jobs 2] [--control]

Claim (Superbloom, section 3.4): with m hashes and many ids per hash row, a model of 2
or more layers recovers masked ids clearly better than a 1-layer model of the same size,
because telling which id of a row is meant needs the context, mixed over several layers.

Streams (bench/quality_streams), both over --ids ids (2,000), one set per record:

- ``partners`` (the default): ids paired at random; each set holds 2..3 whole pairs. With
  one id masked, the answer is the partner of the one context id left without its
  partner. Finding that id needs the context ids compared with each other (a first layer
  of attention) before the [MASK] slot reads it (a second); under hashing the comparison
  is between the ids' shared rows.
- ``clusters``: ids split at random into latent clusters of --cluster (8); each set picks a
  cluster and 3..6 of its ids. Every context id votes for the answer's cluster on its own,
  so one read of the context suffices (the first design: no depth effect).

Ids are Bloom-hashed, m = 2 hashes into one table of B = m * ids / 20 rows, so every row
is shared by about 20 ids, on input and (tied, Superbloom's E_O = E_I) on output. Models:
no positions, [MASK] slot read at depth >= 1 (depth 0: the pooled context), d_model 64,
4 heads, the same transformer parameter count at 1, 2 and 3 layers (ffn 645, 256, 128),
the same optimizer settings (dense AdamW 0.002, the depth >= 1 rate of
docs/choosing-a-configuration.md; sparse Adagrad 0.2), batch 128, one pass, mlm (15%
masking, 80/10/10).

Metric: prequential. Before each batch is learned, one random id of each of its first 64
sets is masked and the rest of the set is the query; every one of the ids is scored with
Superbloom's decoding score sum_j log p_j(h_j(id)) (exhaustive: what Algorithm 1 ranks
by, exact), the query's own ids excluded; recall@1/@10 of the masked id, per quarter
of the stream. For scale, on the same queries: the oracle that knows the ground truth
(the cluster, or the pairs), and the same oracle decoded through the hashes (its exact
per-hash marginals, ranked as a model's are), the ceiling of any model with this hashed
output. --control repeats the depths up to 2 (first seed) with B = 2 * m * ids (no heavy
hashing) to show what the hashing costs.

Prints a markdown table with each depth's ratio to 1 layer; --out writes JSON.
"""
from __future__ import annotations

import json
import multiprocessing as mp
import platform
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from options import at_least, parser_for, positive_int, run_main
from quality_streams import SetStream, cluster_sets, partner_sets

from streamlearn.config import load_config
from streamlearn.learner import Learner

M = 2
IDS_PER_ROW = 20
SIZES = {"clusters": (3, 6), "partners": (2, 3)}  # ids per set; whole pairs per set
D_MODEL, HEADS = 64, 4
FFN = {0: 0, 1: 645, 2: 256, 3: 128}  # layers -> ffn: ~100k transformer parameters at 1..3 layers
BATCH, EVAL_ROWS, K = 128, 64, 10
ORACLE_QUERIES = 4_000  # the oracles do not learn: a sample of the queries is enough


@dataclass(frozen=True)
class Run:
    """One model on one stream."""

    layers: int
    seed: int
    ids: int
    cluster: int
    sets: int
    rows: int  # B
    stream: str = "partners"

    def overrides(self) -> list[str]:
        return ["learner.task=mlm", f"learner.batch_size={BATCH}", f"learner.seed={self.seed}",
                f"hashing.seed={self.seed}", "hashing.tokenizer=ids", "embedding.scheme=bloom", f"embedding.m={M}",
                f"embedding.B={self.rows}", f"embedding.d={D_MODEL}", f"model.d_model={D_MODEL}",
                f"model.heads={HEADS}", f"model.layers={self.layers}", f"model.ffn={max(FFN[self.layers], 1)}",
                "model.positions=false", "model.dropout=0", "model.tie_output=true", "optim.dense_lr=0.002",
                "optim.sparse_lr=0.2",
                # Superbloom's hashed softmax over the m digests, not mlm's token-stream defaults since
                # 2026-11-25 (a sampled head over the seen tokens, a count part): the claim is the hashed model's
                "model.output=hashed", "model.counts=none"]


def make_stream(run: Run) -> SetStream:
    if run.stream == "partners":
        return partner_sets(run.ids, run.sets, SIZES["partners"], seed=run.seed)
    return cluster_sets(run.ids, run.cluster, run.sets, SIZES["clusters"], seed=run.seed)


def learner(run: Run) -> Learner:
    return Learner(load_config(overrides=run.overrides(), use_env=False))


def digest_codes(L: Learner, ids: int) -> np.ndarray:
    """(ids, m): the m hash rows of each id's token, as the model's input and output see them."""
    return L.task.code.targets([f"id{i}" for i in range(ids)])["hashes"]


def transformer_params(L: Learner) -> int:
    layers = L.model.encoder.layers
    return sum(p.numel() for p in layers.parameters()) if layers is not None else 0


# ---------------------------------------------------------------------------- ranking

def recall_at(scores: np.ndarray, target: np.ndarray, k: int) -> np.ndarray:
    """P(target in the top k) per row of scores (n, ids), ties broken uniformly at random
    (in expectation): an oracle's tied scores get no lucky order."""
    s = scores[np.arange(len(target)), target][:, None]  # (n, 1)
    above = (scores > s).sum(1)
    tied = (scores == s).sum(1) - 1
    return np.clip((k - above) / (tied + 1), 0.0, 1.0)


def queries(stream: SetStream, start: int, n: int, rng: np.random.Generator):
    """(index, masked id, context ids) of the first n sets of the batch at ``start``."""
    out = []
    for i in range(start, min(start + n, len(stream.sets))):
        s = stream.sets[i]
        j = int(rng.integers(len(s)))
        out.append((i, int(s[j]), np.delete(s, j)))
    return out


def model_scores(L: Learner, qs, codes: np.ndarray) -> np.ndarray:
    """Superbloom's score sum_j log p_j(h_j(id)) of every id (n, ids), context ids -inf.
    Uses the learner's own forward pass on a prepared query batch, as bench/quality_eval does."""
    b = L.prepare([{"tokens": [f"id{x}" for x in ctx] + ["[MASK]"]} for _, _, ctx in qs], train=False)
    logp = torch.log_softmax(L.outputs(b).float(), dim=-1).numpy()  # (n, m, B)
    scores = sum(logp[:, j, codes[:, j]] for j in range(codes.shape[1]))  # (n, ids)
    for r, (_, _, ctx) in enumerate(qs):
        scores[r, ctx] = -np.inf
    return scores


# ---------------------------------------------------------------------------- one model

def run_model(run: Run) -> dict:
    torch.set_num_threads(1)
    stream = make_stream(run)
    L = learner(run)
    codes = digest_codes(L, run.ids)
    rng = np.random.default_rng(1000 + run.seed)
    at: list[int] = []
    r1: list[np.ndarray] = []
    r10: list[np.ndarray] = []
    learn_s = 0.0
    for start in range(0, run.sets, BATCH):
        if start:  # before any step the model is its init: nothing to measure
            qs = queries(stream, start, EVAL_ROWS, rng)
            scores = model_scores(L, qs, codes)
            target = np.array([t for _, t, _ in qs])
            r1.append(recall_at(scores, target, 1))
            r10.append(recall_at(scores, target, K))
            at += [start] * len(qs)
        chunk = [{"tokens": stream.tokens(i)} for i in range(start, min(start + BATCH, run.sets))]
        t = time.perf_counter()
        L.learn_many(chunk)
        learn_s += time.perf_counter() - t
    at_a, r1_a, r10_a = np.array(at), np.concatenate(r1), np.concatenate(r10)
    quarter = np.minimum(4 * at_a // run.sets, 3)
    return {"stream": run.stream, "layers": run.layers, "seed": run.seed, "rows": run.rows, "ffn": FFN[run.layers],
            "transformer_params": transformer_params(L), "params": sum(p.numel() for p in L.model.parameters()),
            "queries": int(len(at_a)),
            "recall@1_by_quarter": [float(r1_a[quarter == q].mean()) for q in range(4)],
            "recall@10_by_quarter": [float(r10_a[quarter == q].mean()) for q in range(4)],
            "learn_records_per_s": run.sets / learn_s, "overrides": run.overrides()}


# ---------------------------------------------------------------------------- oracles

def oracles(run: Run, codes: np.ndarray) -> dict:
    """recall@1/@10 of the oracle that knows the ground truth (the cluster, or the pairs),
    exact and decoded through the m hashes (``codes``: :func:`digest_codes`)."""
    ids, rows = run.ids, run.rows
    stream = make_stream(run)
    rng = np.random.default_rng(1000 + run.seed)
    qs = []
    for start in range(BATCH, run.sets, BATCH):
        qs += queries(stream, start, EVAL_ROWS, rng)
        if len(qs) >= ORACLE_QUERIES:
            break
    exact, exact1, hashed, hashed1 = [], [], [], []
    for i, target, ctx in qs:
        rest = stream.answers(i, ctx)  # the ids the oracle cannot tell apart
        exact.append(min(1.0, K / len(rest)))
        exact1.append(1.0 / len(rest))
        scores = np.zeros(ids)
        for j in range(codes.shape[1]):
            p = np.bincount(codes[rest, j], minlength=rows) / len(rest)  # exact marginal of hash j
            with np.errstate(divide="ignore"):
                scores += np.log(p[codes[:, j]])
        scores[ctx] = -np.inf
        hashed.append(recall_at(scores[None], np.array([target]), K)[0])
        hashed1.append(recall_at(scores[None], np.array([target]), 1)[0])
    return {"oracle_recall@10": float(np.mean(exact)), "oracle_recall@1": float(np.mean(exact1)),
            "oracle_hashed_recall@10": float(np.mean(hashed)),
            "oracle_hashed_recall@1": float(np.mean(hashed1)), "queries": len(qs)}


def shared_digests(codes: np.ndarray) -> float:
    """Share of ids whose whole digest another id has (no model can tell those apart)."""
    _, inverse, counts = np.unique(np.sort(codes, axis=1), axis=0, return_inverse=True, return_counts=True)
    return float((counts[inverse.ravel()] > 1).mean())


# ---------------------------------------------------------------------------- report

def summarize(models: list[dict]) -> dict:
    """Per depth and row count: recall by quarter averaged over seeds."""
    out: dict[str, dict] = {}
    for r in models:
        key = f"{r['layers']} layers, B={r['rows']}"
        out.setdefault(key, {"layers": r["layers"], "rows": r["rows"], "runs": []})["runs"].append(r)
    for s in out.values():
        runs = s.pop("runs")
        s["seeds"] = [r["seed"] for r in runs]
        for name in ("recall@1_by_quarter", "recall@10_by_quarter"):
            s[name] = np.mean([r[name] for r in runs], axis=0).tolist()
        s["recall@10_last_quarter_per_seed"] = [r["recall@10_by_quarter"][-1] for r in runs]
        s["transformer_params"] = runs[0]["transformer_params"]
        s["params"] = runs[0]["params"]
        s["learn_records_per_s"] = float(np.mean([r["learn_records_per_s"] for r in runs]))
    return out


def table(results: dict) -> str:
    rows = ["| model | B (ids/row) | transformer params | recall@10 by quarter | last quarter: @1 / @10 (per seed) | "
            "@10 vs 1 layer | learn records/s |", "|---|---|---|---|---|---|---|"]
    summary = results["summary"]
    for key, s in summary.items():
        one = summary.get(f"1 layers, B={s['rows']}")
        ratio = f"{s['recall@10_by_quarter'][-1] / one['recall@10_by_quarter'][-1]:.2f}x" if one else "-"
        per_seed = ", ".join(f"{x:.3f}" for x in s["recall@10_last_quarter_per_seed"])
        rows.append(f"| {s['layers']} layers | {s['rows']} ({M * results['ids'] / s['rows']:g}) | "
                    f"{s['transformer_params']:,} | {' '.join(f'{x:.3f}' for x in s['recall@10_by_quarter'])} | "
                    f"{s['recall@1_by_quarter'][-1]:.3f} / {s['recall@10_by_quarter'][-1]:.3f} ({per_seed}) | "
                    f"{ratio} | {s['learn_records_per_s']:,.0f} |")
    o = results["oracle"]
    truth = "the pairs" if results["stream"] == "partners" else "the cluster"
    rows.append(f"| oracle knowing {truth} | - | - | - | {o['oracle_recall@1']:.3f} / {o['oracle_recall@10']:.3f} | - | - |")
    rows.append(f"| same oracle through the hashes (m softmaxes) | {results['rows']} | - | - | "
                f"{o['oracle_hashed_recall@1']:.3f} / {o['oracle_hashed_recall@10']:.3f} | - | - |")
    lo, hi = results["set_sizes"]
    shape = (f"ids in random pairs, sets of {lo}-{hi} whole pairs" if results["stream"] == "partners"
             else f"ids in clusters of {results['cluster']}, sets of {lo}-{hi} ids")
    return "\n".join(rows) + (
        f"\n\nstream {results['stream']}: {results['ids']:,} {shape}, "
        f"{results['sets']:,} sets per run, m = {M}, {results['shared_digest']:.1%} of ids share their whole digest; "
        f"seeds {results['seeds']}; {results['seconds']:.0f} s")


def main() -> int:
    parser = parser_for(__doc__)
    parser.add_argument("--stream", choices=("partners", "clusters"), default="partners",
                        help="the set stream (module docstring; default %(default)s)")
    parser.add_argument("--quick", action="store_true", help="1 seed, 150,000 sets, 1 and 2 layers")
    parser.add_argument("--out", type=Path, help="write the results as JSON here")
    parser.add_argument("--ids", type=at_least(IDS_PER_ROW), default=2_000,
                        help="distinct ids in the stream (partners: even; clusters: a multiple of --cluster; "
                        "default %(default)s)")
    parser.add_argument("--cluster", type=at_least(SIZES["clusters"][1]), default=8,
                        help="ids per cluster of --stream clusters (default %(default)s)")
    parser.add_argument("--sets", type=at_least(5 * BATCH), help="sets per run, at least 640 so that every "
                        "quarter of a run is measured (default 400,000; --quick 150,000)")
    parser.add_argument("--seeds", type=positive_int, default=2, help="runs per depth, learner.seed 0, 1, ... "
                        "(default %(default)s; --quick 1)")
    parser.add_argument("--layers", type=int, nargs="*", choices=sorted(FFN), help="depths (default 0 1 2 3)")
    parser.add_argument("--control", action="store_true", help="also the depths up to 2 without heavy hashing")
    parser.add_argument("--jobs", type=positive_int, default=2,
                        help="models trained in parallel, 1 torch thread each (default %(default)s)")
    args = parser.parse_args()
    try:  # the stream's own checks of --ids and --cluster, before any process starts
        make_stream(Run(0, 0, args.ids, args.cluster, 1, 1, args.stream))
    except ValueError as exc:
        parser.error(f"--stream {args.stream} --ids {args.ids} --cluster {args.cluster}: {exc}")
    sets = args.sets or (150_000 if args.quick else 400_000)
    seeds = list(range(1 if args.quick else args.seeds))
    depths = args.layers or ([1, 2] if args.quick else sorted(FFN))
    rows = M * args.ids // IDS_PER_ROW
    runs = [Run(layers, seed, args.ids, args.cluster, sets, rows, args.stream) for seed in seeds for layers in depths]
    if args.control:
        runs += [Run(layers, seeds[0], args.ids, args.cluster, sets, 2 * M * args.ids, args.stream)
                 for layers in depths if layers <= 2]
    t = time.perf_counter()
    models = []
    with mp.get_context("spawn").Pool(args.jobs) as pool:
        for r in pool.imap_unordered(run_model, runs):
            models.append(r)
            print(f"done: {r['layers']} layers, B={r['rows']}, seed {r['seed']}: recall@10 by quarter "
                  + " ".join(f"{x:.3f}" for x in r["recall@10_by_quarter"]), file=sys.stderr, flush=True)
    models.sort(key=lambda r: (r["rows"] != rows, r["rows"], r["layers"], r["seed"]))  # hashed first
    first = Run(0, seeds[0], args.ids, args.cluster, sets, rows, args.stream)
    codes = digest_codes(learner(first), args.ids)
    results = {"stream": args.stream, "ids": args.ids, "cluster": args.cluster, "sets": sets, "rows": rows,
               "seeds": seeds, "set_sizes": list(SIZES[args.stream]), "m": M, "batch": BATCH, "eval_rows": EVAL_ROWS,
               "oracle": oracles(first, codes), "shared_digest": shared_digests(codes),
               "models": models, "summary": summarize(models), "torch": torch.__version__,
               "python": platform.python_version(), "jobs": args.jobs, "quick": args.quick}
    results["seconds"] = time.perf_counter() - t
    print(table(results))
    if args.out:
        args.out.write_text(json.dumps(results, indent=2, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
