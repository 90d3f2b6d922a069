"""Superbloom's beam search against exhaustive scoring: the table of docs/decoding.md.

    python bench/decoding.py [--n 1000000] [--reps 5]

n candidates (default 10^6) in a CandidateIndex at the config defaults' output shape
(m = ``model.out_m`` = 2 hashes into ``model.out_B`` = 50,000 buckets), k = 10. Two
score tables over the buckets: "peaked" (N(0, 1) logits with one candidate's buckets
raised by 6, a model that knows the answer) and "untrained" (N(0, 1) logits). For each,
beam_topk at beams 10, 50 and 200 against exhaustive_topk in the same run (best of
``--reps`` runs each): time, speed-up, the certificate, candidates scored, and whether
the top 10 is the exhaustive one. Then 32 peaked positions through beam_topk_many
against exhaustive_topk_many, and the index's own costs: adding the n ids in batches of
10,000 (hashing included), and merging a tail the size that triggers a merge into them.
"""
from __future__ import annotations

import sys
import time

import numpy as np
from options import parser_for, positive_int, run_main

from streamlearn.decoding import CandidateIndex, beam_topk, beam_topk_many, exhaustive_topk, exhaustive_topk_many

M, SIZE, K = 2, 50_000, 10


def clock(reps: int, f, *args):
    """(best seconds, last result) of ``reps`` calls of ``f(*args)``."""
    best, out = float("inf"), None
    for _ in range(reps):
        start = time.perf_counter()
        out = f(*args)
        best = min(best, time.perf_counter() - start)
    return best, out


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def scores(index: CandidateIndex, rng: np.random.Generator, shift: float, positions: int | None = None) -> np.ndarray:
    """log-softmax rows (m, size), or (positions, m, size); ``shift`` raises one random
    candidate's buckets per position."""
    shape = (positions or 1, M, SIZE)
    x = rng.normal(0, 1, shape)
    targets = index.hashes[rng.integers(len(index), size=shape[0])]  # (N, m)
    x[np.arange(shape[0])[:, None], np.arange(M), targets] += shift
    lp = log_softmax(x)
    return lp if positions else lp[0]


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:,.2f} ms" if seconds < 0.1 else f"{seconds * 1e3:,.0f} ms"


def main() -> None:
    parser = parser_for(__doc__)
    parser.add_argument("--n", type=positive_int, default=1_000_000, help="candidates in the index (default %(default)s)")
    parser.add_argument("--reps", type=positive_int, default=5, help="runs of each search, the best kept "
                        "(default %(default)s)")
    args = parser.parse_args()
    rng = np.random.default_rng(0)

    index = CandidateIndex.superbloom(M, SIZE, seed=0)
    start = time.perf_counter()
    for s in range(0, args.n, 10_000):
        index.add([f"item:{i}" for i in range(s, min(s + 10_000, args.n))])
    index.view()  # the first query merges what was added
    add_s = time.perf_counter() - start
    print(f"n = {len(index):,} candidates, m = {M}, size = {SIZE:,}, k = {K}")

    print("\n| logp | beam | beam_topk | exhaustive | speed-up | exact | candidates scored | top 10 as exhaustive |")
    print("|---|---|---|---|---|---|---|---|")
    for name, shift in (("peaked (one candidate +6)", 6.0), ("untrained, N(0, 1) logits", 0.0)):
        lp = scores(index, rng, shift)
        te, ex = clock(args.reps, exhaustive_topk, lp, index, K)
        for beam in (10, 50, 200):
            tb, top = clock(args.reps, beam_topk, lp, index, K, beam)
            print(f"| {name} | {beam} | {ms(tb)} | {ms(te)} | {te / tb:.0f}x | {'yes' if top.exact else 'no'} "
                  f"| {top.visited:,} | {'yes' if top.tokens == ex.tokens else 'no'} |")

    many = scores(index, rng, 6.0, positions=32)
    tb, tops = clock(max(1, args.reps // 2), beam_topk_many, many, index, K, 50)
    te, exs = clock(max(1, args.reps // 2), exhaustive_topk_many, many, index, K)
    exact = sum(t.exact for t in tops)
    same = sum(t.tokens == e.tokens for t, e in zip(tops, exs))
    print(f"| 32 positions, beam_topk_many / exhaustive_topk_many, peaked | 50 | {ms(tb)} | {ms(te)} | {te / tb:.0f}x "
          f"| {exact}/32 | | {same}/32 |")

    base = len(index)
    tail = base // 32 + 1  # the first tail large enough to be merged (CandidateIndex.view)
    index.add([f"new:{i}" for i in range(tail)])
    merge_s = clock(1, index.view)[0]
    print(f"\nadd: {base:,} ids in batches of 10,000, hashing and merging included: {add_s:.2f} s")
    print(f"merge: a tail of {tail:,} new candidates into {base:,}, at the query that finds it over "
          f"max(2,048, merged / 32): {ms(merge_s)}")

if __name__ == "__main__":
    sys.exit(run_main(main))
