"""War and Peace as a token stream: the model at depths 0/1/2 against counting, both token tasks.

    python bench/tokens.py [--data DIR] [--stream war-and-peace|sms|ag-news|yelp] [--records N]
                           [--seeds 3] [--depths 0,1,2] [--tasks next-token,mlm]
                           [--rss-records 500000] [--parts quality,speed,rss] [--dry-run]

Stream (from --data, default ../shared/data next to the repository): War and Peace split on
whitespace into records of 32 words ``{"text": ...}`` in book order (17,578 records; the
product's tokenizer makes punctuation marks tokens, so a record holds about 39 tokens); a
synthetic Zipf text of the same record count stands in, labelled SYNTHETIC, without it.
``--stream war-and-peace-sentences`` cuts the same book into its sentences instead (a word
ending in ``.``, ``!`` or ``?``, closing quotes after it allowed, ends a record; 64 words at
most: 33,778 records of about 17 words), the other cut the issue names.
``--stream sms``, ``ag-news`` or ``yelp`` reads instead the texts of a classification set,
one record per message, article or review sentence in file order, labels dropped
(bench/data.py's readers and synthetic stand-ins): English token streams, shorter and of
other registers, to check the defaults on streams they were not chosen on (the table is
printed, never written).

Per task, one prequential pass of ``replay`` (each mini-batch predicted, then learned) at
the task's defaults with ``model.layers`` set to each depth, for each ``learner.seed``;
``markov`` and ``ngram`` run in the first pass, predicting then learning record by record
(their results do not depend on the model's seed). recall@10 overall and over the last 20%
of the records (a rolling window exactly that many events long, counted with the task's
own event builder, so every contestant is scored on the same events).

Speed and sparsity at the defaults, from a learner that has seen the first 80% of the
stream: ``learn_many`` records/s over the last 20% in mini-batches, rows each step changed
(every row table, optimizer state included) and their bytes (what an incremental
checkpoint of that step writes); and a bare-torch reference of the same shape measured in
the same run, the two taking turns of ``TURN`` batches: ``nn.Embedding`` over token ids for
the hash embedding, torch's own ``TransformerEncoderLayer`` stack as the model's (pre-LN,
GELU, a final LayerNorm) at the same width, heads, ffn and mask (next-token's causal mask
without a padding mask: the right padding is never attended, as in the model's encoder),
mlm at depth 0 reading each masked slot's record pooled over its other tokens (the model's
depth-0 readout, word2vec's CBOW; until 2026-11-27 the reference read the slot's own [MASK]
input there, a lookup that learns no context and passes no gradient to the context's rows),
the same sampled softmax (the batch's answers plus the same number of uniform negatives,
``nn.Embedding`` output rows), SparseAdam on the embeddings and Adam on the rest. The reference has no
count part and no hashing: it is the floor the hashed model's bookkeeping is measured
against, not a contestant. Both run on the learner's device (on CUDA with pinned copies
and bf16 autocast, timed to a synchronize). A record of 32 words holds about 38 tokens, so
a second learner, warmed alike, also learns the same tail's tokens re-cut into records of
exactly 32 tokens (joined as text: the tokenizer gives back the same 32 tokens): the
records/s in issue 16's own unit. Each rate is wall clock, with the rate per CPU-second of
the timing thread beside it (as bench/speed.py): time the machine's other tenants take
shows in the first only.

Memory: RSS of a ``Learner`` used from Python at the defaults, sampled every tenth of
``--rss-records`` records while the stream is fed round and round (an endless stream: the
vocabulary stops growing after the first pass, so growth after it is a leak).

``--parts`` runs some of the three (quality, speed, memory), e.g. ``--parts speed,rss``
for the figures that take minutes rather than the hour the replays take.

The table goes between ``<!-- bench/tokens.py:begin -->`` and ``<!-- bench/tokens.py:end -->``
in docs/benchmarks.md unless --dry-run.
"""
from __future__ import annotations

