"""Speed against the peers, every figure and its reference measured in the same run.

    python bench/speed.py [--data DIR] [--passes 3] [--dry-run] [--out docs/benchmarks.md]

Streams (from --data, default ../shared/data next to the repository): AG News (the
5,000-row sample, then the first 581 rows of the original file, 5,581 articles, as
bench/quality.py reads them) and the SMS Spam Collection (5,574). A stream whose files
are missing is replaced by bench/data.py's synthetic stream of its size and label
count, labelled SYNTHETIC in the table.

Per stream, each pass running every contestant once, in turn (a shared machine's load
comes and goes; every contestant meets it alike), each figure the best pass:

1. peers, one record at a time as a user runs them from Python: Vowpal Wabbit
   ``--oaa --ngram 2`` (``predict`` then ``learn``; skipped, said so, when the
   ``vowpalwabbit`` package is missing) and river ``MultinomialNB`` on ``BagOfWords``
   (``predict_one`` then ``learn_one``);
2. streamlearn at its defaults (depth 0, Naive Bayes part, batch 8): ``learn_many``
   (on a GPU machine also at ``learner.device=cpu``, where the step runs compiled)
   over the stream; prequential replay (``run_replay``: the model predicts each batch,
   then learns it; its records/s counts its own predict + learn time, as ``replay
   --file`` reports); a ``learn_one`` + ``predict_one`` loop from Python with torch's
   threads left to the library, and the same loop pinned at torch's default count (on
   the first 300 records: it is slow);
3. depth: ``model.layers=1`` and ``2`` ``learn_many`` against a bare-torch model of the
   same shape (the same tokenizer into a bounded dictionary, a plain sparse
   ``nn.Embedding``, the same pre-LN encoder, sqrt-n pooling and a linear head; SparseAdam
   for the embedding, AdamW for the rest, one step per batch of the learner's size), on
   the learners' device (on CUDA with pinned copies and bf16 autocast, timed to a
   synchronize).

4. start-up: a fresh ``streamlearn worker`` process at the defaults against the embedded
   broker, from its launch to its log line "first records learned" (bench/startup.py's
   ``manual`` path: --startup-runs runs after a warm-up, their median; 0 skips it).

Records/s are wall clock (per CPU-second in brackets: the process's thread CPU time,
which a loaded machine disturbs less). The table replaces the part of docs/benchmarks.md
between ``<!-- bench/speed.py:begin -->`` and ``<!-- bench/speed.py:end -->``.
"""
from __future__ import annotations

import statistics
import sys
import textwrap
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))

from data import add_data_option, ag_news, data_dir, text_stream, write_between_markers
from options import nonneg_int, parser_for, positive_int, run_main
import quality_streams as qs
import startup

from streamlearn.config import Config
from streamlearn.device import Device, set_threads, torch_default_threads
from streamlearn.hashing import tokenize
from streamlearn.learner import Learner
from streamlearn.records import from_dict
from streamlearn.replay import ReplayOptions, run_replay
from streamlearn.replay.sources import Item

ROOT = Path(__file__).resolve().parents[1]
BEGIN, END = "<!-- bench/speed.py:begin -->", "<!-- bench/speed.py:end -->"
TARGETS = {"learn_many": 10_000, "prequential / VW": 0.4, "learn_one loop": 2_000, "depth / bare torch": 0.7,
           "first learned s": 2.0}
STARTUP_RECORDS, STARTUP_PARTITIONS = 2000, 3  # the start-up runs' topic
ONE_LIMIT = 300  # records of the learn_one loop at torch's default threads
DEVICE = Device.pick(Config().learner.device)  # where the learners at their defaults run, and so the bare models


