"""Output heads of the hashed transformer, each with its loss.

- :class:`LabelHead`: classification over a label table that grows up to
  ``model.max_labels`` rows; only the first ``n_labels`` rows take part in the softmax.
- :class:`HashedHead`: Superbloom's output layer. Each output id t has m hashes
  eta_1(t)..eta_m(t) into [0, size) (a :class:`~streamlearn.outputs.HashedCode`); the
  head gives m softmaxes over the hash space and the loss is sum_j CE(p_j, eta_j(t)).
  Its output table is either its own (size, width) matrix or, tied, the input
  embedding's row table with the input's hash functions (``eta_j = h_j``), as
  Superbloom does when input and output spaces coincide.
- :class:`TFreeHead`: T-Free's output: v sigmoids over the rows of the T-Free table,
  trained with multi-label BCE against the target word's trigram pattern.
- :class:`ShuffleRandomHead`: HashFormers' Shuffle+Random objective, a 3-way per-token
  classifier (intact / shuffled / random).

Token heads (:func:`output_head` picks one for an output code) share one interface:
``forward(x, tied)``, ``loss(logits, targets, weight)`` and ``decodable(logits)`` (the
scores the code decodes). They never own a tied table: the caller passes it in, so
``state_dict`` holds it once, under the embedding, and the row-wise optimizer sees one
parameter. Dense weights draw
from torch's global RNG; the model is built under a seeded ``fork_rng``.
"""
from __future__ import annotations

from typing import NamedTuple, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from .config import NB_ROW
from .counts.table import distinct
from .embeddings.base import RowGroups
from .hashing import derive_seed
from .outputs import HashedCode, OutputCode, PatternCode, SampledCode

__all__ = ["HashedHead", "LabelHead", "NaiveBayesHead", "Prior", "SampledHead", "ShuffleRandomHead", "TFreeHead", "add_prior",
           "output_head"]

# The fixed weight of the KN count scores beside a separately learned network (SampledHead):
# recall@10 within 0.0004 of each stream's best weight among 1.0, 1.5, 2.0 (and 2.5, 3.0 on
# War and Peace), one set for War and Peace, SMS and AG News read as token streams.
COUNT_WEIGHT = 2.0


class LabelHead(nn.Module):
    """Logits over the first ``n_labels`` of ``max_labels`` label rows.

    A row is zero until its label arrives; rows beyond ``n_labels`` are never read, so
    they get no gradient and stay zero. When a label arrives, :meth:`start_rows` gives
    its row a N(0, 1/d_model) vector drawn from a generator seeded by the config seed
    and the label itself (not by its position), so replicas or snapshots that meet the
    same label, in any order, start its row alike. Not zero: logits are the head times
    the pooled token vectors, and a zero row sends no gradient to the token vectors
    until the row has grown, which wastes the start of a stream (prequential accuracy
    at depth 0, 3 seeds: AG News 0.8235 -> 0.8334, SMS 0.9728 -> 0.9754;
    docs/choosing-a-configuration.md). The bias starts at zero. With transformer layers
    the learner passes ``scale`` 0.1: the encoder's final LayerNorm makes the pooled
    states about unit-size per coordinate, and full-size rows would start with random
    logits of about unit size (1 layer, AG News: 0.8016 zero, 0.7846 at scale 1, 0.8086
    at 0.1, seed 0).
    """

    def __init__(self, d_model: int, max_labels: int):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(max_labels, d_model))
        self.bias = nn.Parameter(torch.zeros(max_labels))

    def forward(self, x: torch.Tensor, n_labels: int) -> torch.Tensor:
        return F.linear(x, self.weight[:n_labels], self.bias[:n_labels])  # (n, n_labels)

    def row_tables(self) -> dict[str, nn.Parameter]:
        return {}

    def gradients(self, x: torch.Tensor, grad: torch.Tensor) -> tuple[tuple[torch.Tensor, torch.Tensor], torch.Tensor]:
        """:meth:`forward`'s gradient in closed form, given dL/dlogits ``grad`` (n,
        n_labels) at input ``x`` (n, d): ``((dL/dweight, dL/dbias) of the first n_labels
        rows, (n_labels, d) and (n_labels,)), dL/dx (n, d))``. Rows beyond n_labels are
        never read: their gradient is zero."""
        n_labels = grad.shape[1]
        return (grad.t() @ x, grad.sum(0)), grad @ self.weight.detach()[:n_labels]

    @torch.no_grad()
    def start_rows(self, ids: Sequence[int], labels: Sequence, seed: int, scale: float = 1.0) -> None:
        """Row ``ids[i]`` gets the starting vector of ``labels[i]`` (class docstring),
        times ``scale``."""
        d = self.weight.shape[1]
        for row, label in zip(ids, labels):
            self.weight[row] = (label_row(label, d, seed) * scale).to(self.weight)


def label_row(label, d: int, seed: int) -> torch.Tensor:
    """The starting row (d,) of a label: N(0, 1/d) from a generator seeded by xxhash of
    the label and its type (so 1, "1" and True differ) under ``seed``."""
    purpose = f"label-row/{type(label).__name__}/{label}"
    gen = torch.Generator().manual_seed(derive_seed(seed, purpose) & (2**63 - 1))
    return torch.randn(d, generator=gen) * d ** -0.5


