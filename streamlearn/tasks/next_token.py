"""``next-token``: causal language modelling over the stream's tokens (T-Free's decoder
objective): each token of a record given the tokens before it in that record.

A record of tokens ``t_0 .. t_{n-1}`` is read as the inputs ``[BOS], t_0 .. t_{n-2}`` and
the answers ``t_0 .. t_{n-1}``: position j sees inputs 0..j only (causal attention) and
predicts ``t_j``; the first token is predicted from ``[BOS]`` alone. One record teaches
n examples in one forward pass. A query asks "what comes next" after a prefix (its
``tokens`` or ``text``; an empty prefix asks for a first token).

In a replay every position of a record is an event (recall at every position): the
model answers the prefix before each token (a prequential replay reads the answers off the
training batch before its step: each position's causal state is its prefix's), the Markov
baseline the token before it, the n-gram baseline the two before it. Those answers' count
scores see the batch's earlier records (:meth:`NextToken.prediction_counts`), as the
baselines, learning record by record, see them.
"""
from __future__ import annotations

import numpy as np
import torch

from ..batching import QUERY_MASK_ANY_CASE, Batch
from ..counts.part import ngrams
from ..exceptions import RecordError
from ..featurize import add_ngram_inputs
from ..hashing import hash64
from ..model import HashedTransformer
from ..objectives import BOS_TOKEN
from ..records import Record
from .base import Event, TokenPreparer, TokenTask

__all__ = ["NextToken", "NextTokenPreparer"]


# a next-token query whose text holds a [MASK] (the tokenizer would read "[", "mask", "]")
# was almost surely meant for an mlm model: say so rather than answer another question.
# Explicit tokens are taken as they are (a replay's events are prefixes of records' tokens)
_MASK_ASKED = ("bad-value: [MASK] marks a position for an mlm model to fill; this model's task is next-token, "
               "which answers what comes after the text: ask with the text before the position")


class NextTokenPreparer(TokenPreparer):
    """Records need tokens; a training batch holds every position's answer."""

    task = "next-token"

    def validate(self, rec: Record) -> list[str]:
        return self.text_tokens(rec)

    def featurize(self, token_lists, grow: bool = True) -> dict[str, np.ndarray]:
        """The inputs' arrays, with each position's word n-grams' (``model.input_ngrams``;
        :func:`~streamlearn.featurize.add_ngram_inputs`). A position's n-gram ends at its own
        input, so it holds no token the position is asked for."""
        feats = super().featurize(token_lists, grow)
        orders = self.cfg.model.input_ngrams
        return add_ngram_inputs(self.featurizer, feats, token_lists, self.cfg.hashing.max_tokens, orders, grow)

    def fill_train(self, batch: Batch, accepted: list, rng: np.random.Generator) -> None:
        if not accepted:
            return
        lists = [self.cut(t) for _, t in accepted]  # each n <= max_tokens answers
        batch.feats = self.featurize([[BOS_TOKEN, *t[:-1]] for t in lists])
        lengths = np.array([len(t) for t in lists], dtype=np.int64)
        batch.rows = np.repeat(np.arange(len(lists), dtype=np.int64), lengths)  # (n,)
        batch.cols = np.concatenate([np.arange(n, dtype=np.int64) for n in lengths])  # (n,)
        answers = [token for t in lists for token in t]
        batch.targets = self.code.targets(answers)
        weights = np.array([r.weight for r, _ in accepted], dtype=np.float32)
        batch.weight = weights[batch.rows]
        batch.candidates = answers
        if self.count_seed is not None:
            grams = ngrams(lists, self.count_seed, self.count_order)  # (n, order): position i's context and answer
            batch.counts = {"grams": grams, "ctx": grams[:, :-1], "answer": grams[:, -1]}

    def fill_query(self, batch: Batch, records: list) -> None:
        """Each query is read out at its last input. A query that is a prefix of another
        query of the batch is read out of that one's sequence (causal states at a position
        depend on the positions before it only), so a replay's events, the prefixes of one
        record, cost one sequence, not one each."""
        keep = self.cfg.hashing.max_tokens - 1  # the prefix's last tokens, after [BOS]
        lists = [[BOS_TOKEN, *self.query_tokens(obj, i)[-keep:]] for i, obj in enumerate(records)]
        sequences, rows = _covering(lists)
        batch.feats = self.featurize(sequences, grow=False)
        batch.rows = rows
        batch.cols = np.array([len(t) - 1 for t in lists], dtype=np.int64)  # what follows the last input
        if self.count_seed is not None:
            width = self.count_order - 1  # the tokens before the answer, BOS-padded (t starts with one)
            last = [[*[BOS_TOKEN] * (width - 1), *t][-width:] for t in lists]
            batch.counts = {"ctx": hash64([x for ctx in last for x in ctx], self.count_seed).reshape(-1, width)}

    def query_text(self, text: str) -> list[str]:
        if QUERY_MASK_ANY_CASE.search(text):
            raise RecordError(_MASK_ASKED)
        return super().query_text(text)

    def query_cut(self, tokens: list[str]) -> list[str]:
        """What comes next follows from the prefix's end: its last tokens are kept, as many
        as the input holds after [BOS] (:meth:`fill_query`; was one more, which an
        explanation listed as a token the model did not read)."""
        return tokens[-(self.cfg.hashing.max_tokens - 1):]

    def query_columns(self, batch: Batch, i: int, n: int) -> tuple[int, list[int | None]]:
        """The sequence holding query ``i`` (a longer query's, when it is a prefix of one)
        and its tokens' columns after [BOS]; a prefix longer than the input keeps its
        last tokens (:meth:`fill_query`)."""
        read = min(n, self.cfg.hashing.max_tokens - 1)
        return int(batch.rows[i]), [None] * (n - read) + list(range(1, read + 1))