import datetime
import itertools
import os
import re
import resource
import statistics
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from data import ROOT, ag_news, add_data_option, data_dir, text_stream, write_between_markers
from options import add_set_option, names, nonneg_int, parser_for, positive_int, run_main, whole_numbers

from streamlearn.config import load_config
from streamlearn.device import Device
from streamlearn.learner import Learner
from streamlearn.records import from_dict
from streamlearn.replay import ReplayOptions, run_replay
from streamlearn.replay.sources import Item

BEGIN, END = "<!-- bench/tokens.py:begin -->", "<!-- bench/tokens.py:end -->"
FILE = "war-and-peace/war-and-peace.txt"
WORDS = 32  # words per record, as TOKEN-STREAMS.md
TARGETS = {"markov": 1.25, "ngram": 1.05}  # issue 16: recall@10 ratios, overall and last 20%
K = 10


# ---------------------------------------------------------------------------- stream

STREAMS = {"war-and-peace": f"of {WORDS} words in book order",
           "war-and-peace-sentences": f"(one per sentence, at most {2 * WORDS} words, in book order)",
           "sms": "(one per message, in file order)",
           "ag-news": "(one per article, in file order)",
           "yelp": "(one per review sentence, in file order)"}
BOOK = ("war-and-peace", "war-and-peace-sentences")  # the streams cut from War and Peace


def stream(data: Path, n: int, name: str = "war-and-peace") -> tuple[list[dict], str]:
    """The records of stream ``name`` (:data:`STREAMS`) and where they came from (``n``:
    the first n; 0: all)."""
    if name not in BOOK:
        got = ag_news(data) if name == "ag-news" else text_stream(name, data)
        records = [{"text": r["text"]} for r in got.records]
        source = got.source if got.synthetic else " + ".join(os.path.relpath(f, ROOT) for f in got.source.split(" + "))
        return (records[:n] if n else records), source
    file = data / FILE
    if file.is_file():
        words = file.read_text(encoding="utf-8").split()
        source = os.path.relpath(file, ROOT)  # no machine's absolute path in the docs
    else:
        words = synthetic_words(17_578 * WORDS)
        source = f"SYNTHETIC Zipf text standing in for War and Peace ({file} not found)"
    if name == "war-and-peace-sentences":
        records = [{"text": " ".join(s)} for s in sentences(words, 2 * WORDS)]
    else:
        records = [{"text": " ".join(words[i:i + WORDS])} for i in range(0, len(words), WORDS)]
    return (records[:n] if n else records), source


_SENTENCE_END = re.compile(r"[.!?][\"'\u2019\u201d)\]]*$")  # the last word of a sentence, closing quotes after it


def sentences(words: list[str], most: int) -> list[list[str]]:
    """``words`` cut after each word that ends a sentence, and after ``most`` words.

    >>> sentences("He said: “No.” Then he left! And".split(), 64)
    [['He', 'said:', '“No.”'], ['Then', 'he', 'left!'], ['And']]
    """
    out, current = [], []
    for word in words:
        current.append(word)
        if len(current) == most or _SENTENCE_END.search(word):
            out.append(current)
            current = []
    return out + [current] if current else out


def synthetic_words(n: int, seed: int = 0) -> list[str]:
    """A first-order chain over 5,000 Zipf-weighted words: each word's successors are
    drawn from its own 20 (so order carries signal for the counters and the model)."""
    rng = np.random.default_rng(seed)
    follow = rng.zipf(1.4, (5_000, 20)) % 5_000  # (word, 20 successors)
    out, w = [], 0
    for step in rng.random(n):
        w = int(follow[w, int(step * 20)]) if step > 0.1 else int(rng.zipf(1.3) % 5_000)
        out.append(f"w{w}")
    return out


def items(records: list[dict]) -> list[Item]:
    return [Item(from_dict(r), None, f"bench:{i}") for i, r in enumerate(records)]


