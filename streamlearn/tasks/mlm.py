"""``mlm``: Superbloom's masked-token objective over hashed outputs.

Training corrupts each record BERT's way (:func:`~streamlearn.objectives.mlm_mask`:
15% of the tokens chosen; a chosen token's input becomes [MASK] 80% of the time, a
random token of the batch 10%, unchanged 10%) and predicts the original at every
chosen position. A query fills the first ``[MASK]`` of its text or tokens (one is
appended when there is none: "complete this set").

The head reads the final state at the masked position. At depth 0 nothing carries the
context to a [MASK] slot, whose state is the [MASK] vector alone (every answer would be
the same): there each position reads its record's pooled tokens outside the slots, as
word2vec's CBOW does.
"""
from __future__ import annotations

import numpy as np
import torch
import xxhash

from ..batching import QUERY_MASK, QUERY_MASK_ANY_CASE, Batch
from ..counts.part import contexts, trigrams
from ..hashing import derive_seed, hash64
from ..heads import SampledHead
from ..model import HashedTransformer
from ..objectives import BOS_TOKEN, EOS_TOKEN, MASK_TOKEN, mlm_mask
from ..optim import plain_adagrad
from ..records import Record
from .base import ClosedForm, Event, TokenPreparer, TokenTask

__all__ = ["MaskedToken", "MaskedTokenPreparer"]