def _covering(lists: list[list[str]]) -> tuple[list[list[str]], np.ndarray]:
    """The fewest sequences that hold every list as a prefix (longest first), and the
    sequence of each list."""
    order = sorted(range(len(lists)), key=lambda i: -len(lists[i]))
    sequences: list[list[str]] = []
    rows = np.empty(len(lists), dtype=np.int64)
    by_prefix: dict[tuple[str, ...], int] = {}  # every prefix of a chosen sequence -> its row
    for i in order:
        key = tuple(lists[i])
        row = by_prefix.get(key)
        if row is None:
            row = len(sequences)
            sequences.append(lists[i])
            for n in range(1, len(key) + 1):
                by_prefix.setdefault(key[:n], row)
        rows[i] = row
    return sequences, rows


class NextToken(TokenTask):
    """The next-token task (see the module docstring)."""

    name = "next-token"
    replicable = True  # the candidate index and the count part replay at each sync (streamlearn.sync)
    # one event per position, each a training example: a replay predicts a record from its
    # training batch, those predictions' count scores seeing the batch's earlier records
    events_are_examples = True
    target_field = None
    Preparer = NextTokenPreparer

    def score_counts(self, ctx: np.ndarray, cands: np.ndarray, n: int) -> np.ndarray:
        """log P_KN(w | context) of the tokens before each answer (two, three with ``kn4``) (N, 1, C)."""
        return self.counter.next_token(ctx, cands, n)

    def prediction_counts(self, batch: Batch, cands: np.ndarray, n: int) -> np.ndarray:
        """A training batch predicted before its step (a prequential replay's, the worker's
        live check) gives each record the count scores of the batch's earlier records too,
        as a baseline learning record by record has them
        (:meth:`CountPart.next_token_in_order <streamlearn.counts.part.CountPart.next_token_in_order>`);
        a query batch reads the tables. The step's loss reads the tables as they are
        (``model.count_fit=joint``: in order there, it gained 0.0004 of recall@10 on War and
        Peace's first 3,000 records and cost about 16% of learn_many's CPU time)."""
        if not batch.train or not self.counter.stages:
            return super().prediction_counts(batch, cands, n)
        return self.counter.next_token_in_order(batch.counts["ctx"], cands, n, batch.counts["grams"], batch.rows)

    def readout(self, model: HashedTransformer, batch: Batch, feats: dict[str, torch.Tensor], dev) -> torch.Tensor:
        """The causal state (n, d) at each answered position."""
        h = model.encode(feats, causal=True)  # (N, T, d)
        return h[dev.tensor(batch.rows), dev.tensor(batch.cols)]  # (n, d)

    def events(self, seed: int, bags: bool = True):
        """One event per position (module docstring)."""
        max_tokens = self.cfg.hashing.max_tokens

        def build(position: int, rec: Record) -> list[Event]:
            tokens = self.prep.text_tokens(rec)[:max_tokens]
            padded = [BOS_TOKEN, BOS_TOKEN, *tokens]  # tokens[i] is padded[i + 2]
            return [Event(position, rec, t, True, {"tokens": tokens[:i]}, tokens=tuple(tokens),
                          prev=tokens[i - 1] if i else None, left=tuple(padded[i:i + 2]), counts=(t,),
                          transitions=((tokens[i - 1], t),) if i else (), ngrams=((padded[i], padded[i + 1], t),))
                    for i, t in enumerate(tokens)]
        return build
