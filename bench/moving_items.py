"""Next-item streams that move, replayed: the model against the counting baselines.

Seeded generators of next-item streams whose catalog, popularity or taste moves (the
thirty-second session's walk-through on streams the team never tuned on built them), each
replayed prequentially by the product's ``replay`` with the task's defaults and the
``popularity``, ``markov`` and ``ngram`` baselines. The table gives recall@10 and its
ratio to the better of Markov and popularity (docs/choosing-a-configuration.md, "Next
item: a batch read in order").

    python bench/moving_items.py                       # every stream, seed 0
    python bench/moving_items.py --streams growing,popshift --seeds 0,1,2
    python bench/moving_items.py --set learner.batch_size=16

Streams (events in time order, ``{"key", "item"}``):

- ``growing``: a new item every two events; a user picks a trending (recent) item, Zipf
  over the newest 200, or with probability 1/2 the next episode of the last one (i + 1);
- ``growing-str``: the same with string ids (``item-<n>``);
- ``popshift``: Zipf over 300 of 2,000 items, reshuffled every 1,500 events, int keys;
- ``genres``: 5 genres of 400 items, each user's next item from the next genre, no repeats;
- ``genres-long``: the same process for 20,000 events;
- ``one-event``: 3,000 one-event keys among 100 keys of 20 events on a chain (i -> i + 7);
- ``burst``: 10,000 events over 300 items, then 12,000 over 6,000 new ones (after the
  output size was derived); next item i + 1 with probability 0.6, else a Zipf pick;
- ``ring-long`` / ``ring-short``: a walk on a ring of 3,000 items (+1..+3 a step), 8 keys
  of 700 events / 400 keys of 14.
"""
from __future__ import annotations

import json
import random
import sys
import tempfile
from pathlib import Path
from typing import Callable

import torch

from streamlearn.config import Config
from streamlearn.replay import FileSource, ReplayOptions, replay

from options import add_set_option, names, nonneg_int, parser_for, positive_int, run_main

BASELINES = ("popularity", "markov", "ngram")
Events = list[tuple[object, int | str]]


def _zipf_pick(rng: random.Random, seq: list[int], s: float = 1.1) -> int:
    return rng.choices(seq, [1 / (r + 1) ** s for r in range(len(seq))])[0]


def growing(seed: int = 1) -> Events:
    rng, users, last, out, newest = random.Random(seed), {}, {}, [], 1
    for t in range(6000):
        if t % 2 == 0:
            newest += 1
        u = rng.randrange(300)
        seen = users.setdefault(u, set())
        prev = last.get(u)
        if prev is not None and rng.random() < 0.5 and prev + 1 < newest and prev + 1 not in seen:
            item = prev + 1
        else:
            recent = list(range(newest - 1, max(0, newest - 200), -1))
            item = _zipf_pick(rng, recent)
            for _ in range(20):
                if item not in seen:
                    break
                item = _zipf_pick(rng, recent)
        seen.add(item)
        last[u] = item
        out.append((f"u{u}", item))
    return out


def growing_str(seed: int = 1) -> Events:
    return [(key, f"item-{item}") for key, item in growing(seed)]


def popshift(seed: int = 4) -> Events:
    rng, seen, out, perm = random.Random(seed), {}, [], list(range(2000))
    for t in range(6000):
        if t % 1500 == 0:
            rng.shuffle(perm)
        u = rng.randrange(400)
        had = seen.setdefault(u, set())
        item = _zipf_pick(rng, perm[:300], 1.2)
        while item in had:
            item = _zipf_pick(rng, perm[:300], 1.2)
        had.add(item)
        out.append((u, item))
    return out


def genres(seed: int = 2, events: int = 6000) -> Events:
    rng, at, seen, out = random.Random(seed), {}, {}, []
    for _ in range(events):
        u = rng.randrange(200)
        g = at.get(u, rng.randrange(5))
        had = seen.setdefault(u, set())
        item = _zipf_pick(rng, [g * 400 + j for j in range(400) if g * 400 + j not in had], 0.8)
        had.add(item)
        at[u] = (g + 1) % 5
        out.append((f"u{u}", item))
    return out