def config(task: str, depth: int | None, seed: int, extra: tuple[str, ...]):
    sets = [f"learner.task={task}", f"learner.seed={seed}", *extra]
    if depth is not None:
        sets.append(f"model.layers={depth}")
    return load_config(None, sets, use_env=False)


def last_events(task: str, records: list[dict]) -> int:
    """Events (scored answers) of the last 20% of ``records``, by the task's event builder."""
    build = Learner(config(task, None, 0, ())).task.events(0)
    start = len(records) - len(records) // 5
    return sum(len(build(i, from_dict(r))) for i, r in enumerate(records) if i >= start)


# ---------------------------------------------------------------------------- quality

def quality(task: str, records: list[dict], depths: list[int], seeds: list[int], extra: tuple[str, ...]) -> dict:
    """recall@10 (overall, last 20%) per (depth, seed), and the baselines' from the first run."""
    window = max(1, last_events(task, records))
    runs, baselines = {}, {}
    for depth, seed in itertools.product(depths, seeds):
        options = ReplayOptions(window=window, k=K, baselines=() if baselines else ("markov", "ngram"))
        started = time.perf_counter()
        result = run_replay(items(records), {"model": Learner(config(task, depth, seed, extra))}, options)
        wall = time.perf_counter() - started
        for c in result.contestants:
            scores = (c.metrics.overall()[f"recall@{K}"], c.metrics.rolling()[f"recall@{K}"])
            if c.is_model:
                runs[depth, seed] = {"scores": scores, "rate": len(records) / c.seconds if c.seconds else 0.0,
                                     "wall": wall}
            else:
                baselines[c.name] = {"scores": scores, "rate": len(records) / c.seconds if c.seconds else 0.0}
        print(f"  {task} depth {depth} seed {seed}: {runs[depth, seed]['scores']} ({wall:.0f} s)", file=sys.stderr)
    return {"runs": runs, "baselines": baselines, "window": window}


# ---------------------------------------------------------------------------- speed and sparsity

TURN = 25  # batches each contestant of the speed part learns before the next takes its turn


def speed(task: str, records: list[dict], extra: tuple[str, ...]) -> dict:
    """learn_many records/s, rows and row bytes per step at the defaults after 80% of the
    stream, against the bare-torch reference over the same batches; and ``rate32``, the
    records/s of a second learner, warmed alike, over the same tail's tokens re-cut into
    records of exactly 32 tokens (the unit of issue 16's 1,000 records/s). The three take
    turns of :data:`TURN` batches, so a shared machine's slow minutes fall on all of them
    alike and the ratio does not move with them (a turn of one batch would let each evict
    the other's tables from the CPU's caches between steps: the reference measured about a
    fifth slower so). Each rate is (wall clock, per CPU-second): :class:`Clock`."""
    cfg = config(task, None, 0, extra)
    cut = len(records) - len(records) // 5
    learner, again = _warmed(cfg, records[:cut]), _warmed(cfg, records[:cut])
    tail = _batches(learner, records[cut:])
    tokens = [t for r in records[cut:] for t in learner.prep.cut(learner.prep.text_tokens(from_dict(r)))]
    # as text, so the tokenizer's time counts as in the records above (it gives back the same 32 tokens)
    recut = [{"text": " ".join(tokens[i:i + 32])} for i in range(0, len(tokens) - 31, 32)]
    recut = _batches(again, recut)
    reference = BareTorch(learner, cfg, tail)
    sizes = {name: t[0].numel() * t.element_size() for name, t in learner.row_tables().items()}
    rows, nbytes = [], []
    clocks = {name: Clock(learner.dev) for name in ("rate", "reference", "rate32")}
    for block in range(0, max(len(tail), len(recut)), TURN):
        with clocks["rate"]:
            for batch in tail[block:block + TURN]:
                report = learner.learn_many(batch)
                rows.append(sum(len(ids) for ids in report.rows.values()))
                nbytes.append(sum(len(ids) * size for base, ids in report.rows.items()
                                  for name, size in sizes.items() if name == base or name.startswith(base + ".")))
        with clocks["reference"]:
            for i in range(block, min(block + TURN, len(tail))):
                reference.step(i)
        with clocks["rate32"]:
            for batch in recut[block:block + TURN]:
                again.learn_many(batch)
    learned = sum(map(len, tail))
    table_rows = sum(t.shape[0] for name, t in learner.value_tables().items())
    return {"rate": clocks["rate"].rates(learned), "rows": statistics.mean(rows), "bytes": statistics.mean(nbytes),
            "table_rows": table_rows, "reference": clocks["reference"].rates(learned), "layers": cfg.model.layers,
            "batch": len(tail[0]), "tokens": len(tokens) / (len(records) - cut),
            "rate32": clocks["rate32"].rates(sum(map(len, recut)))}


