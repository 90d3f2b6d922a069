"""Why the model answers what it does: per-token contributions to one chosen answer, and
each token's learned importance weights (Hash Embeddings' p_w).

What is explained (``Explanation.score``):

- classify: the chosen label's logit minus the mean logit over the labels seen (the
  softmax ignores a shift of every logit, so this is the part that decides; with two
  labels it is half the log-odds). It is the sum of the parts of
  :meth:`~streamlearn.tasks.classify.Classify.logit_parts`: the model's and the Naive Bayes
  part's (times ``learner.nb_weight``).
- token tasks (mlm, next-item, next-token): the chosen token's score as top-k ranks it
  (Superbloom: the sum of its m bucket log-probabilities; T-Free: its pattern's logits;
  a sampled head: its log-probability among the candidates, so it must be one).

How a token's contribution is measured, per part (``Explanation.methods``):

- ``exact`` where the part is linear in the tokens: the Naive Bayes part always, the
  model at depth 0 (``model.layers=0``: pooled per-token states feed a linear head).
  Each token's contribution is its own additive term, and the contributions plus
  ``rest`` (the head's bias, the Naive Bayes prior) equal ``score`` exactly.
- ``leave-one-out`` otherwise (transformer layers, and every token task, whose head is
  not linear): the score minus the score of the same query without that token. An
  approximation: it misses what tokens do only together (``rest`` holds the difference
  between the score and the contributions' sum), and a repeated token shows half its
  effect in each copy. One batched forward pass covers the query and all its variants.

``[MASK]`` (the slot an mlm query asks about) is never left out: its contribution is None
(to next-token it is a token like any other). A next-item query's key stays in every
variant: its key token and recency marks are not among ``tokens``, and their effect is
in ``rest``.
The tokens are the network's input: a text's words, then its n-grams (``hashing.ngrams``)
and digit shapes, each with its own contribution (the Naive Bayes part counts the words
only, so it gives the others none).

>>> from streamlearn.config import Config
>>> from streamlearn.learner import Learner
>>> learner = Learner(Config().override("embedding.K=1000", "embedding.B=100"))
>>> _ = learner.learn_many([{"text": "free prize now", "label": "spam"}, {"text": "see you at noon", "label": "ham"}])
>>> e = learner.explain_many([{"text": "free prize at noon"}])[0]
>>> e.tokens, e.methods
(['free', 'prize', 'at', 'noon', 'free prize', 'prize at', 'at noon'], {'model': 'exact', 'naive_bayes': 'exact'})
>>> abs(sum(e.contributions) + e.rest - e.score) < 1e-4
True
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np
import torch

from .batching import Batch, check_query, record_list
from .exceptions import RecordError

if TYPE_CHECKING:
    from .learner import Learner

__all__ = ["EXACT", "Explanation", "LEAVE_ONE_OUT", "Plan", "explainer"]

EXACT, LEAVE_ONE_OUT = "exact", "leave-one-out"


@dataclasses.dataclass(frozen=True)
class Explanation:
    """One query explained (see the module docstring).

    ``tokens``: the query's tokens as the model reads them. ``output``: the answer
    explained (the given one, else the best); ``score``: its score; ``contributions``:
    per token, summed over ``parts`` (part name -> per-token values), each part measured
    by ``methods[part]``; ``rest``: ``score`` minus the contributions' sum. ``top``:
    ``(answer, value)`` best first (classify: probabilities; tokens: log-probabilities).
    ``importance``: per token its k weights p_w over its ``rows`` of E (Hash Embeddings'
    P; None for a token the model does not read), None for schemes without them. None
    values: nothing to explain (no label or candidate yet) or a value that is not finite.
    """

    tokens: list[str]
    output: Any
    score: float | None
    contributions: list[float | None]
    parts: dict[str, list[float | None]]
    methods: dict[str, str]
    rest: float | None
    top: list[tuple[Any, float | None]]
    importance: list[list[float]] | None = None
    rows: list[list[int]] | None = None


@dataclasses.dataclass
class Plan:
    """A prepared explanation: the queries' token lists, the answer asked for each (None:
    the best), and one query batch holding each query, then its leave-one-out variants
    (``variants[i]``: (token position, batch row) of query i's). ``batch`` is what a
    reader must fetch rows for (``Learner.rows_read``)."""

    tokens: list[list[str]]
    outputs: list[Any]
    batch: Batch
    variants: list[list[tuple[int, int]]]


def explainer(learner: "Learner") -> "_Explainer":
    """The explainer of the learner's task: labels (classify) or tokens."""
    return (_LabelExplainer if learner.task.answers == "labels" else _TokenExplainer)(learner)


class _Explainer:
    """``plan`` (numpy: no model) then ``run`` (under the learner's inference mode)."""

    def __init__(self, learner: "Learner"):
        self.learner = learner
        self.task = learner.task

    def plan(self, records: Sequence, outputs: Sequence | None = None) -> Plan:
        prep = self.learner.prep
        records = record_list(records)
        for i, r in enumerate(records):
            check_query(r, i)  # a query without input has nothing to explain
        lists = [prep.query_tokens(r, i) for i, r in enumerate(records)]
        outputs = list(outputs) if outputs is not None else [None] * len(lists)
        if len(outputs) != len(lists):
            raise RecordError(f"bad-value: {len(outputs)} outputs for {len(lists)} queries")
        # The queries themselves as given: a text's n-grams and digit shapes reach the
        # network but not the Naive Bayes part, as in a prediction; the leave-one-out
        # variants are token lists (each input token, n-grams included, left out alone).
        # A variant keeps what of the query is not its tokens: a next-item query's key
        # (its key token; was: dropped, so each item's contribution held the key's whole
        # effect). Only a task's query slot (mlm's [MASK]) stays; to next-token it is a token.
        queries = list(records)
        variants: list[list[tuple[int, int]]] = [[] for _ in lists]
        slot = self.task.query_slot
        if self.leave_one_out():
            for i, tokens in enumerate(lists):
                kept = {"key": records[i]["key"]} if isinstance(records[i], Mapping) and "key" in records[i] else {}
                for pos, token in enumerate(tokens):
                    if token != slot:
                        variants[i].append((pos, len(queries)))
                        queries.append({"tokens": tokens[:pos] + tokens[pos + 1:], **kept})
        # a one-token query's variant leaves no token: the model's answer to nothing
        return Plan(lists, outputs, prep.query(queries, empty_tokens=True), variants)

    def leave_one_out(self) -> bool:
        """Whether some part is measured by leaving tokens out."""
        raise NotImplementedError

    def run(self, plan: Plan, k: int) -> list[Explanation]:
        raise NotImplementedError

    def importance(self, plan: Plan) -> tuple[list, list]:
        """Per query, per token: p_w (k) and its rows of E, read where the query's features
        hold that token (next-token's sit after [BOS], in a covering sequence); a token the
        model does not read gets None; Nones for schemes without p."""
        n = len(plan.tokens)
        places = [self.learner.prep.query_columns(plan.batch, i, len(t)) for i, t in enumerate(plan.tokens)]
        read = sorted({r for r, _ in places})  # the queries' own rows, not their leave-one-out variants
        at = {r: j for j, r in enumerate(read)}
        feats = self.learner.dev.tensors({key: a[read] for key, a in plan.batch.feats.items()})
        found = self.learner.model.embedding.importance(feats)
        if found is None:
            return [None] * n, [None] * n
        weights, rows = found[0].float().cpu().numpy(), found[1].cpu().numpy()  # (len(read), T, k) each
        return ([[None if c is None else [_num(v) for v in weights[at[r], c]] for c in cols] for r, cols in places],
                [[None if c is None else rows[at[r], c].tolist() for c in cols] for r, cols in places])


class _LabelExplainer(_Explainer):
    """classify: the centered logit of a label, per part of the logits."""

    def leave_one_out(self) -> bool:
        return self.learner.model.depth > 0

    def run(self, plan: Plan, k: int) -> list[Explanation]:
        model, batch, dev = self.learner.model, plan.batch, self.learner.dev
        labels = self.task.label_table.labels[:batch.n_labels]
        weights, rows = self.importance(plan)
        if not labels:
            return [_nothing(t, w, r) for t, w, r in zip(plan.tokens, weights, rows)]
        raw = self.task.logit_parts(model, batch, dev)  # (N', L) each
        probs = torch.stack(list(raw.values())).sum(0).float().cpu().softmax(-1)  # (N', L)
        parts = {name: _centered(x) for name, x in raw.items()}
        terms = {name: _centered(x) for name, x in self.task.token_terms(model, batch, dev).items()}  # (N', T, L)
        out = []
        for i, tokens in enumerate(plan.tokens):
            c = _label_id(labels, plan.outputs[i], int(probs[i].argmax()), i)
            per_part = {name: (terms[name][i, :len(tokens), c].tolist() if name in terms
                               else _left_out(parts[name][:, c], i, len(tokens), plan.variants[i]))
                        for name in parts}
            methods = {name: EXACT if name in terms else LEAVE_ONE_OUT for name in parts}
            score = float(sum(parts[name][i, c] for name in parts))
            top = probs[i].topk(min(k, len(labels)))
            ranked = [(labels[j], float(p)) for p, j in zip(top.values.tolist(), top.indices.tolist())]
            out.append(_explanation(tokens, labels[c], score, per_part, methods, ranked, weights[i], rows[i]))
        return out


class _TokenExplainer(_Explainer):
    """Token tasks: the chosen token's decode score, leave-one-out."""

    def leave_one_out(self) -> bool:
        return True

    def run(self, plan: Plan, k: int) -> list[Explanation]:
        task, n = self.task, len(plan.tokens)
        scores = task.decodable(self.learner.model, plan.batch, self.learner.dev)  # (N', ...)
        tops = task.code.decode(scores[:n], task.index, k, self.learner.cfg.learner.beam)
        weights, rows = self.importance(plan)
        out = []
        for i, tokens in enumerate(plan.tokens):
            output = plan.outputs[i] if plan.outputs[i] is not None else (tops[i].tokens or [None])[0]
            ranked = [(t, float(s)) for t, s in zip(tops[i].tokens, tops[i].scores)]
            if output is None:
                out.append(_nothing(tokens, weights[i], rows[i], ranked))
                continue
            of = task.code.score_of(scores, str(output), task.index)  # (N',)
            per_part = {"model": _left_out(torch.from_numpy(np.asarray(of)), i, len(tokens), plan.variants[i])}
            out.append(_explanation(tokens, str(output), float(of[i]), per_part, {"model": LEAVE_ONE_OUT}, ranked,
                                    weights[i], rows[i]))
        return out


# ---------------------------------------------------------------------------- helpers

def _centered(x: torch.Tensor) -> torch.Tensor:
    """Logits (..., L) minus their mean over the labels, as float64 on the CPU."""
    x = x.double().cpu()
    return x - x.mean(-1, keepdim=True)


def _label_id(labels: list, wanted: Any, best: int, query: int) -> int:
    """The id of label ``wanted`` (its value, else its string form: JSON keys are strings);
    ``best`` when None. RecordError for a label never seen, naming the ``query`` of the batch."""
    if wanted is None:
        return best
    for match in (lambda a: a == wanted and type(a) is type(wanted), lambda a: str(a) == str(wanted)):
        ids = [j for j, label in enumerate(labels) if match(label)]
        if ids:
            return ids[0]
    raise RecordError(f"bad-value: query {query}: output {wanted!r} is not a label this model has seen "
                      f"({len(labels)} labels)")


def _left_out(score: torch.Tensor, i: int, length: int, variants: list[tuple[int, int]]) -> list[float | None]:
    """Per token of query ``i``: its score minus its variant's without the token."""
    out: list[float | None] = [None] * length
    for pos, row in variants:
        out[pos] = float(score[i] - score[row])
    return out


def _explanation(tokens, output, score, parts, methods, top, weights, rows) -> Explanation:
    totals = [None if any(p[t] is None for p in parts.values()) else sum(p[t] for p in parts.values())
              for t in range(len(tokens))]
    rest = score - sum(v for v in totals if v is not None)
    return Explanation(list(tokens), output, _num(score), [_num(v) for v in totals],
                       {name: [_num(v) for v in values] for name, values in parts.items()}, methods, _num(rest),
                       [(a, _num(v)) for a, v in top], weights, rows)


def _nothing(tokens, weights, rows, top=()) -> Explanation:
    """Nothing to explain yet: no label seen, or no candidate and no output asked for."""
    return Explanation(list(tokens), None, None, [None] * len(tokens), {}, {}, None, list(top), weights, rows)


def _num(v: float | None) -> float | None:
    return None if v is None or not np.isfinite(v) else float(v)
