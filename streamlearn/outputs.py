"""Output codes: how a token-output task names its answers in the head's rows. numpy only.

A task that answers with tokens (mlm, next-item, next-token) predicts over a hashed
output space and decodes against the tokens the stream has shown (a candidate index).
The code is the numpy half of that output, shared by the ingest stage (training
targets), the learner (the candidate index, decoding) and the head's shape:

- :class:`HashedCode` (Superbloom): m hashes of each token into [0, size); a token's
  score is the sum of its m bucket log-probabilities; decoded by beam search with an
  exactness certificate (or exhaustively, with per-record exclusions).
- :class:`PatternCode` (T-Free): the m hashes of each character trigram into v rows; a
  word's score is the sum of its pattern's logits.
- :class:`SampledCode`: m hashes of each token into ``size`` rows of an output table of
  the head's own; a token's vector is the sum of its m rows, and the head's softmax runs
  over tokens, not buckets: while learning over the batch's answers plus negatives drawn
  from the candidate index (the gradient reaches those rows only), when answering over
  every candidate (exact top-k, no beam needed).

Either is *tied* to an input row table (``table``) when the embedding's featurizer
indexes that table by the same function (Superbloom's ``eta_j = h_j``; T-Free's own
code), else it names its own hash functions and the head keeps a table of its own.

>>> from streamlearn.config import Config
>>> from streamlearn.featurize import build_featurizer
>>> cfg = Config().override("embedding.K=1000", "embedding.B=100", "learner.task=mlm", "model.output=auto",
...                         "model.counts=none")
>>> code = output_code(cfg, build_featurizer(cfg.embedding, cfg.hashing.seed))
>>> code.table, code.m, code.size, code.targets(["a", "b"])["hashes"].shape
('E', 2, 100, (2, 2))
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Callable, Sequence

import numpy as np

from .config import Config
from .decoding import (
    CandidateIndex, PatternIndex, TopK, beam_topk_many, candidate_topk_many, exhaustive_topk_many, tfree_topk,
)
from .exceptions import RecordError
from .featurize import Featurizer, PatternSpace
from .hashing import multi_hash
from .prequential import HashedPopularity, PatternPopularity, SampledPopularity

__all__ = ["HashedCode", "OutputCode", "PatternCode", "SampledCode", "output_code"]


class OutputCode:
    """What every output code offers (see the module docstring). ``table``: the input row
    table the head shares (None: the head owns its table); ``rows``: the head's rows."""

    table: str | None
    rows: int

    def targets(self, tokens: Sequence[str]) -> dict[str, np.ndarray]:
        """Training targets of the answer tokens, numpy (the head's loss reads them)."""
        raise NotImplementedError

    def new_index(self) -> CandidateIndex | PatternIndex:
        """An empty candidate index decoding this code."""
        raise NotImplementedError

    def step_targets(self, targets: dict[str, np.ndarray], index, rng: np.random.Generator
                     ) -> dict[str, np.ndarray]:
        """What the head's ``fit_loss`` reads for one training step: the batch's targets
        as they are, for a code whose loss covers every output row."""
        return targets

    def scoring_inputs(self, index) -> dict[str, np.ndarray]:
        """What the head's forward reads besides the states when answering: nothing, for
        a head that scores every row."""
        return {}

    def decode(self, scores: np.ndarray, index, k: int, beam: int,
               exclude: Sequence[np.ndarray] | None = None) -> list[TopK]:
        """The k best candidates per row of ``scores`` (the head's decodable scores),
        minus each row's ``exclude`` candidate ids."""
        raise NotImplementedError

    def score_of(self, scores: np.ndarray, token: str, index) -> np.ndarray:
        """The score (n,) each row of ``scores`` gives ``token``, as :meth:`decode` ranks
        it (a code that scores only the candidates of ``index``: RecordError for another
        token)."""
        raise NotImplementedError

    def popularity(self) -> HashedPopularity | PatternPopularity | SampledPopularity:
        """A counting baseline in this code: how often each output row was an answer."""
        raise NotImplementedError