class Clock:
    """Time spent inside ``with clock:`` blocks, summed, wall clock and CPU time of this
    thread (as bench/speed.py): a shared machine's stolen time shows in the first only; on
    CUDA the GPU's time shows in the first only (each block ends with a synchronize)."""

    def __init__(self, dev: Device):
        self.dev, self.wall, self.cpu = dev, 0.0, 0.0

    def __enter__(self):
        self._at = time.perf_counter(), time.thread_time()

    def __exit__(self, *exc):
        self.dev.synchronize()
        self.wall += time.perf_counter() - self._at[0]
        self.cpu += time.thread_time() - self._at[1]

    def rates(self, records: int) -> tuple[float, float]:
        """(records / wall seconds, records / CPU seconds) over the blocks."""
        return records / max(self.wall, 1e-9), records / max(self.cpu, 1e-9)


def _warmed(cfg, records: list[dict]) -> Learner:
    """A learner at ``cfg`` that has learned ``records`` in mini-batches."""
    learner = Learner(cfg)
    for batch in _batches(learner, records):
        learner.learn_many(batch)
    return learner


def _batches(learner: Learner, records: list) -> list[list]:
    """``records`` in the mini-batches the worker and replay would give ``learner`` next
    (:class:`~streamlearn.batching.Schedule`: from its step count on)."""
    return list(learner.schedule.batches(records, learner.steps))


class BareLM(nn.Module):
    """The reference: token ids -> nn.Embedding + positions -> torch's encoder -> states."""

    def __init__(self, vocab: int, d: int, layers: int, heads: int, ffn: int, positions: int):
        super().__init__()
        self.emb = nn.Embedding(vocab, d, sparse=True)
        self.pos = nn.Embedding(positions, d)
        layer = nn.TransformerEncoderLayer(d, heads, ffn, dropout=0.0, activation="gelu", batch_first=True,
                                           norm_first=True)
        self.encoder = (nn.TransformerEncoder(layer, layers, norm=nn.LayerNorm(d), enable_nested_tensor=False)
                        if layers else None)
        self.out = nn.Embedding(vocab, d, sparse=True)
        self.out_b = nn.Embedding(vocab, 1, sparse=True)

    def forward(self, ids: torch.Tensor, pad: torch.Tensor, causal: torch.Tensor | None) -> torch.Tensor:
        """States (b, t, d); ``causal``: the (t, t) mask of a language model, whose right
        padding no token attends to, so it takes no padding mask (as the model's encoder)."""
        x = self.emb(ids) + self.pos(torch.arange(ids.shape[1], device=ids.device))  # (b, t, d)
        if self.encoder is None:
            return x
        if causal is not None:
            return self.encoder(x, mask=causal, is_causal=True)
        return self.encoder(x, src_key_padding_mask=pad)


