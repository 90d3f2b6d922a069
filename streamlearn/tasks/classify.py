"""``classify``: tokens -> a label, over a label table that grows as labels appear.

The pooled final states (:meth:`HashedTransformer.pool`) feed a
:class:`~streamlearn.heads.LabelHead` whose first ``n_labels`` rows take part in the
softmax. With ``learner.nb_weight > 0`` a Naive Bayes part
(:class:`~streamlearn.heads.NaiveBayesHead`) adds its score, times ``nb_weight``, to the
label logits of every prediction. The two are experts of their own:

- the network's loss sees its own logits only. Trained on the sum, it learned to fight
  the part's overconfidence instead of the label (about -1 point on short sentiment
  sentences, docs/choosing-a-configuration.md);
- the part counts the words of a text only: its word n-grams and digit shapes go to the
  network alone (a sum of log-count ratios over a bigram and its two words counts the
  same evidence twice);
- a training batch's record is scored from the counts of every record before it, those
  earlier in its own batch included (:meth:`NaiveBayesHead.scores_in_order`), then the
  batch is counted after its step: a batch's lag cost about a point on a 1,000-record
  stream. Counting stays in the training thread, in the label ids the step uses (a
  replica of a group maps its batch to the group's ids first).

>>> from streamlearn.config import Config
>>> from streamlearn.featurize import build_featurizer
>>> cfg = Config().override("embedding.K=1000", "embedding.B=100")
>>> task = Classify(cfg, build_featurizer(cfg.embedding, cfg.hashing.seed))
>>> batch = task.prep.train([{"text": "free prize", "label": "spam"}, {"text": "hi", "label": "ham"}])
>>> batch.targets["labels"].tolist(), task.prep.label_table.labels
([0, 1], ['spam', 'ham'])
"""
from __future__ import annotations

import bisect
import functools
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.nn.functional as F

from ..batching import Batch, Preparer, fields_of, seed_of
from ..compiled_loading import WhenLoaded
from ..config import Config
from ..decoding import TopK
from ..device import Device
from ..exceptions import RecordError
from ..featurize import Featurizer, HashFeaturizer, flatten_batch
from ..hashing import HashedText, is_word_token, multi_hash
from ..heads import LabelHead, NaiveBayesHead
from ..model import HashedTransformer
from ..objectives import LabelTable
from ..prequential import LabelCheck
from ..records import Record
from .base import ClosedForm, Event, Task

if TYPE_CHECKING:
    from ..compiled import CompiledNaiveBayes
    from ..compiled_text import TextHasher

__all__ = ["Classify", "ClassifyPreparer", "MODEL_PART", "NB_COUNTS", "NB_PART"]

NB_COUNTS = "nb.counts"  # the Naive Bayes part's count table (a row table: stored like embedding rows)
MODEL_PART, NB_PART = "model", "naive_bayes"  # the parts of the label logits (Classify.logit_parts)