@dataclass(frozen=True)
class _HashRows(OutputCode):
    """m hashes of each token into [0, size); ``ids(tokens) -> (n, m)``: the targets and
    the candidate index the hashed and the sampled heads share."""

    m: int
    size: int
    ids: Callable[[Sequence[str]], np.ndarray]

    @property
    def rows(self) -> int:
        return self.size

    def targets(self, tokens: Sequence[str]) -> dict[str, np.ndarray]:
        return {"hashes": self.ids(tokens)}  # (n, m)

    def new_index(self) -> CandidateIndex:
        return CandidateIndex(self.m, self.size, self.ids)


@dataclass(frozen=True)
class HashedCode(_HashRows):
    """Superbloom's m softmaxes over the hashed buckets (``table``: the tied input table)."""

    table: str | None = None

    def decode(self, scores, index, k, beam, exclude=None) -> list[TopK]:
        """``scores``: log-probabilities (n, m, size). With ``exclude`` given, exhaustive
        and exact (a beam could stop short of k once excluded candidates are dropped)."""
        if exclude is not None:
            return exhaustive_topk_many(scores, index, k, exclude)
        return beam_topk_many(scores, index, k, beam)

    def score_of(self, scores, token, index):
        """The sum of the token's m bucket log-probabilities, candidate or not."""
        buckets = self.ids([token])[0]  # (m,)
        return scores[:, np.arange(self.m), buckets].sum(-1)

    def popularity(self) -> HashedPopularity:
        return HashedPopularity(self.m, self.size)


@dataclass(frozen=True)
class PatternCode(OutputCode):
    """T-Free's trigram patterns over v rows."""

    space: PatternSpace
    table: str | None

    @property
    def rows(self) -> int:
        return self.space.v

    def targets(self, tokens: Sequence[str]) -> dict[str, np.ndarray]:
        ids, offsets = self.space.patterns(tokens)
        return {"ids": ids, "offsets": offsets}

    def new_index(self) -> PatternIndex:
        return PatternIndex(self.space.v, self.space.patterns)

    def decode(self, scores, index, k, beam, exclude=None) -> list[TopK]:
        """``scores``: logits (n, v). Excluded candidates are dropped after scoring, so
        each list asks for ``k`` plus its exclusions (every candidate is scored anyway)."""
        out = []
        for i, row in enumerate(scores):
            banned = np.zeros(0, np.int64) if exclude is None else exclude[i]
            top = tfree_topk(row, index, k + len(banned))
            if len(banned):
                keep = np.flatnonzero(~np.isin(index.ids(top.tokens), banned))[:k]
                top = TopK([top.tokens[j] for j in keep], top.scores[keep], top.exact, top.visited)
            out.append(top)
        return out

    def score_of(self, scores, token, index):
        """The sum of the logits of the token's distinct pattern rows (``tfree_topk``'s
        rule), candidate or not."""
        ids, _ = self.space.patterns([token])
        return scores[:, np.unique(ids)].sum(-1)

    def popularity(self) -> PatternPopularity:
        return PatternPopularity(self.space.v)