class BareTorch:
    """:class:`BareLM` learning the same batches as the learner with the same objective
    shape: next-token at every position (causal), mlm at ``learner.mask_prob`` of them; on
    the learner's device, as it runs there (pinned copies and bf16 autocast on CUDA).
    :meth:`step` learns batch ``i``; the token ids are made beforehand, untimed."""

    def __init__(self, learner: Learner, cfg, tail: list[list[dict]]):
        m = cfg.model
        vocab: dict[str, int] = {}
        self.batches = [[[vocab.setdefault(t, len(vocab))
                          for t in learner.prep.text_tokens(from_dict(r))[:cfg.hashing.max_tokens]] for r in batch]
                        for batch in tail]
        width = max(len(s) for b in self.batches for s in b) + 1
        self.dev, self.vocab, self.negatives, self.mask_prob = learner.dev, len(vocab), m.negatives, cfg.learner.mask_prob
        self.lm = BareLM(len(vocab) + 2, m.d_model, m.layers, m.heads, m.ffn, width).to(self.dev.torch)
        sparse = [self.lm.emb.weight, self.lm.out.weight, self.lm.out_b.weight]
        dense = [p for p in self.lm.parameters() if all(p is not q for q in sparse)]
        self.opts = [torch.optim.SparseAdam(sparse, lr=cfg.optim.sparse_lr),
                     torch.optim.Adam(dense, lr=cfg.optim.dense_lr)]
        self.causal = cfg.learner.task == "next-token"
        self.pools = not self.causal and m.layers == 0  # mlm's depth-0 readout (module docstring)
        self.gen = torch.Generator().manual_seed(0)

    def step(self, i: int) -> None:
        seqs, dev, lm = self.batches[i], self.dev, self.lm
        t = max(map(len, seqs)) + 1
        ids = torch.zeros(len(seqs), t, dtype=torch.long)  # 0: BOS / MASK / pad
        for j, s in enumerate(seqs):
            ids[j, 1:len(s) + 1] = torch.tensor(s) + 2
        pad = torch.arange(t)[None, :] > torch.tensor([len(s) for s in seqs])[:, None]
        if self.causal:
            inputs, answers, where = ids[:, :-1], ids[:, 1:], ~pad[:, 1:]
        else:
            where = (torch.rand(ids.shape, generator=self.gen) < self.mask_prob) & ~pad
            where[:, 0] = False
            inputs, answers = ids.masked_fill(where, 1), ids
        negatives = torch.randint(2, self.vocab + 2, (self.negatives,), generator=self.gen)
        inputs, answers, where, negatives, pad = (dev.tensor(a.numpy())
                                                  for a in (inputs, answers, where, negatives, pad))
        with dev.autocast():
            if self.causal:
                mask = torch.ones(t - 1, t - 1, dtype=torch.bool, device=dev.torch).triu(1)  # True: not attended
                states = lm(inputs, pad[:, :-1], mask)
            else:
                states = lm(inputs, pad, None)
            y = answers[where]  # (n,)
            if self.pools:  # each slot reads its record's other tokens pooled, as the model at depth 0
                w = (~(pad | where)).unsqueeze(-1).to(states.dtype)  # (b, t, 1)
                h = ((states * w).sum(1) / w.sum(1).clamp_min(1.0).sqrt())[where.nonzero()[:, 0]]  # (n, d)
            else:
                h = states[where]  # (n, d)
            choices = torch.unique(torch.cat([y, negatives]))
            logits = h @ lm.out(choices).t() + lm.out_b(choices)[:, 0]  # (n, c)
        target = torch.searchsorted(choices, y)
        loss = F.cross_entropy(logits.float(), target)
        for o in self.opts:
            o.zero_grad()
        loss.backward()
        for o in self.opts:
            o.step()


# ---------------------------------------------------------------------------- memory

