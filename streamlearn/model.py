"""The hashed transformer: any embedding scheme -> L transformer layers -> one task head.

    tokens --featurize--> feats --embedding--> (N, T, e) --proj--> (N, T, d)
           --[MASK] slots, positions--> L pre-LN encoder layers --> (N, T, d) --> head

``model.layers = 0`` skips the encoder: a bag of hashed embeddings whose pooled sum
feeds a linear head (fastText). Position embeddings are off by default: Superbloom
treats its input as a set. The head is the task's (:mod:`streamlearn.tasks`): the model
builds it after its own layers (so dense weights draw from the seeded RNG in a fixed
order) and never asks which task it serves; the task reads the states out (pooled,
at masked positions, ...) and applies its head. ``learner.shuffle_random > 0`` adds
HashFormers' per-token Shuffle+Random head.

>>> from streamlearn.config import Config
>>> from streamlearn.embeddings import build_embedding
>>> cfg = Config().override("model.layers=2", "embedding.K=1000", "embedding.B=100")
>>> featurizer, embedding = build_embedding(cfg.embedding, cfg.hashing.seed)
>>> model = HashedTransformer(cfg, embedding, lambda: None)
>>> feats = to_tensors(featurizer.featurize([["a", "b"], ["c"]], max_len=8))
>>> tuple(model.encode(feats).shape), tuple(model.pool(model.encode(feats), feats["mask"]).shape)
((2, 2, 64), (2, 64))
"""
from __future__ import annotations

from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from .config import Config, ModelConfig
from .embeddings import TokenEmbedding, to_tensors
from .embeddings.base import Bag
from .featurize import ngram_groups
from .heads import ShuffleRandomHead

__all__ = ["Encoder", "HashedTransformer", "PooledStates", "to_tensors"]


class Encoder(nn.Module):
    """(N, T, e) token vectors -> (N, T, d) states: projection, [MASK] slots, optional
    positions, L pre-LN transformer layers (pre-LN: stable at the constant learning
    rates online training uses, no warm-up schedule to restart after a resume)."""

    def __init__(self, cfg: ModelConfig, in_dim: int, max_len: int):
        super().__init__()
        d = cfg.d_model
        self.proj = nn.Linear(in_dim, d) if in_dim != d else nn.Identity()
        self.mask_vec = nn.Parameter(torch.randn(d) * 0.02)  # the learned [MASK] input
        self.pos = nn.Embedding(max_len, d) if cfg.positions else None
        self.layers = None
        if cfg.layers > 0:
            layer = nn.TransformerEncoderLayer(
                d, cfg.heads, cfg.ffn, cfg.dropout, activation="gelu", batch_first=True, norm_first=True
            )
            self.layers = nn.TransformerEncoder(layer, cfg.layers, norm=nn.LayerNorm(d), enable_nested_tensor=False)

    def forward(self, x: torch.Tensor, mask: torch.Tensor, slots: torch.Tensor | None = None,
                causal: bool = False) -> torch.Tensor:
        """x (N, T, e), mask (N, T) valid tokens, slots (N, T) positions whose input is
        replaced by the [MASK] vector -> (N, T, d). ``causal``: position t attends to
        positions <= t only (a language model's states)."""
        h = self.proj(x)  # (N, T, d)
        if slots is not None:
            h = torch.where(slots.unsqueeze(-1), self.mask_vec.to(h.dtype), h)
        if self.pos is not None:
            h = h + self.pos.weight[: h.shape[1]]
        if self.layers is None:
            return h
        # Padding only ever follows a record's tokens, so under the causal mask no token
        # attends to a padded position: the padding mask changes no token's state. Without it
        # attention takes the fused causal kernel instead of a merged (N * heads, T, T) mask;
        # the tokens' states are the same floats and every gradient the same to rounding
        # (tests/test_model.py), and a next-token layer's forward and backward cost about a
        # tenth less.
        attend = None
        if not causal:
            attend = mask.clone()
            attend[:, 0] = True  # a row with no tokens would make attention NaN; its output is unused
            attend = attend[:, None, None, :]  # (N, 1, 1, T): every head and query
        for layer in self.layers.layers:
            h = _pre_ln_layer(layer, h, causal, attend)
        norm = self.layers.norm
        return F.layer_norm(h, norm.normalized_shape, norm.weight, norm.bias, norm.eps)  # (N, T, d)