class _Transform(nn.Module):
    """BERT's output transform, once per output slot: (n, d_model) -> (n, slots, width)."""

    def __init__(self, d_model: int, slots: int, width: int):
        super().__init__()
        self.slots, self.width = slots, width
        self.dense = nn.Linear(d_model, slots * width)
        self.norm = nn.LayerNorm(width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        z = F.gelu(self.dense(x)).view(x.shape[0], self.slots, self.width)
        return self.norm(z)  # (n, slots, width)


class HashedHead(nn.Module):
    """Superbloom's m softmaxes over the hashed output space of a :class:`HashedCode`."""

    def __init__(self, d_model: int, code: HashedCode, width: int):
        super().__init__()
        # Slot j gets its own transform: with one vector per position (rather than
        # Superbloom's m input positions per id) the m distributions must differ.
        self.transform = _Transform(d_model, code.m, width)
        self.bias = nn.Parameter(torch.zeros(code.m, code.size))
        self.table = None
        if code.table is None:
            self.table = nn.Parameter(torch.randn(code.size, width) * 0.02)

    def forward(self, x: torch.Tensor, tied: torch.Tensor | None = None) -> torch.Tensor:
        """x (n, d_model) -> logits (n, m, size). ``tied``: the embedding's table."""
        table = self.table if self.table is not None else tied
        z = self.transform(x)  # (n, m, width)
        return torch.matmul(z, table.t().to(z.dtype)) + self.bias  # (n, m, size)

    def loss(self, logits: torch.Tensor, targets: dict[str, torch.Tensor], weight: torch.Tensor) -> torch.Tensor:
        """sum_j CE(logits[:, j], hashes[:, j]), weighted mean over the n examples.
        logits (n, m, size), targets["hashes"] (n, m) int64, weight (n,)."""
        n, m, size = logits.shape
        hashes = targets["hashes"]
        ce = F.cross_entropy(logits.reshape(n * m, size).float(), hashes.reshape(n * m), reduction="none")
        return (ce.view(n, m).sum(1) * weight).sum() / n

    @staticmethod
    def decodable(logits: torch.Tensor) -> torch.Tensor:
        """Log-probabilities (n, m, size): what beam search sums per candidate."""
        return F.log_softmax(logits.float(), dim=-1)

    def answer_logp(self, x: torch.Tensor, hashes: torch.Tensor, tied: torch.Tensor | None = None,
                    prior: Prior | None = None, lam: torch.Tensor | None = None) -> torch.Tensor:
        """log softmax_j(logits [+ lam prior])(hashes[:, j]) (n, m): each slot's
        log-probability of the answer's bucket, what the loss reads, with
        :class:`AnswerLogSoftmax`'s backward."""
        table = self.table if self.table is not None else tied
        return AnswerLogSoftmax.apply(self.transform(x), table, self.bias, hashes, prior, lam)

    def fit_loss(self, x: torch.Tensor, targets: dict[str, torch.Tensor], weight: torch.Tensor,
                 tied: torch.Tensor | None = None) -> torch.Tensor:
        """The training loss of the states ``x`` (n, d_model): :meth:`loss` of
        :meth:`forward`'s logits, computed at the answers (:meth:`answer_logp`)."""
        logp = self.answer_logp(x, targets["hashes"], tied)  # (n, m)
        return (-logp.sum(1) * weight).sum() / logp.shape[0]

    def row_tables(self) -> dict[str, nn.Parameter]:
        return {}


class Prior(NamedTuple):
    """A second expert's log-probabilities over a hashed head's buckets, up to a constant
    per example, as they join (n, m, size) logits: a shared part ``shared`` (m, size) plus
    ``lift`` (P,) at the flat positions ``where`` (P,) (distinct) of the (n, m, size)
    scores. Weighted per example by a ``lam`` (n, 1, 1): :func:`add_prior`.
    (next-item's transition counts: :class:`~streamlearn.tasks.next_item.TransitionHead`)"""

    shared: torch.Tensor
    where: torch.Tensor
    lift: torch.Tensor

    @property
    def example(self) -> torch.Tensor:
        """(P,) the example each of :attr:`where` belongs to."""
        return self.where // self.shared.numel()

    def weigh(self, lam: torch.Tensor) -> torch.Tensor:
        """lam at each of :attr:`where` (P,): the weight of the example it belongs to."""
        return lam.reshape(-1)[self.example]


def add_prior(scores: torch.Tensor, prior: Prior, lam: torch.Tensor) -> torch.Tensor:
    """``scores`` (n, m, size) + lam * the prior, in place (no graph may need ``scores``)."""
    scores.addcmul_(prior.shared, lam)
    scores.view(-1).index_add_(0, prior.where, prior.weigh(lam) * prior.lift)
    return scores


class AnswerLogSoftmax(torch.autograd.Function):
    """``log_softmax(z @ table.T + bias [+ lam * prior], -1)`` at the answers: z (n, m,
    width), table (size, width), bias (m, size), answers (n, m) -> (n, m) float32; with a
    :class:`Prior` and its weight ``lam`` (n, 1, 1), which takes a gradient too, a second
    expert's log-probabilities join the logits.

    The same values and gradients as autograd through ``cross_entropy`` of the (n, m,
    size) logits (tests/test_model.py, tests/test_transitions.py), at about 0.6x its time
    (n m = 512 rows of 4,096 buckets, width 64, one CPU thread: 8.0 against 13.9 ms forward
    and backward): the one (n, m, size) buffer becomes the exponentials in place and, in
    the backward, the logits' gradient in place, where autograd allocates and reads
    several. The backward's two matrix products are most of what is left.
    """

    @staticmethod
    def forward(ctx, z: torch.Tensor, table: torch.Tensor, bias: torch.Tensor, answers: torch.Tensor,
                prior: Prior | None = None, lam: torch.Tensor | None = None) -> torch.Tensor:
        e = torch.matmul(z, table.t().to(z.dtype)).float()  # (n, m, size); a bf16 product under CUDA autocast
        e.add_(bias)
        if prior is not None:
            add_prior(e, prior, lam)
        top = e.amax(2, keepdim=True)  # (n, m, 1)
        at = e.gather(2, answers.unsqueeze(2))  # (n, m, 1) the answers' logits
        sums = e.sub_(top).exp_().sum(2, keepdim=True)  # e: exp(logit - top)
        ctx.e, ctx.sums, ctx.prior = e, sums, prior
        ctx.save_for_backward(z, table, answers)
        return (at - top - sums.log()).squeeze(2)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        z, table, answers = ctx.saved_tensors
        g = grad.float().unsqueeze(2)  # (n, m, 1)
        d = ctx.e.mul_(-g / ctx.sums)  # -g softmax, in the exponentials' buffer (one backward)
        del ctx.e
        d.scatter_add_(2, answers.unsqueeze(2), g)  # + g at the answers: g (onehot - softmax)
        flat = d.view(-1, d.shape[2])  # (n m, size)
        grad_z = (flat @ table.float()).view(z.shape).to(z.dtype) if ctx.needs_input_grad[0] else None
        grad_table = (flat.t() @ z.reshape(-1, z.shape[2]).float()).to(table.dtype) if ctx.needs_input_grad[1] else None
        grad_bias = d.sum(0) if ctx.needs_input_grad[2] else None
        prior, grad_lam = ctx.prior, None
        del ctx.prior
        if prior is not None and ctx.needs_input_grad[5]:
            n = len(d)  # d lam: sum over (m, size) of d times the prior
            grad_lam = (d.view(n, -1) @ prior.shared.reshape(-1)).index_add_(
                0, prior.example, d.view(-1)[prior.where] * prior.lift).view(n, 1, 1)
        return grad_z, grad_table, grad_bias, None, None, grad_lam


class TFreeHead(nn.Module):
    """T-Free's output: sigmoid over v rows, multi-label BCE against the target pattern."""

    def __init__(self, d_model: int, code: PatternCode, width: int):
        super().__init__()
        self.v = code.rows
        self.transform = _Transform(d_model, 1, width)
        self.bias = nn.Parameter(torch.zeros(self.v))
        self.table = None
        if code.table is None:
            self.table = nn.Parameter(torch.randn(self.v, width) * 0.02)

    def forward(self, x: torch.Tensor, tied: torch.Tensor | None = None) -> torch.Tensor:
        """x (n, d_model) -> logits (n, v) (apply a sigmoid for activations)."""
        table = self.table if self.table is not None else tied
        z = self.transform(x)[:, 0]  # (n, width)
        return z @ table.t().to(z.dtype) + self.bias  # (n, v)

    def loss(self, logits: torch.Tensor, targets: dict[str, torch.Tensor], weight: torch.Tensor) -> torch.Tensor:
        """Multi-label BCE summed over the v rows against the targets' CSR patterns."""
        dense = multi_hot(targets["ids"], targets["offsets"], self.v)  # (n, v) in {0, 1}
        bce = F.binary_cross_entropy_with_logits(logits.float(), dense, reduction="none").sum(1)
        return (bce * weight).sum() / logits.shape[0]

    @staticmethod
    def decodable(logits: torch.Tensor) -> torch.Tensor:
        """The logits themselves (n, v): a pattern's score is the sum of its rows'."""
        return logits.float()

    def fit_loss(self, x: torch.Tensor, targets: dict[str, torch.Tensor], weight: torch.Tensor,
                 tied: torch.Tensor | None = None) -> torch.Tensor:
        """The training loss of the states ``x`` (n, d_model)."""
        return self.loss(self(x, tied), targets, weight)

    def row_tables(self) -> dict[str, nn.Parameter]:
        return {}


class SampledHead(nn.Module):
    """A softmax over tokens (:class:`~streamlearn.outputs.SampledCode`): token w's vector
    is the sum of its m hashed rows of the row table ``O`` (size, d_model), its bias the sum
    of its rows of ``Ob`` (size, 1), and its logit ``transform(x) . o_w + b_w``.

    Learning (:meth:`fit_loss`) takes the softmax over the batch's distinct answers plus
    negatives drawn from the candidate index, so the gradient reaches only their rows
    (sparse, like an embedding's): dirty rows per step scale with the batch, never with the
    table. Answering (:meth:`forward` with every candidate) scores each candidate exactly.
    Both tables start at zero: every token starts equal, and a row never written needs no
    init to be rebuilt on restore.

    With a count part (``code.features`` F > 0) the logit of candidate w adds
    ``sum_f g_f s_f(w)``, s_f the count part's log-probabilities (``counts`` (n, F, c)):

    - ``separate`` (``model.count_fit``, the default): two experts. The network learns
      its own softmax, as with no count part (its step reads no count score), and the
      weights g are fixed: :data:`COUNT_WEIGHT` for the KN scores (column 0), 0.05 for
      the recent-token cache's (column 1).
    - ``joint`` (a state stored before ``model.count_fit`` keeps it): g = softplus(W x + c)
      gates (n, F) learned with the rest on the joined softmax over each answer and drawn
      negatives (:meth:`_own_and_negatives`), so the network fits the counts' residual.
      W starts at zero and c at softplus^-1 of the fixed weights' 1.0 and 0.05.

    Why separate, with a fixed weight: on War and Peace's first 3,000 records, recall@10
    0.4744 against 0.4677 joint; the weight spans a plateau there (1.25 to 2.5 within
    0.0001). A weight learned on the sampled softmax settles far below it (about 0.2
    per state, 0.8 as one scalar: 0.4484 at 1,500 records against 0.4569 at 1.5), since
    128 drawn negatives do not estimate the full softmax's gradient for it
    (docs/choosing-a-configuration.md).
    """

    def __init__(self, d_model: int, code: SampledCode, separate: bool = True):
        super().__init__()
        self.transform = _Transform(d_model, 1, d_model)
        self.O = nn.Parameter(torch.zeros(code.rows, d_model))
        self.Ob = nn.Parameter(torch.zeros(code.rows, 1))
        self.gates = None
        if code.features and separate:
            self.register_buffer("weights", torch.tensor([COUNT_WEIGHT] + [0.05] * (code.features - 1)))
        elif code.features:
            self.gates = nn.Linear(d_model, code.features)
            with torch.no_grad():
                self.gates.weight.zero_()
                start = torch.tensor([1.0] + [0.05] * (code.features - 1))
                self.gates.bias.copy_(torch.log(torch.expm1(start)))  # softplus(c) = start

    def _count_weights(self, x: torch.Tensor) -> torch.Tensor:
        """The count scores' weights g (n, F) at states x (n, d_model)."""
        if self.gates is None:
            return self.weights.expand(len(x), -1)
        return F.softplus(self.gates(x))

    def row_tables(self) -> dict[str, nn.Parameter]:
        return {"O": self.O, "Ob": self.Ob}

    def _rows(self, x: torch.Tensor, hashes: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x (n, d_model), tokens' hashes (c, m) -> z (n, d), their vectors o (c, d) and biases b (c,)."""
        z = self.transform(x)[:, 0]  # (n, d)
        o = F.embedding_bag(hashes, self.O, mode="sum", sparse=True).to(z.dtype)  # (c, d)
        b = F.embedding_bag(hashes, self.Ob, mode="sum", sparse=True)[:, 0].to(z.dtype)  # (c,)
        return z, o, b

    def _logits(self, x: torch.Tensor, hashes: torch.Tensor, counts: torch.Tensor | None = None) -> torch.Tensor:
        """x (n, d_model), tokens' hashes (c, m), count scores (n, F, c) -> logits (n, c)."""
        z, o, b = self._rows(x, hashes)
        logits = z @ o.t() + b  # (n, c)
        if counts is None:  # no count part, or learning the network's own softmax (separate)
            return logits
        g = self._count_weights(x).to(logits.dtype)  # (n, F)
        return logits + torch.einsum("nf,nfc->nc", g, counts.to(logits.dtype))

    def forward(self, x: torch.Tensor, tied: torch.Tensor | None = None,
                choices: torch.Tensor | None = None, counts: torch.Tensor | None = None) -> torch.Tensor:
        """Log-probabilities (n, c) over the ``choices`` (c, m): every token the
        candidate index holds, in its order; ``counts`` (n, F, c): the count part's."""
        return F.log_softmax(self._logits(x, choices, counts).float(), dim=-1)

    @staticmethod
    def decodable(scores: torch.Tensor) -> torch.Tensor:
        return scores.float()

    def fit_loss(self, x: torch.Tensor, targets: dict[str, torch.Tensor], weight: torch.Tensor,
                 tied: torch.Tensor | None = None) -> torch.Tensor:
        """Weighted cross-entropy over ``targets["choices"]`` (c, m) (the answers and the
        drawn negatives), example i's answer at ``targets["answer"][i]``. With a ``joint``
        count part, ``targets["negatives"]`` (k,) are the drawn choices and example i's
        softmax is over its answer and those only (:meth:`_own_and_negatives`)."""
        if "negatives" in targets:
            logits = self._own_and_negatives(x, targets)  # (n, 1 + k): column 0 the answer
            ce = torch.logsumexp(logits, 1) - logits[:, 0]
            return (ce * weight).sum() / len(ce)
        logits = self._logits(x, targets["choices"], targets.get("counts")).float()  # (n, c)
        if "logq" in targets:  # sampled softmax's correction: log(K Q(w)) of each choice
            logits = logits - targets["logq"][None]
        ce = F.cross_entropy(logits, targets["answer"], reduction="none")
        return (ce * weight).sum() / len(ce)

    def gradients(self, x: torch.Tensor, targets: dict[str, torch.Tensor], weight: torch.Tensor,
                  ) -> tuple[torch.Tensor, torch.Tensor, tuple[tuple[nn.Parameter, torch.Tensor], ...],
                             dict[str, tuple[torch.Tensor, torch.Tensor]]]:
        """:meth:`fit_loss` over the network's own softmax (step targets of ``choices``
        and ``answer`` only: no count scores, no logQ) with its gradients in closed
        form: ``(loss, dL/dx (n, d), ((parameter, gradient), ...) of the transform,
        {"O": (rows, gradient rows), "Ob": ...})``, the row gradients summed per distinct
        row, ascending. With dl = (softmax - onehot(answer)) w / n over the choices:
        dz = dl o, do = dl^T z, db = sum dl; then LayerNorm's and GELU's backward (the
        kernels autograd runs) and the dense layer's. Equal to autograd's to float
        rounding (tests/test_learner.py). Autograd's two kernels and one gather per
        table in place of the ops written out: 920 against 1,150-1,240 us a step (40
        War and Peace batches of mlm, one thread)."""
        t = self.transform
        W, b, gamma, beta = t.dense.weight, t.dense.bias, t.norm.weight, t.norm.bias
        width = W.shape[0]
        u = torch.addmm(b, x, W.t())  # (n, d)
        g = F.gelu(u)
        z, mean, rstd = torch.native_layer_norm(g, (width,), gamma, beta, t.norm.eps)  # z: transform(x)
        hashes, answer = targets["choices"], targets["answer"]  # (c, m), (n,)
        c, m = hashes.shape
        flat = hashes.reshape(-1)
        o = self.O.index_select(0, flat).view(c, m, -1).sum(1)  # (c, d)
        bias = self.Ob.index_select(0, flat).view(c, m).sum(1)  # (c,)
        logp = torch.log_softmax(torch.addmm(bias, z, o.t()), 1)  # (n, c)
        w = weight / len(answer)  # (n,)
        at = answer.unsqueeze(1)
        loss = -torch.dot(logp.gather(1, at).squeeze(1), w)
        dl = logp.exp_()
        dl.scatter_add_(1, at, torch.full(at.shape, -1.0, dtype=dl.dtype))
        dl.mul_(w.unsqueeze(1))
        dz = dl @ o  # (n, d)
        do, dbias = dl.t() @ z, dl.sum(0)  # (c, d), (c,)
        # autograd's own backward kernels of LayerNorm and GELU
        dg, dgamma, dbeta = torch.ops.aten.native_layer_norm_backward(dz, g, [width], mean, rstd, gamma, beta,
                                                                      [True, True, True])
        du = torch.ops.aten.gelu_backward(dg, u)
        dense = ((W, du.t() @ x), (b, du.sum(0)), (gamma, dgamma), (beta, dbeta))
        groups = RowGroups(flat.numpy())
        owner = torch.arange(c).repeat_interleave(m)  # (c * m,): each hash's choice
        out = {"O": (groups.rows, groups.sums(do, owner)), "Ob": (groups.rows, groups.sums(dbias[:, None], owner))}
        return loss, du @ W, dense, out

    def _own_and_negatives(self, x: torch.Tensor, targets: dict[str, torch.Tensor]) -> torch.Tensor:
        """Logits (n, 1 + k), logQ-corrected: each example's own answer, then the k drawn
        negatives (-inf where a negative is the example's own answer: it is column 0
        already). The same softmax as masking the (n, c) grid of every choice to the
        answer and the negatives, at n (1 + k) cells: the count part scores only these
        (``targets["own_counts"]`` (n, F), ``targets["counts"]`` (n, F, k))."""
        answer, neg = targets["answer"], targets["negatives"]
        z, o, b = self._rows(x, targets["choices"])
        logq = targets["logq"].to(z.dtype)
        own = (z * o[answer]).sum(1) + b[answer] - logq[answer]  # (n,)
        other = z @ o[neg].t() + (b[neg] - logq[neg])[None]  # (n, k)
        if "counts" in targets:
            g = self._count_weights(x)  # (n, F)
            with torch.autocast(z.device.type, enabled=False):  # a loss's terms stay float32 (docs/gpu.md)
                g = g.float()
                own = own.float() + (g * targets["own_counts"].float()).sum(1)
                other = other.float() + torch.einsum("nf,nfk->nk", g, targets["counts"].float())
        other = other.masked_fill(neg[None] == answer[:, None], float("-inf"))
        return torch.cat([own[:, None], other], 1).float()


def output_head(d_model: int, code: OutputCode, width: int, separate: bool = True) -> HashedHead | TFreeHead | SampledHead:
    """The head of an output code; ``width``: the tied table's width (or d_model);
    ``separate``: a sampled head's ``model.count_fit`` (:class:`SampledHead`)."""
    if isinstance(code, SampledCode):
        return SampledHead(d_model, code, separate)
    return HashedHead(d_model, code, width) if isinstance(code, HashedCode) else TFreeHead(d_model, code, width)


def multi_hot(ids: torch.Tensor, offsets: torch.Tensor, v: int) -> torch.Tensor:
    """CSR rows (ids (M,), offsets (n + 1,)) -> dense {0, 1} targets (n, v)."""
    n = offsets.shape[0] - 1
    owner = torch.repeat_interleave(torch.arange(n, device=ids.device), offsets.diff())
    out = torch.zeros(n, v, device=ids.device)
    out[owner, ids] = 1.0
    return out


class ShuffleRandomHead(nn.Module):
    """Per-token 3-way logits: 0 intact, 1 shuffled, 2 replaced by a random token."""

    def __init__(self, d_model: int):
        super().__init__()
        self.proj = nn.Linear(d_model, 3)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.proj(h)  # (..., 3)


class NaiveBayesHead:
    """Naive Bayes over hashed (token, label) counts: a generative part whose score, times
    ``learner.nb_weight``, the learner adds to the label logits.

    The model then learns on top of it (its loss sees the sum), so the discriminative
    part corrects what the counts get wrong. Counts are what a one-pass stream estimates
    best early: Naive Bayes beats an online linear model on a few thousand records (Ng &
    Jordan 2002); Wang & Manning's NBSVM (2012) puts the two together the same way.

    The score of label c is its one-vs-rest log-count ratio (NBSVM's r, summed over the
    record's tokens t that were counted before, under any label, with repeats) plus the
    label's log prior:

        s_c(x) = log((docs_c + 1) / (docs + n)) + sum_{t: n_t > 0} [log q_c(t) - log q_-c(t)]
        q_c(t) = (n_tc + a) / (N_c + a V),   q_-c(t) = (n_t - n_tc + a) / (N - N_c + a V)

    (n_tc: count of t under c, n_t its count under every label, N_c: tokens under c, a =
    ``learner.nb_alpha``). The first term is multinomial NB; the second, complement NB
    (Rennie et al. 2003). Both together scored above either alone on AG News
    (docs/choosing-a-configuration.md). A token never counted carries no evidence, but its
    smoothed ratio would not be zero: a / (N_c + a V) is larger for the label with fewer
    tokens, so unseen words would push a short message toward the smaller class (on SMS,
    "645" or "G.W.R" toward spam). It is left out, as a batch classifier's vocabulary
    leaves out words its training set never had.

    One float32 table ``counts`` of ``cells`` cells, kept as a row table of 64-cell rows
    (``"nb.counts"``) so checkpoints write only the rows a batch changed:

    - cells [0, L): records per label; [L, 2L): tokens per label (L = max_labels);
      cell 2L: distinct (token, label) cells in use, standing in for the vocabulary
      size V (it counts a token once per label it was seen with);
    - cells from ``base`` = 2L + 1 on: the count of (token u, label c) at
      ``base + (u + c * STRIDE) % span``, u the token's xxhash into [0, span). Two pairs
      share a cell with probability about pairs / span (hashing, as everywhere else).

    Counts are learned by counting (weighted by the record weight), never by gradient.
    """

    ROW = NB_ROW  # learner.nb_cells is checked in whole rows of this many cells
    STRIDE = 1_000_003  # a prime: label c's cells are token u's cells shifted by c * STRIDE

    def __init__(self, cells: int, max_labels: int, alpha: float, skip_unseen: bool = True):
        self.max_labels, self.alpha = max_labels, alpha
        # learner.nb_skip_unseen: the length term counts only the tokens counted before (the
        # class docstring); False: every token, as a state stored before 2026-11-27
        self.skip_unseen = skip_unseen
        self.base = 2 * max_labels + 1
        self.span = self.span_of(cells, max_labels)
        self.counts = torch.zeros(cells // self.ROW, self.ROW)  # (rows, 64): the stored table
        self.flat = self.counts.numpy().reshape(-1)  # (cells,): a view, so in-place changes of counts show
        self._pairs = self.flat[self.base:]  # (span,): the (token, label) cells, a view
        self.shift = (np.arange(max_labels, dtype=np.int64) * self.STRIDE) % self.span  # label c's shift, mod span
        self._added = np.zeros(self.span, dtype=bool)  # scratch of _scores_in_order, all False between calls
        # learn and the scores compiled (a WhenLoaded streamlearn.compiled.CompiledNaiveBayes:
        # the task sets it where learner.compiled is on); None, or until loaded: the numpy below
        self.compiled = None

    # The arithmetic is numpy on the CPU: a batch reads and adds a few hundred cells,
    # where each torch op's dispatch costs more than its work. Profile at batch 16 (SMS):
    # 0.9 ms a step for scores + learn as torch ops, 0.2 ms here; float32 logs (3x
    # faster than float64 at this size) and sort-based distinct values (np.unique is 3x
    # slower on a few hundred ints) are most of the difference.

    @staticmethod
    def span_of(cells: int, max_labels: int) -> int:
        """The range [0, span) of token ids for ``cells`` cells and ``max_labels`` labels
        (the ingest stage hashes tokens into it: ``ClassifyPreparer.nb_tokens``)."""
        return cells - (2 * max_labels + 1)

    def _pair(self, tokens: np.ndarray, labels: np.ndarray) -> np.ndarray:
        """(token, label) cells relative to ``base``: (u + c * STRIDE) % span."""
        return (tokens + self.shift[labels]) % self.span

    def _cells(self, tokens: np.ndarray, labels: np.ndarray) -> np.ndarray:
        return self.base + self._pair(tokens, labels)

    def scores(self, tokens: np.ndarray, n_labels: int) -> np.ndarray:
        """tokens (N, T) in [0, span) (-1: padding) -> s_c(x) of the class docstring, (N, n_labels) float32."""
        if self.compiled is not None and (fast := self.compiled()) is not None:
            return fast.scores(tokens, n_labels)
        valid = tokens >= 0  # (N, T)
        n_tc = self._pairs[(tokens[valid][:, None] + self.shift[:n_labels]) % self.span]  # (M, n_labels)
        n_t = n_tc.sum(-1, keepdims=True)  # (M, 1) the token's count under every label
        rest = n_t - n_tc  # the token's count under the other labels
        seen = np.zeros(valid.shape, dtype=np.float32)  # (N, T): 1 where the token was counted before
        seen[valid] = self._scored(n_t[:, 0])
        # The logs only at valid tokens (a third of the padded cells on news text), summed
        # over the padded cube as before: the same float sums, so the same trajectories.
        ratio = np.zeros(valid.shape + (n_labels,), dtype=np.float32)  # (N, T, n_labels)
        ratio[valid] = np.log(n_tc + np.float32(self.alpha)) - np.log(rest + np.float32(self.alpha))
        L, a = self.max_labels, self.alpha
        docs, totals = self.flat[:n_labels].astype(np.float64), self.flat[L:L + n_labels].astype(np.float64)
        aV = a * max(float(self.flat[2 * L]), 1.0)
        length = seen.sum(1, keepdims=True)  # (N, 1): the tokens counted before (the class docstring)
        norm = np.log((totals.sum() - totals + aV) / (totals + aV))  # (n_labels,)
        prior = np.log((docs + 1.0) / (docs.sum() + n_labels))
        return (np.einsum("ntc,nt->nc", ratio, valid.astype(np.float32)) + length * norm + prior).astype(np.float32)

    def scores_in_order(self, tokens: np.ndarray, labels: np.ndarray, weight: np.ndarray,
                        n_labels: int) -> np.ndarray:
        """(N, n_labels) float32: row i is :meth:`scores` of record i as if records 0..i-1
        of the batch (tokens (N, T), labels (N,), weight (N,)) had been learned one by one
        before it; counts nothing (:meth:`learn` the batch after). Without a loop over
        records: each count a record reads is the count before the batch plus what the
        earlier records add to its cell (a sorted search by (cell, record)). Weights that
        are not finite (a batch tampered with after validation) give scores that are not
        either, without a warning: the step that reads them is skipped for its loss."""
        if self.compiled is not None and (fast := self.compiled()) is not None:
            return fast.scores_in_order(tokens, labels, weight, n_labels)
        with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
            return self._scores_in_order(tokens, labels, weight, n_labels)

    def _scores_in_order(self, tokens: np.ndarray, labels: np.ndarray, weight: np.ndarray,
                         n_labels: int) -> np.ndarray:
        # One pass per array where the first version made several (a key array built
        # twice, an argsort then a gather, a bincount per label, np.unique): the same
        # values in the same order of summation, about 0.6x the time at batch 8.
        N = len(labels)
        valid = tokens >= 0
        rec = valid.nonzero()[0]  # (M,) the record of each token, ascending
        u, w = tokens[valid], weight.astype(np.float32)
        keys = np.sort(self._pair(u, labels[rec]) * N + rec)  # (M,) (cell added, record), ascending
        by = keys % N  # the record of each sorted key
        cum = np.zeros(len(keys) + 1)
        np.cumsum(w[by], dtype=np.float64, out=cum[1:])
        q = (u[:, None] + self.shift[:n_labels]) % self.span  # (M, n_labels) the cells each token reads
        n_tc = self._pairs[q]  # (M, n_labels) the counts before the batch
        # Only the cells the batch adds to can differ (about a quarter of those read):
        # marked in a scratch bitmap, so the sorted search runs on those alone.
        self._added[keys // N] = True
        hit = self._added[q]  # (M, n_labels)
        self._added[keys // N] = False
        qh, rh = q[hit] * N, np.broadcast_to(rec[:, None], q.shape)[hit]
        lo, hi = np.searchsorted(keys, np.stack([qh, qh + rh]))
        n_tc[hit] += (cum[hi] - cum[lo]).astype(np.float32)
        n_t = n_tc.sum(-1, keepdims=True)  # (M, 1)
        rest = n_t - n_tc
        a = np.float32(self.alpha)
        ratio = np.log(n_tc + a) - np.log(rest + a)  # (M, n_labels)
        at = (rec[:, None] * n_labels + np.arange(n_labels)).reshape(-1)
        summed = np.bincount(at, ratio.reshape(-1), N * n_labels).reshape(N, n_labels)
        length = valid.sum(1)  # (N,) what a record adds to its label's token total
        seen = np.bincount(rec[self._scored(n_t[:, 0])], minlength=N)  # (N,) its tokens counted before it
        before = lambda x: np.cumsum(x, 0) - x  # noqa: E731  what the records before each add
        onehot = np.zeros((N, n_labels))
        onehot[np.arange(N), labels] = 1.0
        L = self.max_labels
        docs = self.flat[:n_labels].astype(np.float64) + before(onehot * w[:, None])  # (N, n_labels)
        totals = self.flat[L:L + n_labels].astype(np.float64) + before(onehot * (w * length)[:, None])
        aV = self.alpha * np.maximum(float(self.flat[2 * L]) + before(self._fresh(keys, by, w, N)), 1.0)[:, None]
        norm = np.log((totals.sum(1, keepdims=True) - totals + aV) / (totals + aV))
        prior = np.log((docs + 1.0) / (docs.sum(1, keepdims=True) + n_labels))
        return (summed + seen[:, None] * norm + prior).astype(np.float32)

    def _scored(self, n_t: np.ndarray) -> np.ndarray:
        """Where a token with ``n_t`` counts under every label enters the length term: where
        it was counted before (the class docstring), or everywhere (``skip_unseen`` off)."""
        return n_t > 0 if self.skip_unseen else np.ones(n_t.shape, dtype=bool)

    def _fresh(self, keys: np.ndarray, by: np.ndarray, w: np.ndarray, N: int) -> np.ndarray:
        """(N,) the (token, label) cells each record would put in use (:meth:`learn`'s
        stand-in for V): zero before the batch, weighted, first met at that record.
        ``keys`` (M,): cell * N + record, ascending; ``by``: their records."""
        live = w[by] > 0
        keys, by = keys[live], by[live]
        cells = keys // N
        first = np.ones(len(cells), dtype=bool)  # the earliest record of each cell
        np.not_equal(cells[1:], cells[:-1], out=first[1:])
        fresh = first & (self._pairs[cells] == 0)
        return np.bincount(by[fresh], minlength=N).astype(np.float64)

    def token_terms(self, tokens: np.ndarray, n_labels: int) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`scores` split into what each token adds and what does not depend on the
        tokens: ``(terms (N, T, n_labels), prior (n_labels,))``, terms zero at padding, with
        ``terms.sum(1) + prior`` equal to the scores (up to float32 rounding). A token adds
        its log-count ratio and its share of the length term: s_c(x) is linear in the tokens."""
        valid = tokens >= 0  # (N, T)
        n_tc = self.flat[self._cells(np.maximum(tokens, 0)[..., None], np.arange(n_labels))]  # (N, T, n_labels)
        n_t = n_tc.sum(-1, keepdims=True)  # (N, T, 1)
        rest = n_t - n_tc
        ratio = np.log(n_tc + np.float32(self.alpha)) - np.log(rest + np.float32(self.alpha))
        L, a = self.max_labels, self.alpha
        docs, totals = self.flat[:n_labels].astype(np.float64), self.flat[L:L + n_labels].astype(np.float64)
        aV = a * max(float(self.flat[2 * L]), 1.0)
        norm = np.log((totals.sum() - totals + aV) / (totals + aV))  # (n_labels,)
        prior = np.log((docs + 1.0) / (docs.sum() + n_labels))
        seen = valid & self._scored(n_t[..., 0])  # (N, T): counted before (the class docstring)
        terms = ratio * valid[..., None] + norm.astype(np.float32) * seen[..., None]
        return terms.astype(np.float32), prior.astype(np.float32)

    def rows_read(self, tokens: np.ndarray, n_labels: int) -> np.ndarray:
        """The rows of ``counts`` that :meth:`scores` reads for these tokens (N, T): what a
        reader that loads rows lazily (a snapshot) must have current."""
        cells = self._cells(tokens[tokens >= 0][:, None], np.arange(n_labels)).reshape(-1)
        header = np.arange(2 * self.max_labels // self.ROW + 1)  # the rows of cells [0, 2L]
        return distinct(np.concatenate([header, cells // self.ROW]))

    def learn(self, tokens: np.ndarray, labels: np.ndarray, weight: np.ndarray) -> np.ndarray:
        """Count a batch (tokens (N, T), labels (N,), weight (N,)); return the changed row ids."""
        if self.compiled is not None and (fast := self.compiled()) is not None:
            return fast.learn(tokens, labels, weight)
        valid = tokens >= 0
        rows = valid.nonzero()[0]  # (M,) the record of each token
        cells = self._cells(tokens[valid], labels[rows])  # (M,)
        w = weight.astype(self.flat.dtype)
        fresh = len(distinct(cells[(self.flat[cells] == 0) & (w[rows] > 0)]))
        L = self.max_labels
        at = np.concatenate([cells, labels, L + labels])  # pair cells, records per label, tokens per label
        add = np.concatenate([w[rows], w, w * valid.sum(1).astype(w.dtype)])
        torch.from_numpy(self.flat).index_add_(0, torch.from_numpy(at), torch.from_numpy(add))  # sums repeats
        self.flat[2 * L] += fresh
        return distinct(np.append(at, 2 * L) // self.ROW)