def rss_mb() -> float:
    """Resident set size now, MB (Linux /proc; elsewhere the peak from getrusage)."""
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
        return pages * resource.getpagesize() / 2 ** 20
    except OSError:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def memory(task: str, records: list[dict], total: int, extra: tuple[str, ...]) -> list[tuple[int, float]]:
    """(records learned, RSS MB) every tenth of ``total`` records, the stream fed round and round."""
    cfg = config(task, None, 0, extra)
    learner = Learner(cfg)
    every = max(1, total // 10)
    samples, seen = [(0, rss_mb())], 0
    while seen < total:
        at = seen % len(records)
        batch = records[at:at + learner.schedule.size(learner.steps)]
        learner.learn_many(batch)
        before, seen = seen, seen + len(batch)
        if seen // every > before // every:
            samples.append((seen, rss_mb()))
            print(f"  {task} rss: {seen:,} records {samples[-1][1]:.0f} MB", file=sys.stderr)
    return samples


# ---------------------------------------------------------------------------- report

def section(results: dict, source: str, command: str, records: int, seeds: list[int],
            shape: str = STREAMS["war-and-peace"]) -> str:
    device = Device.pick(load_config(None, use_env=False).learner.device)  # where the learners at their defaults run
    intro = (f"Produced by `{command}` on {datetime.date.today()} (torch {torch.__version__}, {device.describe()}; "
             f"one torch thread; the bare-torch reference runs there too). Stream: {source}, {records:,} records "
             f"{shape}.")
    if any("quality" in r for r in results.values()):
        intro += (f" recall@{K}; seeds {', '.join(map(str, seeds))} (model mean, min-max in brackets); baselines "
                  "predict then learn record by record. Ratios are the model's mean over the baseline's; records/s "
                  "are each contestant's own predict + learn time in the replay.")
    lines = [textwrap.fill(intro, width=100, break_long_words=False, break_on_hyphens=False), ""]
    for task, r in results.items():
        lines += _quality_lines(task, r["quality"]) if "quality" in r else [f"**{task}**"]
        if "speed" in r:
            s = r["speed"]
            lines += ["", f"At the defaults (`model.layers={s['layers']}`, batch {s['batch']}), after 80% of the stream: "
                      f"`learn_many` {_rate(s['rate'])} ({s['tokens']:.1f} tokens a record), bare torch of the "
                      f"same shape {_rate(s['reference'])} (**{s['rate'][0] / s['reference'][0]:.2f}x**; per "
                      f"CPU-second {s['rate'][1] / s['reference'][1]:.2f}x); over the same tail's tokens re-cut into "
                      f"records of exactly 32 tokens, {_rate(s['rate32'])}; "
                      f"{s['rows']:,.0f} rows changed per step of "
                      f"{s['table_rows']:,} rows in the value tables, {s['bytes'] / 2 ** 10:,.0f} KB of row data per "
                      "step (optimizer state included: what an incremental checkpoint of one step writes)."]
        if r.get("rss"):
            first, last = r["rss"][1] if len(r["rss"]) > 1 else r["rss"][0], r["rss"][-1]
            lines += ["", "RSS of a `Learner` fed the stream round and round: "
                      + ", ".join(f"{n:,}: {mb:,.0f} MB" for n, mb in r["rss"])
                      + f" ({last[1] - first[1]:+,.0f} MB from {first[0]:,} to {last[0]:,} records)."]
        lines.append("")
    return "\n".join(lines).rstrip()


def _rate(rates: tuple[float, float]) -> str:
    return f"{rates[0]:,.0f} records/s ({rates[1]:,.0f} per CPU-second)"


def _quality_lines(task: str, q: dict) -> list[str]:
    base = q["baselines"]
    lines = [f"**{task}** (last 20% = the last {q['window']:,} events)", "",
             "| contestant | recall@10 | last 20% | x markov | x ngram | x markov, last 20% | x ngram, last 20% | records/s |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for depth in sorted({d for d, _ in q["runs"]}):
        runs = [v for (d, _), v in q["runs"].items() if d == depth]
        means = [statistics.mean(v["scores"][i] for v in runs) for i in (0, 1)]
        spread = [f"{min(v['scores'][i] for v in runs):.4f}-{max(v['scores'][i] for v in runs):.4f}" for i in (0, 1)]
        ratios = [means[i] / base[b]["scores"][i] for i in (0, 1) for b in ("markov", "ngram")]
        lines.append(f"| model, `model.layers={depth}` | {means[0]:.4f} ({spread[0]}) | {means[1]:.4f} ({spread[1]}) | "
                     f"{ratios[0]:.3f}x | {ratios[1]:.3f}x | {ratios[2]:.3f}x | {ratios[3]:.3f}x | "
                     f"{statistics.mean(v['rate'] for v in runs):,.0f} |")
    for name in ("markov", "ngram"):
        b = base[name]
        lines.append(f"| {name} | {b['scores'][0]:.4f} | {b['scores'][1]:.4f} | | | | | {b['rate']:,.0f} |")
    return lines


def main() -> int:
    parser = parser_for(__doc__)
    add_data_option(parser)
    parser.add_argument("--stream", choices=sorted(STREAMS), default="war-and-peace",
                        help="the token stream (the table is written for war-and-peace only)")
    parser.add_argument("--records", type=nonneg_int, default=0,
                        help="first N records (0: the whole stream; default %(default)s)")
    parser.add_argument("--seeds", type=positive_int, default=3,
                        help="learner.seed 0..N-1 per depth (default %(default)s)")
    parser.add_argument("--depths", type=whole_numbers(0), default="0,1,2",
                        help="comma-separated model.layers values (default %(default)s)")
    parser.add_argument("--tasks", type=names(("next-token", "mlm")), default="next-token,mlm",
                        help="comma-separated token tasks to run (default %(default)s)")
    parser.add_argument("--rss-records", type=nonneg_int, default=500_000,
                        help="records for the memory curve (0: skip; default %(default)s)")
    add_set_option(parser, "for every model run, on top of the task's defaults")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "benchmarks.md",
                        help="markdown file whose marked section receives the table (default docs/benchmarks.md)")
    parser.add_argument("--parts", type=names(("quality", "speed", "rss")), default="quality,speed,rss",
                        help="comma-separated parts to run (default %(default)s)")
    parser.add_argument("--dry-run", action="store_true", help="print the table, write nothing")
    args = parser.parse_args()
    parts = set(args.parts)
    torch.set_num_threads(1)
    records, source = stream(data_dir(args.data), args.records, args.stream)
    depths = args.depths
    seeds = list(range(args.seeds))
    extra = tuple(args.set)
    tasks = args.tasks
    results = {task: {} for task in tasks}
    # the timed parts first, before the long quality runs: a shared machine is as quiet as
    # it gets at a run's start, and the quality figures do not depend on its load
    for task in tasks if "speed" in parts else ():
        results[task]["speed"] = speed(task, records, extra)
    for task in tasks:
        if "quality" in parts:
            results[task]["quality"] = quality(task, records, depths, seeds, extra)
        if "rss" in parts and args.rss_records:
            results[task]["rss"] = memory(task, records, args.rss_records, extra)
    command = "python bench/tokens.py " + " ".join(sys.argv[1:])
    text = section(results, source, command.strip(), len(records), seeds, STREAMS[args.stream])
    print(text)
    verdict = []
    for task, r in results.items():
        if "quality" not in r:
            continue
        q, best = r["quality"], None
        for depth in sorted({d for d, _ in q["runs"]}):
            means = [statistics.mean(v["scores"][i] for (d, _), v in q["runs"].items() if d == depth) for i in (0, 1)]
            worst = min(means[i] / q["baselines"][b]["scores"][i] / TARGETS[b] for i in (0, 1) for b in TARGETS)
            best = max(best or worst, worst)
        verdict.append(f"{task}: best depth's worst ratio / target {best:.3f} ({'met' if best >= 1 else 'missed'})")
    if verdict:
        print("targets: " + "; ".join(verdict))
    if not args.dry_run and args.stream == "war-and-peace":
        write_between_markers(args.out, BEGIN, END, text)
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