@dataclass
class Rate:
    """Best records/s over passes, wall clock and per CPU-second (thread time)."""

    wall: float = 0.0
    cpu: float = 0.0
    accuracy: float | None = None

    def add(self, records: int, wall_s: float, cpu_s: float, accuracy: float | None = None) -> None:
        self.wall = max(self.wall, records / wall_s)
        self.cpu = max(self.cpu, records / max(cpu_s, 1e-9))
        self.accuracy = accuracy if accuracy is not None else self.accuracy

    def cell(self) -> str:
        return f"{self.wall:,.0f} ({self.cpu:,.0f})" if self.cpu else f"{self.wall:,.0f}"


def timed(rate: Rate, records: int, run: Callable[[], float | None]) -> None:
    wall, cpu = time.perf_counter(), time.thread_time()
    accuracy = run()
    DEVICE.synchronize()  # a GPU's queued steps count in the time
    rate.add(records, time.perf_counter() - wall, time.thread_time() - cpu, accuracy)


def built(make: Callable[[], object], rate: Rate, records: int, run: Callable[[object], float | None]) -> None:
    """Time ``run(make())`` without ``make()``: a model's construction is not its learning."""
    model = make()
    timed(rate, records, lambda: run(model))


# ---------------------------------------------------------------------------- streams

def load_streams(data: Path) -> dict[str, list[dict]]:
    """AG News (as bench/quality.py reads it) and SMS, or labelled synthetic streams of
    their sizes named so (bench/data.py)."""
    streams = [ag_news(data), text_stream("sms", data)]
    for stream in streams:
        if stream.synthetic:
            print(stream.source, file=sys.stderr)
    return {("SYNTHETIC " if s.synthetic else "") + name: s.records for name, s in zip(("AG News", "SMS"), streams)}


# ---------------------------------------------------------------------------- streamlearn

def learn_many_loop(learner: Learner, records: list[dict]) -> None:
    size = learner.cfg.learner.batch_size
    for i in range(0, len(records), size):
        learner.learn_many(records[i:i + size])


def learner(*overrides: str) -> Callable[[], Learner]:
    return lambda: Learner(Config().override(*overrides))


def prequential(records: list[dict], rate: Rate) -> None:
    """``run_replay`` as ``replay --file`` runs it; the rate is the model's own predict +
    learn time (wall clock: the runner keeps no CPU clock, so no CPU-second figure)."""
    items = [Item(from_dict(r), None, f"bench:{i}") for i, r in enumerate(records)]
    model = run_replay(items, {"model": Learner(Config())}, ReplayOptions()).models[0]
    rate.wall = max(rate.wall, len(records) / model.seconds)
    rate.accuracy = model.metrics.overall()["accuracy"]


def one_loop(learner: Learner, records: list[dict]) -> float:
    hits = 0
    for r in records:
        hits += learner.predict_one({"text": r["text"]}) == r["label"]
        learner.learn_one({"text": r["text"]}, r["label"])
    return hits / len(records)


# ---------------------------------------------------------------------------- bare torch

class BareClassifier(nn.Module):
    """The plain torch model a user would write: dictionary ids -> nn.Embedding ->
    torch's pre-LN TransformerEncoder -> masked sqrt-n pooling -> a linear head."""

    def __init__(self, cfg: Config, labels: int):
        super().__init__()
        m = cfg.model
        self.emb = nn.Embedding(cfg.embedding.plain_vocab + 1, m.d_model, sparse=True)
        layer = nn.TransformerEncoderLayer(m.d_model, m.heads, m.ffn, m.dropout, activation="gelu",
                                           batch_first=True, norm_first=True)
        self.enc = nn.TransformerEncoder(layer, m.layers, norm=nn.LayerNorm(m.d_model), enable_nested_tensor=False)
        self.head = nn.Linear(m.d_model, labels)

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        h = self.enc(self.emb(ids), src_key_padding_mask=~mask)  # (N, T, d)
        w = mask.unsqueeze(-1).to(h.dtype)
        return self.head((h * w).sum(1) / w.sum(1).clamp_min(1.0).sqrt())  # (N, labels)