def _pre_ln_layer(layer: nn.TransformerEncoderLayer, h: torch.Tensor, causal: bool,
                  attend: torch.Tensor | None) -> torch.Tensor:
    """torch's pre-LN ``TransformerEncoderLayer`` (GELU) over its own weights, in functional
    ops: its module path (argument checks, the fast-path tests, a batch-first input turned
    sequence-first and back) cost about 2% of a next-token step (an in-process A/B: 1.02x),
    and the checkpoint keeps the module's parameter names. Training states are bit for bit
    the module's (tests/test_model.py). ``attend`` (N, 1, 1, T): the keys each record's
    queries may read; None with ``causal``."""
    att, (n, t, d) = layer.self_attn, h.shape
    p = layer.dropout.p if layer.training else 0.0

    def drop(x: torch.Tensor) -> torch.Tensor:
        return F.dropout(x, p) if p else x

    x = F.layer_norm(h, (d,), layer.norm1.weight, layer.norm1.bias, layer.norm1.eps)
    qkv = F.linear(x, att.in_proj_weight, att.in_proj_bias).view(n, t, 3, att.num_heads, d // att.num_heads)
    q, k, v = qkv.permute(2, 0, 3, 1, 4)  # each (N, heads, T, d / heads)
    a = F.scaled_dot_product_attention(q, k, v, attn_mask=attend, dropout_p=att.dropout if layer.training else 0.0,
                                       is_causal=causal)  # (N, heads, T, d / heads)
    h = h + drop(F.linear(a.transpose(1, 2).reshape(n, t, d), att.out_proj.weight, att.out_proj.bias))
    x = F.layer_norm(h, (d,), layer.norm2.weight, layer.norm2.bias, layer.norm2.eps)
    x = drop(F.gelu(F.linear(x, layer.linear1.weight, layer.linear1.bias)))
    return h + drop(F.linear(x, layer.linear2.weight, layer.linear2.bias))


class HashedTransformer(nn.Module):
    """Embedding + encoder + the head ``make_head()`` builds (None: no head, e.g. a bare
    encoder in a test).

    Build it under a seeded RNG (the learner does) for reproducible dense weights; the
    embedding tables derive their init from ``cfg.hashing.seed`` themselves.
    """

    def __init__(self, cfg: Config, embedding: TokenEmbedding, make_head: Callable[[], nn.Module | None]):
        super().__init__()
        self.embedding = embedding
        self.encoder = Encoder(cfg.model, embedding.out_dim, cfg.hashing.max_tokens)
        self.head = make_head()
        self.sr_head = ShuffleRandomHead(cfg.model.d_model) if cfg.learner.shuffle_random > 0 else None

    @property
    def depth(self) -> int:
        """Transformer layers (0: a bag of embeddings)."""
        return 0 if self.encoder.layers is None else len(self.encoder.layers.layers)

    def encode(self, feats: dict[str, torch.Tensor], slots: torch.Tensor | None = None,
               causal: bool = False) -> torch.Tensor:
        """Final states (N, T, d) of a featurized batch (``causal``: see :class:`Encoder`).
        A position's input is its token's vector plus, with ``model.input_ngrams`` (features
        from :func:`~streamlearn.featurize.add_ngram_inputs`), the vectors of the word
        n-grams ending at it, read from the same tables (hash embeddings: an open vocabulary
        of strings, so an n-gram is one more string)."""
        x = self.embedding(feats)  # (N, T, e)
        for group in ngram_groups(feats):
            x = x + self.embedding(group)
        return self.encoder(x, feats["mask"], slots, causal)

    @staticmethod
    def pool(h: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Masked sum over the n valid positions divided by sqrt(n) (TensorFlow's "sqrtn"
        combiner): (N, T, d) -> (N, d); zero for empty rows.

        Not a mean: a mean gives each token 1/n of the vote, so a long text is no surer
        than a short one and each token's gradient shrinks as 1/n. Prequential accuracy
        at depth 0 (docs/choosing-a-configuration.md): AG News 0.840 against 0.824 with
        the mean, SMS 0.976 against 0.973; MovieLens recall unchanged.
        """
        w = mask.to(h.dtype).unsqueeze(-1)  # (N, T, 1)
        return (h * w).sum(1) / w.sum(1).clamp_min(1.0).sqrt()

    def bag(self, feats: dict[str, np.ndarray]) -> Bag | None:
        """``pool(encode(feats), mask)`` with its gradient in closed form, from the numpy
        features: a :class:`~streamlearn.embeddings.base.Bag` whose ``x`` (N, d) is the
        pooled states and whose backward puts the tables' gradients in place. Only where
        the pooled states are linear in the token vectors: depth 0, no projection, no
        positions, and a scheme that offers a bag; None otherwise (use autograd)."""
        return self.pooled(feats).bag if self.has_bag else None

    @property
    def has_bag(self) -> bool:
        """Whether :meth:`bag` gives a closed form (False: it returns None)."""
        return self.encoder.pos is None and self.pools_in_closed_form

    @property
    def pools_in_closed_form(self) -> bool:
        """Whether :meth:`pooled` gives a closed form: depth 0, no projection, a scheme
        that offers a bag (positions allowed)."""
        enc = self.encoder
        return enc.layers is None and isinstance(enc.proj, nn.Identity) and self.embedding.has_bag

    def pooled(self, feats: dict[str, np.ndarray]) -> "PooledStates":
        """``pool(encode(feats, slots), feats["mask"])`` at depth 0 in closed form, for
        any slots outside the mask (they are pooled over by no one), positions included
        (:class:`PooledStates`). Needs :attr:`pools_in_closed_form`."""
        return PooledStates(self, feats)

    def row_tables(self) -> dict[str, nn.Parameter]:
        """The tables updated row-wise (sparse gradients), by name: the embedding's and the
        head's own (a sampled-softmax head's output rows)."""
        head = self.head.row_tables() if self.head is not None else {}
        return {**self.embedding.row_tables(), **head}

    def dense_parameters(self) -> dict[str, nn.Parameter]:
        """Every parameter that is not a row table, by its state_dict name."""
        rows = {id(p) for p in self.row_tables().values()}
        return {n: p for n, p in self.named_parameters() if id(p) not in rows}


class PooledStates:
    """A depth-0 model's pooled states ``x`` (N, d) of a featurized batch and their
    gradients given dL/dx, without autograd: the tokens' bag (the embedding's
    :class:`~streamlearn.embeddings.base.Bag`, weighted 1/sqrt(n) as :meth:`HashedTransformer.pool`)
    plus, with positions, ``c @ pos[:T]``, c (N, T) the same weights at the valid cells.

    The [MASK] vector replaces inputs at slots, which the mask leaves out of the pool,
    so its gradient is zero: it is handed on as zero, as autograd leaves it (AdamW's
    step count for it advances alike)."""

    def __init__(self, model: HashedTransformer, feats: dict[str, np.ndarray]):
        mask = feats["mask"]
        a = (1.0 / np.sqrt(np.maximum(mask.sum(1), 1))).astype(np.float32)  # (N,)
        self.bag = model.embedding.bag(feats, a)
        self.encoder = enc = model.encoder
        self.x = self.bag.x
        self.coef = None
        if enc.pos is not None:
            self.coef = torch.from_numpy(mask * a[:, None])  # (N, T) float32
            self.x = self.x + self.coef @ enc.pos.weight.detach()[:mask.shape[1]]

    def tables(self) -> dict[str, nn.Parameter]:
        return self.bag.tables()

    def row_gradients(self, grad: torch.Tensor) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        """dL/d(table) per row table, coalesced (:meth:`Bag.row_gradients <streamlearn.embeddings.base.Bag.row_gradients>`)."""
        return self.bag.row_gradients(grad)

    def dense_gradients(self, grad: torch.Tensor) -> tuple[tuple[nn.Parameter, torch.Tensor], ...]:
        """(parameter, full-size gradient) of the positions (with them) and the [MASK]
        vector, from dL/dx (N, d)."""
        enc = self.encoder
        out = [(enc.mask_vec, torch.zeros_like(enc.mask_vec))]
        if self.coef is not None:
            g = torch.zeros_like(enc.pos.weight)
            g[:self.coef.shape[1]] = self.coef.t() @ grad  # (T, d)
            out.insert(0, (enc.pos.weight, g))
        return tuple(out)
