"""The contract every embedding scheme keeps, and the torch helpers they share.

A scheme turns a batch of token lists into token vectors in two steps:

1. its :class:`~streamlearn.featurize.Featurizer` (numpy only, runs in a data thread;
   ``TokenEmbedding.featurizer``): hash the tokens into integer arrays, padded to
   (N, T) with a boolean ``mask``;
2. :meth:`TokenEmbedding.forward` (torch): look the ids up and return (N, T, out_dim),
   exactly zero at padding. Only valid positions are computed (they are gathered with
   the mask, embedded, and scattered back), so padding never touches a table row and
   never receives gradient.

Every table lookup uses sparse gradients, so a row-wise optimizer can update just
the rows of ``featurizer.rows_touched``.

A scheme may also offer :meth:`TokenEmbedding.bag`: the weighted sum of each record's
token vectors with its gradient in closed form (a :class:`Bag`), which the depth-0 model
uses instead of autograd (:meth:`~streamlearn.model.HashedTransformer.bag`).
"""
from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ..featurize import E_STD, Featurizer, featurizer_for
from ..hashing import derive_seed

TensorFeats = dict[str, torch.Tensor]


def choose_sparse_checks() -> None:
    """Say explicitly that sparse tensors are not checked, unless the program turned the
    checks on. Every sparse gradient here is built well-formed and says so
    (``check_invariants=False``), yet torch 2.11's CUDA build warned at each backward pass
    (seen on an H100, bench/gpu.sh) while the process-wide choice was left unset."""
    if not torch.sparse.check_sparse_tensor_invariants.is_enabled():
        torch.sparse.check_sparse_tensor_invariants.disable()


choose_sparse_checks()  # once, as the module that builds the sparse gradients loads