class MaskedTokenPreparer(TokenPreparer):
    """Records need tokens; training batches carry the masked inputs, the positions read
    out and the output code's targets of the original tokens."""

    task = "mlm"

    def validate(self, rec: Record) -> list[str]:
        return self.text_tokens(rec)

    def fill_train(self, batch: Batch, accepted: list, rng: np.random.Generator) -> None:
        if not accepted:
            return
        lists = [self.cut(t) for _, t in accepted]
        masked = mlm_mask(lists, rng, p=self.cfg.learner.mask_prob)
        batch.feats = self.featurize(masked.token_lists)
        batch.slots = np.zeros(batch.feats["mask"].shape, dtype=bool)
        batch.slots[masked.rows[masked.slots], masked.cols[masked.slots]] = True
        batch.rows, batch.cols = masked.rows, masked.cols
        batch.targets = self.code.targets(masked.targets)
        weights = np.array([r.weight for r, _ in accepted], dtype=np.float32)
        batch.weight = weights[masked.rows]
        batch.candidates = [t for ts in lists for t in ts]
        if self.count_seed is not None:
            batch.counts = {"grams": trigrams(lists, self.count_seed),
                            "ctx": contexts(lists, masked.rows, masked.cols, self.count_seed),
                            "answer": hash64(masked.targets, self.count_seed)}

    def fill_query(self, batch: Batch, records: list) -> None:
        lists = [self.query_tokens(obj, i) for i, obj in enumerate(records)]
        lists, batch.rows, batch.cols = _mask_queries(lists, self.cfg.hashing.max_tokens)
        batch.feats = self.featurize(lists, grow=False)
        batch.slots = np.zeros(batch.feats["mask"].shape, dtype=bool)
        for r, ts in enumerate(lists):
            batch.slots[r, [c for c, t in enumerate(ts) if t == MASK_TOKEN]] = True
        if self.count_seed is not None:
            batch.counts = {"ctx": contexts(lists, batch.rows, batch.cols, self.count_seed)}

    def query_cut(self, tokens: list[str]) -> list[str]:
        """A window of ``hashing.max_tokens`` around the first [MASK] (the position asked
        about), or, without one, the last tokens before the [MASK] appended at the end."""
        m = self.cfg.hashing.max_tokens
        if QUERY_MASK not in tokens:  # room for the appended mask (was: m tokens kept, the last dropped for it)
            return tokens if len(tokens) < m else tokens[-(m - 1):]
        if len(tokens) <= m:
            return tokens
        start = min(max(0, tokens.index(QUERY_MASK) - m // 2), len(tokens) - m)
        return tokens[start:start + m]

    def query_list(self, tokens: list[str]) -> list[str]:
        """Explicit tokens with ``[MASK]`` in any case read as the position to fill, as in text."""
        return [QUERY_MASK if len(t) == len(QUERY_MASK) and t.upper() == QUERY_MASK else t for t in tokens]

    def query_text(self, text: str) -> list[str]:
        """Text tokenized around each literal ``[MASK]`` (any case: the tokenizer lowers the
        rest), which stays one token."""
        text = QUERY_MASK_ANY_CASE.sub(QUERY_MASK, text)
        if QUERY_MASK not in text:
            return self.tokens(Record(text=text))
        parts = [self.tokens(Record(text=p)) for p in text.split(QUERY_MASK)]
        out = parts[0]
        for p in parts[1:]:
            out = out + [QUERY_MASK] + p
        return out


class MaskedToken(TokenTask):
    """The mlm task (see the module docstring)."""

    name = "mlm"
    query_slot = QUERY_MASK
    replicable = True  # the candidate index and the count part replay at each sync (streamlearn.sync)
    target_field = None
    Preparer = MaskedTokenPreparer

    def score_counts(self, ctx: np.ndarray, cands: np.ndarray, n: int) -> np.ndarray:
        """The KN chain (N, 1, C): log P(w | l2 l1) + log P(r1 | l1 w) + log P(r2 | w r1)."""
        return self.counter.chain(ctx, cands, n)

    def answer_and_negative_counts(self, ctx: np.ndarray, answers: np.ndarray, negatives: np.ndarray,
                                   n: int) -> tuple[np.ndarray, np.ndarray]:
        """One (N, 1 + k) grid: mlm's slots have distinct contexts (nothing to read once
        for several), and a chain costs about 17 table reads whatever its size (measured
        1.25 ms a step against 1.6 ms in two calls)."""
        grid = np.concatenate([answers[:, None], np.broadcast_to(negatives, (len(answers), len(negatives)))], 1)
        scores = self.score_counts(ctx, grid, n)  # (N, F, 1 + k)
        return scores[:, :, 0], scores[:, :, 1:]

    def has_closed_form(self, model: HashedTransformer, dev) -> bool:
        """At depth 0 on the CPU, with the network learning its own softmax over rows of
        its own (a sampled head, ``separate``) and Adagrad rows: :meth:`gradients`.

        Autograd hands the rows that only masked slots read (the [MASK] token's: a
        random or kept token stays in the pool like any other) a zero gradient; the
        closed form leaves them out.
        Adagrad changes nothing for a zero gradient, so the two steps are equal; lazy
        Adam would still move such a row by its momentum, and a decayed Adagrad sum
        (``optim.row_decay`` < 1) would still decay, so those keep autograd."""
        return (not dev.cuda and model.pools_in_closed_form and not self.joint and self.code.table is None
                and isinstance(model.head, SampledHead) and plain_adagrad(self.cfg.optim))

    def gradients(self, model: HashedTransformer, batch: Batch, dev, outputs: bool = True) -> ClosedForm | None:
        """:meth:`loss`'s step at depth 0 without autograd: the context pooled as a bag
        (:meth:`HashedTransformer.pooled`: the hashed rows, the importance weights and
        the positions), the head's transform and sampled softmax over the n masked
        slots (:meth:`SampledHead.gradients <streamlearn.heads.SampledHead.gradients>`),
        and dL/dx summed per record and passed back through the bag. Equal to
        autograd's gradients through the whole model to float rounding
        (tests/test_learner.py).

        Profile (py-spy, War and Peace, batch 8): the (N, T, d) token states, their
        masked pool and autograd's backward into the hashed rows were about a third of
        a depth-0 mlm step."""
        if not self.has_closed_form(model, dev):
            return None
        scored = self.outputs(model, batch, dev) if outputs else None
        pooled = model.pooled(dict(batch.feats, mask=batch.feats["mask"] & ~batch.slots))
        rows = torch.from_numpy(batch.rows)
        loss, grad_x, dense, out_rows = model.head.gradients(pooled.x.index_select(0, rows),
                                                             dev.tensors(self.step_targets(batch)),
                                                             dev.tensor(batch.weight))
        per_record = torch.zeros_like(pooled.x).index_add_(0, rows, grad_x)  # (N, d)
        return ClosedForm(float(loss), scored, {**pooled.row_gradients(per_record), **out_rows},
                          (*dense, *pooled.dense_gradients(per_record)), {**pooled.tables(), **model.head.row_tables()})

    def readout(self, model: HashedTransformer, batch: Batch, feats: dict[str, torch.Tensor], dev) -> torch.Tensor:
        """The states (n, d) at the positions (rows[i], cols[i]); at depth 0 the pooled
        context outside the [MASK] slots (module docstring)."""
        slots = dev.tensor(batch.slots)
        h = model.encode(feats, slots)  # (N, T, d)
        rows = dev.tensor(batch.rows)
        if model.depth == 0:
            return model.pool(h, feats["mask"] & ~slots)[rows]  # (n, d)
        return h[rows, dev.tensor(batch.cols)]  # (n, d)

    def events(self, seed: int, bags: bool = True):
        """One token per record, chosen by a seeded hash of the record's position, is
        replaced by ``[MASK]``; the answer is that token, the Markov input the token
        before it, the n-gram context the tokens on both sides."""
        mask_seed = derive_seed(seed, "replay/mlm-mask")
        max_tokens = self.cfg.hashing.max_tokens

        def build(position: int, rec: Record) -> list[Event]:
            tokens = self.prep.text_tokens(rec)[:max_tokens]
            pos = xxhash.xxh64_intdigest(position.to_bytes(8, "big"), mask_seed) % len(tokens)
            query = tokens[:pos] + [QUERY_MASK] + tokens[pos + 1:]
            padded = [BOS_TOKEN, BOS_TOKEN, *tokens, EOS_TOKEN]  # tokens[i] is padded[i + 2]
            return [Event(position, rec, tokens[pos], True, {"tokens": query}, tokens=tuple(tokens),
                          prev=tokens[pos - 1] if pos else None, left=tuple(padded[pos:pos + 2]),
                          right=padded[pos + 3], counts=tuple(tokens), transitions=tuple(zip(tokens, tokens[1:])),
                          ngrams=tuple(zip(padded[1:], padded[2:], padded[3:])))]
        return build


def _mask_queries(lists: list[list[str]], max_len: int) -> tuple[list[list[str]], np.ndarray, np.ndarray]:
    """Each query's [MASK]s become the model's mask slot; a query without one gets one
    appended. Returns the lists and the (row, col) read out: each query's first mask."""
    out, cols = [], []
    for tokens in lists:
        if QUERY_MASK not in tokens:  # the end is the context of the appended mask
            tokens = tokens[-(max_len - 1):] + [QUERY_MASK]
        tokens = [MASK_TOKEN if t == QUERY_MASK else t for t in tokens]
        out.append(tokens)
        cols.append(tokens.index(MASK_TOKEN))
    return out, np.arange(len(out), dtype=np.int64), np.array(cols, dtype=np.int64)