def unique_rows(rows: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(rows, axis=0, return_inverse=True)`` of rows (n, m) of ints in [0, size):
    the distinct rows in lexicographic order and each row's position among them (n,).
    Each row is read as one base-``size`` number and sorted as that (numpy's axis=0 path
    sorts a structured view: 290 against 30 us for 440 rows of 2, 3% of a next-token
    step); numpy's own path where the numbers would not fit in int64."""
    n, m = rows.shape
    if not n or size ** m >= 2 ** 63:
        distinct, inverse = np.unique(rows, axis=0, return_inverse=True)
        return distinct, inverse.reshape(-1)
    key = rows[:, 0].astype(np.int64)
    for j in range(1, m):
        key = key * size + rows[:, j]
    order = np.argsort(key, kind="stable")
    s = key[order]
    first = np.concatenate([[True], s[1:] != s[:-1]])
    inverse = np.empty(n, dtype=np.int64)
    inverse[order] = np.cumsum(first) - 1
    return rows[order[first]], inverse


@dataclass(frozen=True)
class SampledCode(_HashRows):
    """m hashes of each token into the ``size`` rows of the sampled head's own table."""

    negatives: int = 0  # candidates drawn per training step, besides the batch's own answers
    features: int = 0  # count-part score columns the head gates into its logits (model.counts)

    table = None  # never tied: the head owns its rows (a row table, updated sparsely)

    def draw(self, index: CandidateIndex, rng: np.random.Generator) -> np.ndarray:
        """The hashes (s, m) of up to ``negatives`` candidates drawn uniformly (with
        replacement) from the index: the step's negatives besides the batch's answers."""
        return index.hashes[self.draw_ids(index, rng)]

    def draw_ids(self, index: CandidateIndex, rng: np.random.Generator) -> np.ndarray:
        """The candidate ids (s,) :meth:`draw` takes. Uniform: a logQ correction would be
        the same constant for every candidate, so none is needed."""
        n = len(index)
        if not n or not self.negatives:
            return np.empty(0, dtype=np.int64)
        return rng.integers(0, n, size=self.negatives)

    def step_targets(self, targets, index, rng):
        """The step's ``choices`` (c, m), its distinct answers and drawn negatives, and
        each example's ``answer``: its position among them."""
        hashes = targets["hashes"]
        both = np.concatenate([hashes, self.draw(index, rng)])
        candidates, inverse = unique_rows(both, self.size)
        return {"choices": candidates, "answer": inverse[:len(hashes)]}

    def scoring_inputs(self, index):
        """Every candidate's hashes, in the index's order (answers score them all)."""
        return {"choices": index.hashes}

    def decode(self, scores, index, k, beam, exclude=None) -> list[TopK]:
        """``scores``: log-probabilities (n, candidates), every candidate scored: exact."""
        return candidate_topk_many(scores, index, k, exclude)

    def score_of(self, scores, token, index):
        """The candidate's log-probability: the softmax is over the candidates only."""
        pos = int(index.ids([token])[0])
        if pos < 0:
            raise RecordError(f"bad-value: output {token!r} is not a candidate: a sampled head scores only the "
                              f"{len(index)} tokens the stream has shown")
        return scores[:, pos]

    def popularity(self) -> SampledPopularity:
        return SampledPopularity()


def output_kind(cfg: Config) -> str:
    """"hashed", "sampled" or "tfree": ``model.output``, with "auto" picking T-Free's head
    for the tfree scheme and Superbloom's hashed head otherwise."""
    if cfg.model.output == "auto":
        return "tfree" if cfg.embedding.scheme == "tfree" else "hashed"
    return cfg.model.output


def output_code(cfg: Config, featurizer: Featurizer) -> OutputCode:
    """The output code of a token-output task: tied to the featurizer's space when
    ``model.tie_output`` and the scheme has one, else an own code."""
    tie = cfg.model.tie_output
    kind = output_kind(cfg)
    if kind == "sampled":
        m, size = cfg.model.out_m, cfg.model.out_B
        return SampledCode(m, size, partial(multi_hash, n=m, size=size, seed=cfg.hashing.seed, purpose="out"),
                           cfg.model.negatives, 0 if cfg.model.counts == "none" else 1 + (cfg.model.recent > 0))
    if kind == "tfree":
        space = featurizer.pattern_space() if tie else None
        if space is not None:
            return PatternCode(space, "E")
        return PatternCode(PatternSpace(cfg.embedding.m, cfg.embedding.tfree_rows, cfg.hashing.seed), None)
    hashed = featurizer.hashed_space() if tie else None
    if hashed is not None:
        return HashedCode(hashed.m, hashed.size, hashed.ids, table=hashed.table)
    m, size = cfg.model.out_m, cfg.model.out_B
    return HashedCode(m, size, partial(multi_hash, n=m, size=size, seed=cfg.hashing.seed, purpose="out"))
