"""One set of defaults per task, on every stream shape, against fair peers (issue 17).

    python bench/shapes.py [--task all|text|next-item] [--streams sms yelp ml-time ...] [--seeds 0 1 2]
                           [--set model.layers=1 ...] [--limit N] [--data DIR]

The model predicts each mini-batch, then learns it (one step); its peers predict then
learn record by record in stream order, on the same records and the same tokens
(bench/peers.py), so their figures do not depend on the model's batch size. Text:
accuracy against river MultinomialNB, river LogisticRegression and VW --oaa --ngram 2,
each on our words, on the model's own tokens (its n-grams and digit shapes: those of the
run's config) and through its own tokenizer (the best of the three counts). Next-item:
recall@10 against first-order Markov and popularity; every method ranks the items seen before the
event and excludes the key's earlier items.

Each run prints one line per stream: model mean and min over the seeds, the best peer,
the ratio (text: accuracy minus best peer, in points; next-item: recall / the better of
Markov and popularity), and the worst over the streams. ``--log FILE`` appends every run
as a JSON line. Peers are cached in ``--cache`` (they are deterministic).
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from streamlearn.config import load_config
from streamlearn.datasets import DatasetReader
from streamlearn.hashing import tokenize
from streamlearn.learner import Learner
from streamlearn.sizing import sized_config

import peers
from data import add_data_option, data_dir
from options import nonneg_int, parser_for, positive_int, run_main
import synthetic_items as synth

DATA = data_dir(None)  # main() sets --data's folder before any stream is read
AG_CLASSES = ("World", "Sports", "Business", "Sci/Tech")
ITEM_BASE = ("learner.task=next-item",)  # the task's defaults (streamlearn.tasks.REGISTRY)


# ---------------------------------------------------------------------------- streams

def sms() -> list[dict]:
    return [row.record for row in DatasetReader(DATA / "sms-spam-collection" / "SMSSpamCollection")]


def ag_news() -> list[dict]:
    folder = DATA / "ag-news-train-samples"
    out = [{"text": r.record["text"], "label": AG_CLASSES[int(float(r.record["label"]))]}
           for r in DatasetReader(folder / "train_random5000_text_label.csv")]
    out += [{"text": r.record["text"], "label": AG_CLASSES[int(r.record["label"]) - 1]}
            for r in DatasetReader(folder / "train_first581.csv")]
    return out


def yelp() -> list[dict]:
    out = []
    for line in (DATA / "sentiment-labelled-sentences" / "yelp_labelled.txt").read_text(encoding="utf-8").splitlines():
        if line.strip():
            text, label = line.rsplit("\t", 1)
            out.append({"text": text.strip(), "label": "pos" if label.strip() == "1" else "neg"})
    return out


def movielens(order: str) -> list[dict]:
    """u.data as next-item events: ``time`` = (time, file order), ``user`` = (time, user, item)."""
    rows = np.loadtxt(DATA / "movielens-100k" / "u.data", dtype=np.int64)
    keys = (rows[:, 1], rows[:, 0], rows[:, 3]) if order == "user" else (np.arange(len(rows)), rows[:, 3])
    idx = np.lexsort(keys)
    return [{"key": str(rows[i, 0]), "item": str(rows[i, 1])} for i in idx.tolist()]


def shuffled(load, seed: int):
    """A research stream: the same records in a seeded random order (a second opinion on a
    small stream; reported figures use file order)."""
    def make():
        recs = load()
        return [recs[i] for i in np.random.default_rng(seed).permutation(len(recs)).tolist()]
    return make


TEXT_STREAMS = {"sms": sms, "ag_news": ag_news, "yelp": yelp,
                **{f"yelp-p{k}": shuffled(yelp, k) for k in range(1, 5)}}
ITEM_STREAMS = {
    "ml-time": lambda: movielens("time"),
    "ml-user": lambda: movielens("user"),
    "markov-1k": lambda: synth.markov_world(1_000).events,
    "markov-50k": lambda: synth.markov_world(50_000).events,
    "routes": lambda: synth.route_world().events,
    "taste": lambda: synth.taste_world().events,
    "taste-10k": lambda: synth.taste_world(10_000, n_users=600).events,
}


# ---------------------------------------------------------------------------- peers

def text_peers(records: list[dict], hashing) -> dict:
    """Each peer's accuracy on our words, on the model's own tokens under ``hashing`` (its
    n-grams and digit shapes too) and through its own tokenizer; the best of the three
    counts, so a peer is never handicapped by a tokenization."""
    labels = [r["label"] for r in records]
    texts = [r["text"] for r in records]
    words = [tokenize(t) for t in texts]
    model = [tokenize(t, hashing.ngrams, hashing.lowercase, hashing.shapes) for t in texts]
    out = {}
    for name, fn in (("river_nb", peers.river_nb), ("river_logreg", peers.river_logreg), ("vw", peers.vw_oaa)):
        got = {"our_tokens": fn(labels, token_lists=words), "model_tokens": fn(labels, token_lists=model),
               "native": fn(labels, texts=texts)}
        # vw is an optional extra: without vowpalwabbit its scores are None and it is left out
        out[name] = {**got, "best": max((x for x in got.values() if x is not None), default=None)}
    return out


def tokens_signature(hashing) -> str:
    """What the model's tokens depend on: a text stream's peers are cached per value."""
    return f"ngrams={hashing.ngrams},shapes={hashing.shapes},lower={hashing.lowercase}"


def item_peers(events: list[dict]) -> dict:
    return peers.recall_of_peers([(e["key"], e["item"]) for e in events])


def cached_peers(cache: Path, name: str, make) -> dict:
    data = json.loads(cache.read_text()) if cache.exists() else {}
    if name not in data:
        data[name] = make()
        cache.parent.mkdir(parents=True, exist_ok=True)
        cache.write_text(json.dumps(data, indent=1, sort_keys=True))
    return data[name]


# ---------------------------------------------------------------------------- model runs

def learner(overrides, sample=()) -> Learner:
    """A learner of ``overrides``; a size they leave to the stream (next-item's model.out_B=0)
    is derived from ``sample``'s warm-up window, as replay and the worker do (streamlearn.sizing)."""
    cfg, sizing = sized_config(load_config(overrides=list(overrides), use_env=False), sample)
    L = Learner(cfg)
    L.sizing = sizing
    return L


def classify(records: list[dict], overrides) -> float:
    """Prequential accuracy: predict each batch with the labels known before it, learn it."""
    L = learner(("learner.task=classify", *overrides))
    hits = 0
    for start, stop in L.schedule.spans(len(records)):  # as the worker
        known = len(L.labels)
        b = L.prepare(records[start:stop])
        if known:
            probs = L.predict_proba_batch(b)[:, :known]
            hits += int((probs.argmax(1) == b.targets["labels"]).sum())
        L.learn_batch(b)
    return hits / len(records)


def item_scores(L: Learner, b, codes: np.ndarray) -> np.ndarray:
    """Exact scores (n, items) of the items whose output codes are ``codes`` (items, m)."""
    logp = torch.log_softmax(L.outputs(b).float(), dim=-1).numpy()  # (n, m, size)
    s = logp[:, 0, codes[:, 0]]
    for j in range(1, codes.shape[1]):
        s = s + logp[:, j, codes[:, j]]
    return s


def next_item(events: list[dict], overrides, k: int = 10) -> tuple[float, int]:
    """Prequential recall@k over the items seen before each event, the key's earlier
    items excluded; the batch is scored with the weights from before it. Also returns
    the model's model.out_B (derived from the first events unless ``overrides`` set it)."""
    L = learner((*ITEM_BASE, *overrides), sample=events)
    index: dict[str, int] = {}
    first: list[int] = []  # event at which item j was first seen
    codes = np.empty((0, 0), dtype=np.int64)
    codes_size = L.task.code.size
    seen: dict[str, list[int]] = {}
    hits = evaluated = 0
    for start, stop in L.schedule.spans(len(events)):
        chunk = events[start:stop]
        fresh = [e["item"] for e in chunk if e["item"] not in index]
        for j, e in enumerate(chunk):
            if e["item"] not in index:
                index[e["item"]] = len(first)
                first.append(start + j)
        if fresh:
            new = L.task.code.ids(list(dict.fromkeys(fresh)))
            codes = new if codes.size == 0 else np.concatenate([codes, new])
        if codes.size and len(codes) and codes_size != L.task.code.size:  # the output space grew
            codes, codes_size = L.task.code.ids(list(index)), L.task.code.size
        codes_size = L.task.code.size
        b = L.prepare(chunk)
        scores = item_scores(L, b, codes) if b.examples else None
        first_arr = np.asarray(first)
        row = 0
        for j, e in enumerate(chunk):
            key, item = e["key"], index[e["item"]]
            if key in seen:
                s = scores[row]
                row += 1
                s[first_arr >= start + j] = -np.inf
                s[seen[key]] = -np.inf
                top = np.argpartition(-s, k)[:k] if len(s) > k else np.arange(len(s))
                hits += bool(item in top[np.isfinite(s[top])])
                evaluated += 1
            seen.setdefault(key, []).append(item)
        L.learn_batch(b)
    return hits / max(evaluated, 1), L.cfg.model.out_B


# ---------------------------------------------------------------------------- report

def run(task: str, names: list[str], overrides: list[str], seeds: list[int], cache: Path,
        limit: int | None = None) -> list[dict]:
    out = []
    for name in names:
        t = time.perf_counter()
        data = (TEXT_STREAMS if task == "text" else ITEM_STREAMS)[name]()
        if limit:  # a short run: the stream's first ``limit`` records, its peers cached under their own name
            data, name = data[:limit], f"{name}:{limit}"
        if task == "text":
            hashing = load_config(overrides=["learner.task=classify", *overrides], use_env=False).hashing
            peer = cached_peers(cache, f"{name}|{tokens_signature(hashing)}",
                                lambda data=data, hashing=hashing: text_peers(data, hashing))
            best_name = max((p for p in peer if peer[p]["best"] is not None), key=lambda p: peer[p]["best"])
            best = peer[best_name]["best"]
            scores = [classify(data, [*overrides, f"learner.seed={s}", f"hashing.seed={s}"]) for s in seeds]
            sizes = []
            ratio = lambda x, best=best: (x - best) * 100  # noqa: E731  points over the best peer
        else:
            peer = cached_peers(cache, name, lambda data=data: item_peers(data))
            best_name = max(("markov", "popularity"), key=lambda p: peer[p])
            best = peer[best_name]
            scores, sizes = zip(*(next_item(data, [*overrides, f"learner.seed={s}", f"hashing.seed={s}"])
                                  for s in seeds))
            ratio = lambda x, best=best: x / best  # noqa: E731
        row = {"task": task, "stream": name, "overrides": overrides, "seeds": seeds, "scores": scores,
               "mean": float(np.mean(scores)), "min": float(np.min(scores)), "best_peer": best_name,
               "best_peer_score": best, "peers": peer, "ratio_mean": ratio(np.mean(scores)),
               "ratio_min": ratio(np.min(scores)), "seconds": time.perf_counter() - t, "out_B": list(sizes)}
        unit = "pt" if task == "text" else "x"
        size = f" | out_B {'/'.join(map(str, sorted(set(sizes))))}" if sizes else ""
        print(f"{name:11s} model {row['mean']:.4f} (min {row['min']:.4f}) | {best_name} {best:.4f} | "
              f"{row['ratio_mean']:+.3f}{unit} (min {row['ratio_min']:+.3f}{unit}){size} | {row['seconds']:.0f}s",
              flush=True)
        out.append(row)
    worst = min(out, key=lambda r: r["ratio_min"])
    print(f"worst: {worst['stream']} {worst['ratio_min']:+.3f} (min over seeds)  overrides: {' '.join(overrides) or '-'}")
    return out


def main() -> int:
    ap = parser_for(__doc__)
    ap.add_argument("--task", choices=("text", "next-item", "all"), default="all",
                    help="the streams of this task (default %(default)s)")
    ap.add_argument("--streams", nargs="*", metavar="NAME",
                    help=f"these streams of --task only; text: {', '.join(TEXT_STREAMS)}; "
                    f"next-item: {', '.join(ITEM_STREAMS)} (default: all of --task's)")
    ap.add_argument("--seeds", nargs="+", type=nonneg_int, default=[0, 1, 2],
                    help="learner.seed and hashing.seed of the model's runs (default 0 1 2)")
    ap.add_argument("--set", nargs="*", default=[], dest="overrides", help="config overrides (dotted)")
    ap.add_argument("--threads", type=positive_int, default=1, help="torch threads (default %(default)s)")
    ap.add_argument("--limit", type=positive_int, default=None,
                    help="the first N records of each stream (short runs; default: all)")
    ap.add_argument("--cache", type=Path, default=Path(__file__).resolve().parent / "out" / "peers.json",
                    help="the peers' results, computed once (default bench/out/peers.json)")
    ap.add_argument("--log", type=Path, default=None, help="append every run to this file as a JSON line")
    ap.add_argument("--tag", default="", help="a tag for the runs in --log")
    add_data_option(ap)
    args = ap.parse_args()
    tasks = {"text": TEXT_STREAMS, "next-item": ITEM_STREAMS}
    known = {name for task, streams in tasks.items() if args.task in (task, "all") for name in streams}
    unknown = [name for name in args.streams or () if name not in known]
    if unknown:
        ap.error(f"--streams {' '.join(unknown)}: not a stream of --task {args.task}; "
                 + "; ".join(f"{task}: {', '.join(streams)}" for task, streams in tasks.items()
                             if args.task in (task, "all")))
    global DATA
    DATA = data_dir(args.data)
    torch.set_num_threads(args.threads)
    rows = []
    for task, streams in (("text", TEXT_STREAMS), ("next-item", ITEM_STREAMS)):
        names = [n for n in (args.streams or streams) if n in streams]
        if args.task in (task, "all") and names:
            rows += run(task, names, args.overrides, args.seeds, args.cache, args.limit)
    if args.log:
        with args.log.open("a") as f:
            for r in rows:
                f.write(json.dumps({"tag": args.tag, **r}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