class Bare:
    """:class:`BareClassifier` with its optimizers, dictionary and label ids: one step
    per batch of ``learner.batch_size`` (SparseAdam for the embedding, AdamW for the rest,
    both at ``optim.dense_lr``), on the learners' device as they run there (pinned copies
    and bf16 autocast on CUDA)."""

    def __init__(self, layers: int, labels: Sequence):
        self.cfg = Config().override(f"model.layers={layers}")
        self.label_id = {lab: i for i, lab in enumerate(labels)}
        self.model = BareClassifier(self.cfg, len(labels)).to(DEVICE.torch)
        lr = self.cfg.optim.dense_lr
        self.sparse = torch.optim.SparseAdam(list(self.model.emb.parameters()), lr=lr)
        self.dense = torch.optim.AdamW([p for n, p in self.model.named_parameters() if not n.startswith("emb.")], lr=lr)
        self.vocab: dict[str, int] = {}

    def learn(self, chunk: list[dict]) -> None:
        h, cap = self.cfg.hashing, self.cfg.embedding.plain_vocab
        lists = [[_word_id(self.vocab, t, cap) for t in tokenize(r["text"], h.ngrams, h.lowercase)][:h.max_tokens]
                 for r in chunk]
        width = max(map(len, lists))
        ids = np.array([row + [0] * (width - len(row)) for row in lists])  # (N, T)
        mask = np.arange(width) < np.array([len(row) for row in lists])[:, None]  # (N, T)
        y = np.array([self.label_id[r["label"]] for r in chunk])
        ids, mask, y = DEVICE.tensor(ids), DEVICE.tensor(mask), DEVICE.tensor(y)
        with DEVICE.autocast():
            logits = self.model(ids, mask)
        loss = F.cross_entropy(logits.float(), y)
        loss.backward()
        self.sparse.step()
        self.dense.step()
        self.sparse.zero_grad(set_to_none=True)
        self.dense.zero_grad(set_to_none=True)


def bare_loop(bare: Bare, records: list[dict]) -> None:
    size = bare.cfg.learner.batch_size
    for i in range(0, len(records), size):
        bare.learn(records[i:i + size])


def _word_id(vocab: dict[str, int], token: str, cap: int) -> int:
    """A bounded dictionary: the first ``cap`` distinct tokens get ids 1..cap; the rest 0."""
    got = vocab.get(token)
    if got is None:
        got = vocab[token] = len(vocab) + 1 if len(vocab) < cap else 0
    return got


# ---------------------------------------------------------------------------- one stream

def measure(records: list[dict], passes: int, vw: bool) -> dict[str, Rate]:
    rates = {name: Rate() for name in ("vw", "river_nb", "learn_many", "prequential", "learn_one", "learn_one_default",
                                       "layers1", "bare1", "layers2", "bare2", "learn_many_cpu")}
    labels = sorted({r["label"] for r in records}, key=str)
    n = len(records)
    for p in range(passes):
        print(f"  pass {p + 1}/{passes}", file=sys.stderr, flush=True)
        if vw:
            timed(rates["vw"], n, lambda: qs.vw_oaa(records))
        timed(rates["river_nb"], n, lambda: qs.river_nb(records))
        built(learner(), rates["learn_many"], n, lambda lrn: learn_many_loop(lrn, records))
        if DEVICE.cuda:  # what `learner.device=cpu` gives a GPU machine's user: the compiled step
            built(learner("learner.device=cpu"), rates["learn_many_cpu"], n, lambda lrn: learn_many_loop(lrn, records))
        prequential(records, rates["prequential"])
        built(learner(), rates["learn_one"], n, lambda lrn: one_loop(lrn, records))
        for layers in (1, 2):
            built(learner(f"model.layers={layers}"), rates[f"layers{layers}"], n,
                  lambda lrn: learn_many_loop(lrn, records))
            built(lambda layers=layers: Bare(layers, labels), rates[f"bare{layers}"], n,
                  lambda bare: bare_loop(bare, records))
    default, chosen = torch_default_threads(), torch.get_num_threads()
    if default is not None and default != chosen:
        set_threads(default)  # the loop as a program ran it before the library chose its threads
        built(learner(), rates["learn_one_default"], ONE_LIMIT, lambda lrn: one_loop(lrn, records[:ONE_LIMIT]))
        set_threads(chosen)
    return rates