class TokenEmbedding(nn.Module):
    """Base class of every scheme: tokens -> (N, T, out_dim) vectors, zero at padding.
    ``featurizer`` is the scheme's numpy half, built from the same scheme config."""

    out_dim: int
    featurizer: Featurizer

    def forward(self, feats: TensorFeats) -> torch.Tensor:
        """(N, T, out_dim) token vectors, exactly zero where ``mask`` is False."""
        raise NotImplementedError

    def row_tables(self) -> dict[str, nn.Parameter]:
        """The tables updated row-wise (they receive sparse gradients), by name."""
        raise NotImplementedError

    def importance(self, feats: TensorFeats) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Each token's learned importance weights over the component rows it picks and
        those rows' ids: ``(weights (N, T, k), rows (N, T, k))``; None for a scheme that
        learns no such weights."""
        return None

    @property
    def has_bag(self) -> bool:
        """Whether :meth:`bag` gives a closed form (False: it returns None)."""
        return False

    def bag(self, feats: dict[str, np.ndarray], weight: np.ndarray) -> "Bag | None":
        """The weighted sum of each record's token vectors, ``x_n = sum_t weight[n] *
        e(t)`` over the valid tokens t of record n, as a :class:`Bag` whose backward is
        closed-form; ``feats`` the featurizer's numpy arrays, ``weight`` (N,) float32.
        None: this scheme has none (its callers use autograd)."""
        return None


class OneTableEmbedding(TokenEmbedding):
    """A scheme whose only weights are one row table ``E`` (rows, ``cfg.d``) drawn from
    N(0, E_STD^2) under ``cfg.seed``: Bloom, the hashing trick, T-Free and the plain
    dictionary. Each subclass says how many rows and how its features pick them."""

    def __init__(self, cfg, rows: int):
        super().__init__()
        self.cfg = cfg
        self.out_dim = cfg.d
        self.featurizer = featurizer_for(cfg)
        self.E = normal_table(rows, cfg.d, 0.0, E_STD, cfg.seed, "E")  # (rows, d)

    def row_tables(self) -> dict[str, nn.Parameter]:
        return {"E": self.E}

    def lookup(self, feats: TensorFeats, ids: str) -> torch.Tensor:
        """(N, T, d): each valid token's row of ``E`` by its one id in ``feats[ids]`` (N, T),
        zero at padding (the hashing trick's bucket, the plain dictionary's row)."""
        mask = feats["mask"]  # (N, T)
        index = valid_index(mask)  # (M,)
        e = F.embedding(gather_valid(feats[ids], index), self.E, sparse=True)  # (M, d)
        return scatter_valid(e, index, mask)  # (N, T, d)


class Bag:
    """A batch's summed token vectors ``x`` (N, out_dim) and the gradient they pass on.

    :meth:`row_gradients` takes dL/dx and returns dL/d(table) per row table, already
    coalesced (unique ascending rows), so neither the row optimizer nor the gradient
    check sorts them again (:class:`~streamlearn.tasks.base.ClosedForm` carries them to
    the optimizers, or to ``.grad`` as autograd would leave them).
    """

    x: torch.Tensor

    def tables(self) -> dict[str, nn.Parameter]:
        """The row tables :meth:`row_gradients` names, by name."""
        raise NotImplementedError

    def row_gradients(self, grad: torch.Tensor) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        """dL/d(table) from ``grad`` = dL/dx (N, out_dim): per row table, its unique
        ascending rows (U,) int64 and their summed gradient rows (U, w)."""
        raise NotImplementedError


def add_sparse_grad(table: nn.Parameter, rows: torch.Tensor, values: torch.Tensor) -> None:
    """Add a gradient of ``values`` (n, w) at unique ascending ``rows`` (n,) to ``table.grad``."""
    grad = torch.sparse_coo_tensor(rows.unsqueeze(0), values, table.shape, is_coalesced=True,
                                   check_invariants=False)
    table.grad = grad if table.grad is None else table.grad + grad


class RowGroups:
    """The elements of a batch grouped by the table row each one hits (``ids`` (n,)
    int64): ``rows``, the distinct rows ascending, and the sums per row of anything
    indexed like the elements (:meth:`sums`).

    A sum is one ``embedding_bag`` call over the elements in row order (a stable sort
    in numpy): sequential reads and one write per row. ``index_add_`` into a zeroed
    buffer, the obvious alternative, sorts its index again inside torch and cost about
    1.5x as much per step (AG News, batch 16)."""

    def __init__(self, ids: np.ndarray):
        order = np.argsort(ids, kind="stable")
        ranked = ids[order]
        first = np.empty(len(ranked), dtype=bool)
        first[:1] = True
        np.not_equal(ranked[1:], ranked[:-1], out=first[1:])
        self.rows = torch.from_numpy(ranked[first])  # (U,)
        self.order = torch.from_numpy(order)  # (n,)
        self.starts = torch.from_numpy(np.flatnonzero(first))  # (U,): where each row's elements begin in order

    def sums(self, source: torch.Tensor, index: torch.Tensor | None = None,
             weight: torch.Tensor | None = None) -> torch.Tensor:
        """(U, w): per row, the sum over its elements e of ``weight[e] * source[index[e]]``
        (``index`` None: element e is ``source[e]``; ``weight`` None: 1)."""
        at = self.order if index is None else index.index_select(0, self.order)
        scale = None if weight is None else weight.index_select(0, self.order)
        return F.embedding_bag(at, source, self.starts, mode="sum", per_sample_weights=scale)


def flat_valid(feats: dict[str, np.ndarray], name: str) -> np.ndarray:
    """Feature ``name`` (N, T, ...) at the valid cells of ``feats["mask"]``, row-major: (M, ...)."""
    return feats[name][feats["mask"]]


def to_tensors(feats: dict[str, np.ndarray], device: torch.device | str | None = None) -> TensorFeats:
    """numpy features -> torch tensors on ``device`` (dtypes kept; no copy on CPU)."""
    return {name: torch.from_numpy(np.ascontiguousarray(a)).to(device) for name, a in feats.items()}


# ---------------------------------------------------------------------------- forward helpers

def valid_index(mask: torch.Tensor) -> torch.Tensor:
    """Flat positions (M,) of the valid cells of ``mask`` (N, T), row-major: the order
    featurize lists the tokens in."""
    return mask.reshape(-1).nonzero().squeeze(1)


def gather_valid(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """(N, T, ...) -> (M, ...) at ``index`` (index_select: much cheaper than boolean
    indexing)."""
    return x.reshape(-1, *x.shape[2:]).index_select(0, index)


def scatter_valid(values: torch.Tensor, index: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Per-token vectors (M, D) -> (N, T, D) with zeros at padding; differentiable in
    ``values`` only, so padding cells carry no gradient anywhere. A batch without
    padding is a free reshape."""
    if index.numel() == mask.numel():
        return values.view(*mask.shape, values.shape[1])
    out = values.new_zeros(mask.numel(), values.shape[1]).index_copy(0, index, values)
    return out.view(*mask.shape, values.shape[1])


# ---------------------------------------------------------------------------- init helpers

def generator(seed: int, purpose: str) -> torch.Generator:
    """A torch generator for one table's init, derived from the config seed, so the
    same seed gives the same weights in every process."""
    return torch.Generator().manual_seed(derive_seed(seed, f"init/{purpose}") & (2**63 - 1))


def normal_table(rows: int, cols: int, mean: float, std: float, seed: int, purpose: str) -> nn.Parameter:
    """A (rows, cols) parameter drawn from N(mean, std^2); ``std`` is a standard deviation."""
    weight = torch.empty(rows, cols)
    nn.init.normal_(weight, mean=mean, std=std, generator=generator(seed, purpose))
    return nn.Parameter(weight)