def one_event(seed: int = 6) -> Events:
    rng, at, out = random.Random(seed), {}, []
    keys = [f"m{u}" for u in range(100) for _ in range(20)] + [f"s{u}" for u in range(3000)]
    rng.shuffle(keys)
    for key in keys:
        if key.startswith("s"):
            out.append((key, rng.randrange(500)))
        else:
            at[key] = rng.randrange(500) if key not in at else (at[key] + 7) % 500
            out.append((key, at[key]))
    return out


def burst(seed: int = 12) -> Events:
    rng, last, seen, out = random.Random(seed), {}, {}, []
    for t in range(22000):
        low, n = (0, 300) if t < 10000 else (1000, 6000)
        u = rng.randrange(400)
        had = seen.setdefault(u, set())
        prev = last.get(u)
        if prev is not None and low <= prev + 1 < low + n and rng.random() < 0.6:
            item = prev + 1
        else:
            item = low + min(int(rng.paretovariate(1.0)) - 1, n - 1)
        for _ in range(30):
            if item not in had:
                break
            item = rng.randrange(low, low + n)
        had.add(item)
        last[u] = item
        out.append((f"u{u}", item))
    return out


def ring(keys: int, per_key: int, seed: int = 5) -> Events:
    rng = random.Random(seed)
    at = {k: rng.randrange(3000) for k in range(keys)}
    left, out = {k: per_key for k in range(keys)}, []
    while left:
        k = rng.choice(list(left))
        at[k] = (at[k] + rng.choice([1, 1, 1, 2, 2, 3])) % 3000
        out.append((f"u{k}", at[k]))
        left[k] -= 1
        if not left[k]:
            del left[k]
    return out


STREAMS: dict[str, Callable[[], Events]] = {
    "growing": growing, "growing-str": growing_str, "popshift": popshift, "genres": genres,
    "genres-long": lambda: genres(events=20000), "one-event": one_event, "burst": burst,
    "ring-long": lambda: ring(8, 700), "ring-short": lambda: ring(400, 14),
}


def write(events: Events, path: Path) -> Path:
    with path.open("w") as f:
        for key, item in events:
            f.write(json.dumps({"key": key, "item": item}) + "\n")
    return path


def run(path: Path, seed: int, overrides: list[str]) -> dict:
    """One prequential replay of ``path`` with the task's defaults and the baselines."""
    config = Config().override("learner.task=next-item", *overrides)
    report = replay(FileSource(path), ReplayOptions(baselines=BASELINES, seed=seed), config=config)
    model = report["metrics"]["recall@10"]
    peers = {name: b["recall@10"] for name, b in report["baselines"].items() if name in ("markov", "popularity")}
    best = max(peers, key=peers.get)
    return {"model": model, "peer": best, "peer_recall": peers[best], "ngram": report["baselines"]["ngram"]["recall@10"],
            "ratio": model / peers[best] if peers[best] else float("nan"),
            "records_per_s": report["records_per_s"]}


def main() -> int:
    parser = parser_for(__doc__)
    parser.add_argument("--streams", type=names(STREAMS), metavar="NAMES",
                        help=f"comma-separated, of {', '.join(STREAMS)} (default: all)")
    parser.add_argument("--seeds", type=lambda text: [nonneg_int(s) for s in text.split(",")], default=[0],
                        metavar="SEEDS", help="comma-separated learner seeds (default 0; the streams are fixed)")
    add_set_option(parser, "for the model")
    parser.add_argument("--threads", type=positive_int, default=1, help="torch threads (default %(default)s)")
    parser.add_argument("--out", type=Path, help="write the rows as JSON here")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    rows = []
    print("| stream | best peer | model recall@10 | / best peer | ngram | model records/s |")
    print("|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as scratch:
        for name in args.streams or STREAMS:
            path = write(STREAMS[name](), Path(scratch) / f"{name}.jsonl")
            for seed in args.seeds:
                r = {"stream": name, "seed": seed, **run(path, seed, args.set)}
                rows.append(r)
                print(f"| {name} (seed {seed}) | {r['peer']} {r['peer_recall']:.4f} | {r['model']:.4f} | "
                      f"{r['ratio']:.3f}x | {r['ngram']:.4f} | {r['records_per_s']:,.0f} |", flush=True)
    worst = min(rows, key=lambda r: r["ratio"])
    print(f"\nworst stream: {worst['stream']} (seed {worst['seed']}) {worst['ratio']:.3f}x its best peer; "
          f"command: python bench/moving_items.py {' '.join(sys.argv[1:])}".rstrip())
    if args.out:
        args.out.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