def warm_up(records: list[dict], first: bool) -> None:
    """Load what the first learner, step and replay import lazily, outside any timing,
    and the kernels a transformer layer first calls (``first``: the run's first stream;
    that is once per process). On a GPU, also a layer's first pass over each stream:
    torch's attention there (cuDNN's, on Hopper) builds a plan the first time it meets
    each (batch, length) shape, so whichever model met a stream's shapes first paid for
    them all (on an H200, SMS's 2,000 records: the first depth-1 learner 170 records/s,
    the next ones 1,138), a cost paid once per shape, not per step of a long run."""
    if first:
        learn_many_loop(Learner(Config()), records[:64])
        bare_loop(Bare(1, sorted({r["label"] for r in records[:64]}, key=str)), records[:64])
        prequential(records[:64], Rate())
    if first and DEVICE.cuda:
        learn_many_loop(learner("learner.device=cpu")(), records[:64])  # the compiled kernels' loading
    if first or DEVICE.cuda:
        learn_many_loop(learner("model.layers=1")(), records if DEVICE.cuda else records[:64])


# ---------------------------------------------------------------------------- report

def rows(name: str, r: dict[str, Rate], vw: bool) -> list[str]:
    def ratio(a: Rate, b: Rate) -> str:
        return f"**{a.wall / b.wall:.2f}x**" if b.wall else "-"

    def acc(rate: Rate) -> str:
        return f"{rate.accuracy:.4f}" if rate.accuracy is not None else "-"

    vw_cell = r["vw"].cell() if vw else "not installed"
    out = [
        f"| {name} | Vowpal Wabbit `--oaa --ngram 2`, predict + learn per record | {vw_cell} | {acc(r['vw'])} | "
        "reference | |",
        f"| {name} | river MultinomialNB, predict_one + learn_one | {r['river_nb'].cell()} | {acc(r['river_nb'])} | "
        f"{ratio(r['river_nb'], r['vw']) if vw else '-'} of VW | |",
        f"| {name} | streamlearn `learn_many`, defaults | {r['learn_many'].cell()} | | "
        f"{ratio(r['learn_many'], r['vw']) if vw else '-'} of VW | >= {TARGETS['learn_many']:,} rec/s |",
        *([f"| {name} | the same at `learner.device=cpu` (the compiled step) | {r['learn_many_cpu'].cell()} | | "
           f"{ratio(r['learn_many_cpu'], r['learn_many'])} of the GPU's | |"] if r["learn_many_cpu"].wall else []),
        f"| {name} | streamlearn prequential replay (predict + learn), defaults | {r['prequential'].cell()} | "
        f"{acc(r['prequential'])} | {ratio(r['prequential'], r['vw']) if vw else '-'} of VW | >= 0.4x VW |",
        f"| {name} | streamlearn `learn_one` + `predict_one` loop, threads left to the library | "
        f"{r['learn_one'].cell()} | {acc(r['learn_one'])} | {ratio(r['learn_one'], r['river_nb'])} of river NB | "
        f">= {TARGETS['learn_one loop']:,} rec/s |",
    ]
    if r["learn_one_default"].wall:
        out.append(f"| {name} | the same loop at torch's default threads (first {ONE_LIMIT} records) | "
                   f"{r['learn_one_default'].cell()} | | {ratio(r['learn_one_default'], r['learn_one'])} of the "
                   "loop above | |")
    for layers in (1, 2):
        out.append(f"| {name} | `model.layers={layers}` `learn_many` / bare torch of the same shape | "
                   f"{r[f'layers{layers}'].cell()} / {r[f'bare{layers}'].cell()} | | "
                   f"{ratio(r[f'layers{layers}'], r[f'bare{layers}'])} of bare torch | >= 0.7x bare torch |")
    return out


