"""The contract every embedding scheme keeps, and the helpers they share.

A scheme turns a batch of token lists into token vectors in two steps:

1. :meth:`TokenEmbedding.featurize` (numpy only, runs in a data thread): hash the
   tokens into integer arrays, padded to (N, T) with a boolean ``mask``.
2. :meth:`TokenEmbedding.forward` (torch): look the ids up and return (N, T, out_dim),
   exactly zero at padding. Only valid positions are computed (they are gathered with
   the mask, embedded, and scattered back), so padding never touches a table row and
   never receives gradient.

Every table lookup uses sparse gradients, so a row-wise optimizer can update just
the rows of :meth:`TokenEmbedding.rows_touched`.

>>> flat, mask = flatten_batch([["a", "b", "c"], [], ["d"]], max_len=2)
>>> flat, mask.astype(int).tolist()
(['a', 'b', 'd'], [[1, 1], [0, 0], [1, 0]])
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import torch
from torch import nn

from ..exceptions import ConfigError, RecordError
from ..hashing import derive_seed

Feats = dict[str, np.ndarray]
TensorFeats = dict[str, torch.Tensor]


class TokenEmbedding(nn.Module):
    """Base class of every scheme: tokens -> (N, T, out_dim) vectors, zero at padding."""

    out_dim: int

    def featurize(self, token_lists: Sequence[Sequence[str]], max_len: int) -> Feats:
        """Hash a batch into numpy arrays. Always includes ``"mask"``: bool (N, T) with
        T = min(max_len, longest list), at least 1; longer lists are truncated to
        ``max_len``. The other keys are int64/uint8 arrays the scheme needs. A pure
        function of the tokens and the config (``PlainEmbedding`` documents its one
        exception), free of torch so it can run in a data thread."""
        raise NotImplementedError

    def forward(self, feats: TensorFeats) -> torch.Tensor:
        """(N, T, out_dim) token vectors, exactly zero where ``mask`` is False."""
        raise NotImplementedError

    def row_tables(self) -> dict[str, nn.Parameter]:
        """The tables updated row-wise (they receive sparse gradients), by name."""
        raise NotImplementedError

    def rows_touched(self, feats: Feats) -> dict[str, np.ndarray]:
        """Unique sorted int64 row ids per row table that ``forward(feats)`` reads;
        exactly the rows whose sparse gradient is present after backward."""
        raise NotImplementedError


def to_tensors(feats: Feats, device: torch.device | str | None = None) -> TensorFeats:
    """numpy features -> torch tensors on ``device`` (dtypes kept; no copy on CPU)."""
    return {name: torch.from_numpy(np.ascontiguousarray(a)).to(device) for name, a in feats.items()}


# ---------------------------------------------------------------------------- featurize helpers

def flatten_batch(token_lists: Sequence[Sequence[str]], max_len: int) -> tuple[list, np.ndarray]:
    """The batch's tokens in row-major order (each list cut to ``max_len``) and the
    (N, T) mask whose True cells, read row-major, are exactly those tokens."""
    if max_len < 1:
        raise ConfigError(f"max_len must be >= 1, got {max_len}")
    cut = [_token_list(tokens, i)[:max_len] for i, tokens in enumerate(token_lists)]
    lengths = np.fromiter(map(len, cut), dtype=np.int64, count=len(cut))
    T = max(1, int(lengths.max(initial=0)))
    mask = np.arange(T) < lengths[:, None]  # (N, T)
    return [t for tokens in cut for t in tokens], mask


def _token_list(tokens: Any, i: int) -> Sequence:
    # A bare string would be split into characters silently; a None would crash later.
    if isinstance(tokens, (str, bytes)) or not isinstance(tokens, Sequence):
        raise RecordError(
            f"token list {i} is a {type(tokens).__name__}; pass a list of str/int tokens per record"
        )
    return tokens


def guard_tokens(fn, *args):
    """Call a hashing function, turning a bad token type into a RecordError."""
    try:
        return fn(*args)
    except TypeError as exc:
        raise RecordError(f"tokens must be str or int: {exc}") from exc


def pad(values: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Place per-token ``values`` (M, ...) at the True cells of ``mask`` (N, T):
    (N, T, ...), zeros elsewhere."""
    out = np.zeros(mask.shape + values.shape[1:], dtype=values.dtype)
    out[mask] = values
    return out


def unique_rows(ids: np.ndarray) -> np.ndarray:
    """Sorted unique int64 row ids."""
    return np.unique(np.asarray(ids, dtype=np.int64).reshape(-1))


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