class ClassifyPreparer(Preparer):
    """Records need tokens and a label; a new label joins the label table when its
    record is prepared. With the Naive Bayes part on, batches carry its token ids."""

    task = "classify"

    def __init__(self, cfg: Config, featurizer: Featurizer):
        super().__init__(cfg, featurizer)
        self.label_table = LabelTable(cfg.model.max_labels)
        lc = cfg.learner
        self.nb_span = NaiveBayesHead.span_of(lc.nb_cells, cfg.model.max_labels) if lc.nb_weight > 0 else 0
        # a training text's tokens straight to their hashes in one compiled call, where
        # nothing of the batch reads them as strings (streamlearn.compiled_text)
        self.text_hasher: WhenLoaded[TextHasher] | None = None
        if (lc.compiled and cfg.hashing.tokenizer == "words" and type(featurizer) is HashFeaturizer
                and lc.shuffle_random == 0 and (not self.nb_span or 2 * cfg.embedding.K >= self.nb_span)):
            self.text_hasher = WhenLoaded(functools.partial(self._new_text_hasher, featurizer))

    def _new_text_hasher(self, featurizer: HashFeaturizer) -> TextHasher:
        from ..compiled_text import TextHasher  # imports numba: only where it runs

        h = self.cfg.hashing
        return TextHasher(featurizer.hasher, h.ngrams, h.lowercase, h.shapes)

    def train(self, records: Iterable) -> Batch:
        start = len(self.label_table)
        batch = super().train(records)
        batch.label_start = start
        return batch

    def validate(self, rec: Record) -> list[str] | HashedText:
        hasher = self.text_hasher() if self.text_hasher is not None else None
        tokens = self._hashed(hasher, rec) if hasher is not None else None
        if tokens is None:
            tokens = self.text_tokens(rec)
        if rec.label is None:
            raise RecordError("missing-field: label (task classify)")
        self.label_table.add(rec.label)
        return tokens

    @staticmethod
    def _hashed(hasher: TextHasher, rec: Record) -> HashedText | None:
        """The text's tokens hashed by the compiled tokenizer; None where it does not
        take the record (tokens given, no text, a text it leaves to Python)."""
        if rec.tokens is not None or not isinstance(rec.text, str):
            return None
        hashed = hasher(rec.text)
        if hashed is not None and not len(hashed):
            raise RecordError("bad-value: the text has no tokens after tokenization")
        return hashed

    def fill_train(self, batch: Batch, accepted: list, rng: np.random.Generator) -> None:
        if not accepted:
            return
        hasher = self.text_hasher() if self.text_hasher is not None else None
        self._features(batch, [t for _, t in accepted], [r.tokens is None for r, _ in accepted], hasher, grow=True)
        batch.targets["labels"] = np.array([self.label_table.get(r.label) for r, _ in accepted], dtype=np.int64)
        batch.weight = np.array([r.weight for r, _ in accepted], dtype=np.float32)
        batch.n_labels = len(self.label_table)

    def fill_query(self, batch: Batch, records: list) -> None:
        batch.n_labels = len(self.label_table)
        from_text = [fields_of(obj).get("tokens") is None for obj in records]
        hasher = self.text_hasher() if self.text_hasher is not None and records else None
        lists = [self._query_hashed(hasher, obj, i) if hasher is not None else self.query_tokens(obj, i)
                 for i, obj in enumerate(records)]
        self._features(batch, lists, from_text, hasher, grow=False)

    def _features(self, batch: Batch, lists: list, from_text: Sequence[bool], hasher: TextHasher | None,
                  grow: bool) -> None:
        """The batch's features and Naive Bayes ids: one compiled call where the text hasher
        runs (training and queries alike), else the featurizer and :meth:`nb_tokens`."""
        if hasher is not None:
            batch.feats, nb = hasher.batch(lists, self._word_counts(lists, from_text), self.cfg.hashing.max_tokens,
                                           self.nb_span)
            batch.nb_tokens = nb if self.nb_span else None
        else:
            batch.feats = self.featurize(lists, grow=grow)
            batch.nb_tokens = self.nb_tokens(lists, batch.feats, from_text)

    def _query_hashed(self, hasher: TextHasher, obj: Any, i: int) -> list[str] | HashedText:
        """Query ``i``'s text hashed by the compiled tokenizer, else its tokens
        (:meth:`query_tokens`: given ones, a text it leaves to Python, an empty one)."""
        fields = fields_of(obj)
        text = fields.get("text") if fields.get("tokens") is None else None
        hashed = hasher(text) if isinstance(text, str) else None
        return hashed if hashed is not None and len(hashed) else self.query_tokens(obj, i)

    def nb_tokens(self, token_lists: Sequence[Sequence[str]], feats: dict[str, np.ndarray],
                  from_text: Sequence[bool]) -> np.ndarray | None:
        """The Naive Bayes part's token ids (N, T) in [0, nb_span), -1 at padding and at
        the n-grams and digit shapes of a text (``from_text[i]``: list i came from text;
        a list given as ``tokens`` counts whole), cut like the model's input; None when
        the part is off. Hash embeddings' D1
        (``feats["d1"]``, already one uniform hash per token) is reused when its range K
        is at least half the part's span (so at most twice its own collisions): hashing
        every token again cost the fetch thread 0.04 CPU-s per 1,000 SMS records, more
        than the rest of its work."""
        if not self.nb_span:
            return None
        mask = feats["mask"]
        if "d1" in feats and 2 * self.cfg.embedding.K >= self.nb_span:
            out = np.where(mask, feats["d1"] % self.nb_span, -1)
        else:
            flat, mask = flatten_batch(token_lists, self.cfg.hashing.max_tokens)
            out = np.full(mask.shape, -1, dtype=np.int64)
            if len(flat):
                out[mask] = multi_hash(flat, 1, self.nb_span, self.cfg.hashing.seed, "naive-bayes")[:, 0]
        h = self.cfg.hashing
        if h.tokenizer == "words" and (h.ngrams > 1 or h.shapes):
            out[~self._words(token_lists, from_text, out.shape[1])] = -1
        return out

    def _word_counts(self, lists: list, from_text: Sequence[bool]) -> np.ndarray:
        """(N,) how many of each record's tokens the Naive Bayes part counts, from its
        first: a hashed text's words, a tokenized text's words
        (:func:`text_words`), every token of a list given as ``tokens``."""
        h = self.cfg.hashing
        texts = h.tokenizer == "words" and (h.ngrams > 1 or h.shapes)
        return np.fromiter((tokens.words if type(tokens) is HashedText
                            else text_words(tokens) if texts and text else len(tokens)
                            for tokens, text in zip(lists, from_text)), dtype=np.int64, count=len(lists))

    @staticmethod
    def _words(token_lists: Sequence[Sequence[str]], from_text: Sequence[bool], T: int) -> np.ndarray:
        """(N, T) True where the Naive Bayes part counts the token: a word of a text, or
        any token of a list given as ``tokens``. A text's tokens are its words, then its
        n-grams and digit shapes (:func:`~streamlearn.hashing.tokenize`), so its words
        are the prefix that :func:`is_word_token` holds for, found by bisection: testing
        every token was a third of a training batch's preparation (py-spy, AG News)."""
        ends = np.fromiter((text_words(tokens, T) if text else min(T, len(tokens))
                            for tokens, text in zip(token_lists, from_text)), dtype=np.int64, count=len(token_lists))
        return np.arange(T) < ends[:, None]