def startup_rows(runs: list[dict[str, float]]) -> list[str]:
    """The start-up table: median and every run of bench/startup.py's manual path."""
    def cell(mark: str) -> str:
        values = [r[mark] for r in runs]
        return f"{statistics.median(values):.2f} s ({', '.join(f'{v:.2f}' for v in values)})"

    return ["", f"Start-up: a fresh `streamlearn worker` process at the defaults, {STARTUP_RECORDS:,} SMS records on "
            f"{STARTUP_PARTITIONS} partitions of the embedded broker, from its launch (median of {len(runs)}, each run in brackets):", "",
            "| mark | seconds from process start | target |", "|---|---:|---|",
            f"| worker ready (imports, config, state, model) | {cell('worker ready')} | |",
            f"| first record learned | {cell('first learned')} | <= {TARGETS['first learned s']:g} s |",
            f"| exit (all records learned, final checkpoint) | {cell('exit')} | |"]


def section(results: dict[str, tuple[int, dict[str, Rate]]], vw: bool, command: str, passes: int,
            starts: list[dict[str, float]]) -> str:
    intro = (f"Produced by `{command}` on {time.strftime('%Y-%m-%d', time.gmtime())} (torch {torch.__version__}, "
             f"{DEVICE.describe()}; the bare-torch models run there too: compare figures "
             f"within this table only). Best of {passes} passes, each running every contestant once in turn; "
             "records/s wall clock, per thread CPU-second in brackets; accuracy is prequential (each record "
             "predicted before it is learned). streamlearn runs at its defaults (depth 0, Naive Bayes part, batch "
             f"{Config().learner.batch_size}) with torch's intra-op threads left to the library (one less than "
             "the cores, at least 1). " + " ".join(
                 f"{name}: {n:,} records." for name, (n, _) in results.items()))
    table = ["| stream | contestant | records/s (per CPU-s) | accuracy | ratio | target |",
             "|---|---|---:|---:|---:|---|"]
    for name, (_, r) in results.items():
        table += rows(name, r, vw)
    if starts:
        table += startup_rows(starts)
    return "\n".join([textwrap.fill(intro, width=100, break_long_words=False, break_on_hyphens=False), "",
                      *table])


def main() -> int:
    parser = parser_for(__doc__)
    add_data_option(parser)
    parser.add_argument("--passes", type=positive_int, default=3,
                        help="passes per contestant; the best counts (default %(default)s)")
    parser.add_argument("--records", type=nonneg_int, default=0,
                        help="first N records of each stream (0: all; default %(default)s)")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "benchmarks.md",
                        help="markdown file whose marked section receives the table (default docs/benchmarks.md)")
    parser.add_argument("--startup-runs", type=nonneg_int, default=3,
                        help="worker start-ups to time after a warm-up (0: none; default %(default)s)")
    parser.add_argument("--dry-run", action="store_true", help="print the table, write nothing")
    args = parser.parse_args()
    vw = qs.vw_oaa([{"text": "a b", "label": "x"}]) is not None
    if not vw:
        print("vowpalwabbit is not installed (pip install vowpalwabbit): VW rows are skipped", file=sys.stderr)
    results = {}
    streams = load_streams(data_dir(args.data))
    for i, (name, records) in enumerate(streams.items()):
        records = records[:args.records] if args.records else records
        warm_up(records, first=i == 0)
        print(f"{name}: {len(records):,} records", file=sys.stderr, flush=True)
        results[name] = (len(records), measure(records, args.passes, vw))
    starts = []
    if args.startup_runs > 0:
        print("worker start-up", file=sys.stderr, flush=True)
        starts = startup.measure(STARTUP_RECORDS, STARTUP_PARTITIONS, args.startup_runs, {"manual": []})["manual"]
    text = section(results, vw, " ".join(["python bench/speed.py", *sys.argv[1:]]), args.passes, starts)
    if not args.dry_run:
        write_between_markers(args.out, BEGIN, END, text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