def text_words(tokens: Sequence[str], T: int | None = None) -> int:
    """How many of a text's tokens (of its first ``T``) are words: they come first, then
    its n-grams and digit shapes (:func:`~streamlearn.hashing.tokenize`), so bisection
    finds the end with about log2(len) tests instead of one per token."""
    return bisect.bisect_left(tokens, True, 0, len(tokens) if T is None else min(T, len(tokens)), key=_not_word)


def _not_word(token: str) -> bool:
    return not is_word_token(token)


class Classify(Task):
    """The classify task (see the module docstring)."""

    name = "classify"
    answers = "labels"
    ramps_up = True  # its first steps take 1, 2, 4, ... records (Task.ramps_up)
    replicable = True  # the label tables merge at each sync (streamlearn.sync)
    target_field = "label"
    Preparer = ClassifyPreparer

    def __init__(self, cfg: Config, featurizer: Featurizer):
        super().__init__(cfg, featurizer)
        lc = cfg.learner
        self.nb = NaiveBayesHead(lc.nb_cells, cfg.model.max_labels, lc.nb_alpha,
                                 lc.nb_skip_unseen) if lc.nb_weight > 0 else None
        # the depth-0 forward compiled, where the learner runs its step compiled
        # (streamlearn.compiled.CompiledClassifyStep.logits: the learner sets it)
        self.compiled_logits: Callable[[Batch], torch.Tensor] | None = None
        if self.nb is not None and lc.compiled:
            self.nb.compiled = WhenLoaded(self._compiled_naive_bayes)

    def _compiled_naive_bayes(self) -> CompiledNaiveBayes:
        from ..compiled import CompiledNaiveBayes  # imports numba: only where it runs

        return CompiledNaiveBayes(self.nb)

    @property
    def label_table(self) -> LabelTable:
        return self.prep.label_table

    # ------------------------------------------------------------------ model
    def make_head(self, d_model: int, embedding) -> LabelHead:
        return LabelHead(d_model, self.cfg.model.max_labels)

    def before_step(self, model: HashedTransformer, batch: Batch) -> None:
        if batch.n_labels > batch.label_start:
            self.start_label_rows(model, range(batch.label_start, batch.n_labels))

    def label_parameters(self, model: HashedTransformer) -> tuple[torch.nn.Parameter, ...]:
        return model.head.weight, model.head.bias

    def start_label_rows(self, model: HashedTransformer, ids: Iterable[int], labels: Iterable | None = None) -> None:
        """Give label head rows ``ids`` their starting vectors, a function of
        ``learner.seed`` and the label alone (:class:`~streamlearn.heads.LabelHead`);
        ``labels``: the label of each id (default: the label table's). Every replica
        that meets a label, in any order, starts its row alike."""
        ids = list(ids)
        labels = [self.label_table.labels[i] for i in ids] if labels is None else list(labels)
        scale = 1.0 if model.depth == 0 else 0.1  # unit-size pooled states behind a LayerNorm
        model.head.start_rows(ids, labels, seed_of(self.cfg.learner.seed, "label-head"), scale)

    def label_logits(self, model: HashedTransformer, batch: Batch, dev: Device) -> torch.Tensor:
        """Label logits (N, n_labels) of a prediction: the model's, plus
        ``learner.nb_weight`` times the Naive Bayes scores when that part is on.
        Without autograd (queries, predictions) a depth-0 model on the CPU pools through
        its bag (:meth:`HashedTransformer.bag`): the same states, computed without the
        padded (N, T, d) tensor and without a graph for autograd to follow."""
        return self.with_counts(self.network_logits(model, batch, dev), batch, dev)

    def logit_parts(self, model: HashedTransformer, batch: Batch, dev: Device) -> dict[str, torch.Tensor]:
        """The parts that add up to :meth:`label_logits`, (N, n_labels) each: ``"model"``,
        and ``"naive_bayes"`` (already times ``learner.nb_weight``) when that part is on."""
        parts = {MODEL_PART: self.network_logits(model, batch, dev)}
        if self.nb is not None:
            parts[NB_PART] = self.cfg.learner.nb_weight * dev.tensor(self.nb_scores(batch))
        return parts

    def token_terms(self, model: HashedTransformer, batch: Batch, dev: Device) -> dict[str, torch.Tensor]:
        """What each token adds to the parts of :meth:`logit_parts` that are linear in the
        tokens, exactly: (N, T, n_labels) per part, zero at padding. The Naive Bayes part
        always; the model's at depth 0, where the pooled per-token states feed a linear
        head (a part's logits are its terms summed plus a part that no token changes:
        the head's bias, the Naive Bayes prior). A part missing here is not linear."""
        feats = dev.tensors(batch.feats)
        terms = {}
        if model.depth == 0:
            h = model.encode(feats)  # (N, T, d): per token at depth 0, nothing mixes positions
            N, T = feats["mask"].shape
            basis = torch.eye(T, device=h.device, dtype=h.dtype).expand(N, T, T)
            weight = model.pool(basis, feats["mask"])  # (N, T): the pool's coefficient of each token
            head = model.head(weight.unsqueeze(-1) * h, batch.n_labels).float()  # (N, T, n_labels)
            terms[MODEL_PART] = head - model.head(torch.zeros_like(h[:, :1]), batch.n_labels).float()
        if self.nb is not None:
            nb, _ = self.nb.token_terms(batch.nb_tokens, batch.n_labels)
            terms[NB_PART] = self.cfg.learner.nb_weight * dev.tensor(nb)
        return terms

    def network_logits(self, model: HashedTransformer, batch: Batch, dev: Device) -> torch.Tensor:
        """The network's label logits (N, n_labels), what its loss sees."""
        if self.compiled_logits is not None and not torch.is_grad_enabled():
            return self.compiled_logits(batch)
        bag = None if dev.cuda or torch.is_grad_enabled() else model.bag(batch.feats)
        if bag is not None:
            return model.head(bag.x, batch.n_labels).float()
        feats = dev.tensors(batch.feats)
        return model.head(model.pool(model.encode(feats), feats["mask"]), batch.n_labels).float()

    def with_counts(self, logits: torch.Tensor, batch: Batch, dev: Device) -> torch.Tensor:
        """``logits`` (N, n_labels) plus ``learner.nb_weight`` times :meth:`nb_scores`."""
        if self.nb is None:
            return logits
        return logits + self.cfg.learner.nb_weight * dev.tensor(self.nb_scores(batch))

    def add_counts(self, logits: np.ndarray, batch: Batch) -> np.ndarray:
        """:meth:`with_counts` of the CPU's network logits as a numpy array, in place:
        the compiled step's (three torch calls on 8 x 4 floats cost about 30 us a batch)."""
        if self.nb is not None:
            logits += np.float32(self.cfg.learner.nb_weight) * self.nb_scores(batch)
        return logits

    def nb_scores(self, batch: Batch) -> np.ndarray:
        """The Naive Bayes scores (N, n_labels) of a prepared batch: a query's from the
        counts as they are; a training batch's (not learned yet) in stream order, each
        record's from the counts of every record before it, its batch's earlier ones
        included (in the label ids the batch holds now)."""
        if not batch.train:
            return self.nb.scores(batch.nb_tokens, batch.n_labels)
        return self.nb.scores_in_order(batch.nb_tokens, batch.targets["labels"], batch.weight, batch.n_labels)

    def loss(self, model, batch, dev):
        ce = F.cross_entropy(self.network_logits(model, batch, dev), dev.tensor(batch.targets["labels"]),
                             reduction="none")
        return (ce * dev.tensor(batch.weight)).sum() / len(ce)

    def has_closed_form(self, model: HashedTransformer, dev: Device) -> bool:
        return not dev.cuda and model.has_bag

    def gradients(self, model: HashedTransformer, batch: Batch, dev: Device,
                  outputs: bool = True) -> ClosedForm | None:
        """:meth:`loss`'s step in closed form where the model pools through a bag (depth
        0 on the CPU): with softmax q and weights w, dL/dlogits = (q - onehot(y)) w / N;
        the head and the bag pass it back (:meth:`LabelHead.gradients`,
        :meth:`Bag.row_gradients <streamlearn.embeddings.base.Bag.row_gradients>`). Equal to
        autograd's gradients to float rounding (tests/test_learner.py)."""
        if not self.has_closed_form(model, dev):
            return None
        bag = model.bag(batch.feats)
        logits = model.head(bag.x, batch.n_labels).float()  # (N, n_labels): the network's, as the loss sees
        y = batch.targets["labels"]  # (N,)
        rows = np.arange(len(y))
        w = batch.weight / np.float32(len(y))  # (N,) float32
        logp = torch.log_softmax(logits, 1)
        # The picks and the (q - onehot) w arithmetic in numpy, on the tensors' memory: the
        # same single float32 operations as torch's indexing ops, at a fraction of their
        # dispatch cost (a batch of 8 is a few dozen numbers).
        loss = -torch.dot(torch.from_numpy(logp.numpy()[rows, y]), torch.from_numpy(w))
        grad = logp.exp()  # (N, n_labels): q
        q = grad.numpy()
        q[rows, y] -= np.float32(1.0)
        q *= w[:, None]
        (grad_w, grad_b), grad_x = model.head.gradients(bag.x, grad)
        head = ((model.head.weight, grad_w), (model.head.bias, grad_b))  # rows beyond n_labels: zero, never used
        # The Naive Bayes scores join the outputs only (the loss sees the network's logits):
        # a step that predicts nothing skips them, a tenth of a learn_many step (py-spy, SMS).
        scored = self.with_counts(logits, batch, dev) if outputs else None
        return ClosedForm(float(loss), scored, bag.row_gradients(grad_x), head, bag.tables())

    def outputs(self, model, batch, dev):
        return self.label_logits(model, batch, dev)

    def learned(self, batch: Batch) -> dict[str, np.ndarray]:
        """The Naive Bayes part counts the batch, after its step (the step's predictions
        scored each record from the records before it, :meth:`nb_scores`)."""
        if self.nb is None or not batch.examples:
            return {}
        return {NB_COUNTS: self.nb.learn(batch.nb_tokens, batch.targets["labels"], batch.weight)}

    def count_tables(self) -> dict[str, torch.Tensor]:
        return {} if self.nb is None else {NB_COUNTS: self.nb.counts}

    def rows_read(self, batch: Batch) -> dict[str, np.ndarray]:
        if self.nb is None or batch.nb_tokens is None or not batch.n_labels:
            return {}
        return {NB_COUNTS: self.nb.rows_read(batch.nb_tokens, batch.n_labels)}

    # ------------------------------------------------------------------ answers
    def probabilities(self, model: HashedTransformer, batch: Batch, dev: Device) -> np.ndarray:
        """Label probabilities (N, n_labels) of a prepared batch (a query batch, or a
        training batch before it is learned: prequential evaluation)."""
        if not batch.n_labels or batch.feats is None:
            return np.zeros((batch.examples if batch.train else batch.records, batch.n_labels), np.float32)
        return self.label_logits(model, batch, dev).softmax(-1).cpu().numpy()

    def known_probabilities(self, outputs: torch.Tensor | None, batch: Batch) -> np.ndarray:
        """The softmax over the labels known before the batch (its first ``label_start``
        logits): what a prediction made before the batch was prepared could answer
        (examples, label_start)."""
        if outputs is None or not batch.label_start:
            return np.zeros((batch.examples, batch.label_start), np.float32)
        return outputs[:, :batch.label_start].float().softmax(-1).cpu().numpy()

    def predict_proba(self, model, batch, dev) -> list[dict]:
        """``{label: probability}`` over the labels seen so far ({} before any)."""
        if not batch.n_labels or not batch.records:
            return [{} for _ in range(batch.records)]
        labels = self.label_table.labels[:batch.n_labels]
        return [dict(zip(labels, row.tolist())) for row in self.probabilities(model, batch, dev)]

    def predict(self, model, batch, dev) -> list:
        """The most probable label (None before any label)."""
        return [max(p, key=p.get) if p else None for p in self.predict_proba(model, batch, dev)]

    def topk(self, model, batch, dev, k, beam, exclude=None) -> list[TopK]:
        if not batch.records:
            return []
        if not batch.n_labels:
            return [TopK([], np.empty(0), True, 0) for _ in range(batch.records)]
        logp = F.log_softmax(self.label_logits(model, batch, dev), -1).cpu()  # (N, n_labels)
        top = logp.topk(min(k, batch.n_labels), dim=-1)
        labels = self.label_table.labels
        return [TopK([labels[i] for i in ids.tolist()], s.numpy().astype(np.float64), True, batch.n_labels)
                for s, ids in zip(top.values, top.indices)]

    def hits(self, model: HashedTransformer, batch: Batch, dev: Device) -> int | None:
        """Correct label predictions on a training batch, made before learning it, over
        the labels known before it (:meth:`known_probabilities`: a label the batch brings
        cannot be predicted before it is learned, as in a replay: a batch before any
        label was known scores 0); None when it holds no example."""
        if not batch.examples or not batch.n_labels:
            return None
        return self.hits_of(self.label_logits(model, batch, dev), batch)

    def hits_of(self, outputs: torch.Tensor | None, batch: Batch) -> int | None:
        """:meth:`hits` from the label logits (examples, n_labels) the model gave a
        training batch before learning it (its own, or those of the step's forward:
        ``Learner.learn_batch_scored``)."""
        if outputs is None or not batch.examples or not batch.n_labels:
            return None
        if not batch.label_start:
            return 0
        predicted = outputs[:, :batch.label_start].argmax(-1).cpu().numpy()  # (N,)
        return int((predicted == batch.targets["labels"]).sum())

    def prequential_check(self) -> LabelCheck:
        """Accuracy against the Naive Bayes part alone (the majority label without it)."""
        return LabelCheck(self)

    # ------------------------------------------------------------------ evaluation
    def events(self, seed: int, bags: bool = True):
        """The record's words (the model's tokenizer, so bag-of-words baselines see the
        same words, not the n-grams and digit shapes the network alone gets: the words
        are what the peers score best on); the answer is its label. Without ``bags`` (no
        baseline reads the words) a text is only checked to hold a token: the words
        tokenizer finds one exactly where the text holds a character that is not
        whitespace (tokenizing a record here took a third of an AG News replay's wall
        time)."""
        ordered = self.cfg.hashing.tokenizer == "words"  # words first (text_words); else test each token

        def build(position: int, rec: Record) -> list[Event]:
            if not bags and ordered and rec.tokens is None and rec.text is not None:
                if not rec.text.strip():
                    raise RecordError("bad-value: the text has no tokens after tokenization")
                tokens = ()
            else:
                tokens = self.prep.text_tokens(rec)
            if rec.tokens is None and tokens:
                tokens = tokens[:text_words(tokens)] if ordered else [t for t in tokens if is_word_token(t)]
            if rec.label is None:
                raise RecordError("missing-field: label (task classify)")
            return [Event(position, rec, rec.label, True, rec, tokens=tuple(tokens))]
        return build
