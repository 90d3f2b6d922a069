"""The hashed transformer: any embedding scheme -> L transformer layers -> task heads.

    tokens --featurize--> feats --embedding--> (N, T, e) --proj--> (N, T, d)
           --[MASK] slots, positions--> L pre-LN encoder layers --> (N, T, d) --> heads

``model.layers = 0`` skips the encoder: a bag of hashed embeddings whose pooled sum
feeds a linear head (fastText). Position embeddings are off by default: Superbloom
treats its input as a set. Heads (see :mod:`streamlearn.heads`) depend on the task:

- ``classify``: the pooled final states (:meth:`HashedTransformer.pool`) -> :class:`~streamlearn.heads.LabelHead`.
- ``mlm``: the states at masked positions (depth 0: the pooled context) -> a hashed
  head (Superbloom) or, with ``model.output = "tfree"`` (the default for the tfree
  scheme), T-Free's head.
- ``next-item``: the pooled states of the key's history -> the same hashed head.
- ``learner.shuffle_random > 0`` adds HashFormers' per-token Shuffle+Random head.

A hashed head is tied to the input row table (``model.tie_output``) when the scheme
has one addressed by per-token hashes (hash, hashing-trick, bloom: Superbloom's
``eta_j = h_j``, ``E_O = E_I``; tfree: T-Free decodes against its own table). Tied,
the output space is the input's (``out_B``/``out_m`` are unused) and every step's
full softmax reaches every row of the table, so every row is rewritten each step.

>>> from streamlearn.config import Config
>>> cfg = Config().override("model.layers=2", "embedding.K=1000", "embedding.B=100")
>>> model = HashedTransformer(cfg)
>>> feats = to_tensors(model.embedding.featurize([["a", "b"], ["c"]], max_len=8))
>>> tuple(model.encode(feats).shape), tuple(model.classify(feats, n_labels=3).shape)
((2, 2, 64), (2, 3))
"""
from __future__ import annotations

import torch
from torch import nn

from .config import Config, ModelConfig
from .embeddings import TokenEmbedding, build_embedding, to_tensors
from .exceptions import ConfigError
from .heads import (
    HashedHead, LabelHead, OutputSpace, ShuffleRandomHead, TFreeHead, tfree_pattern_hasher, tfree_tie,
    tied_space, untied_space,
)

__all__ = ["Encoder", "HashedTransformer", "output_kind", "to_tensors"]

OUTPUTS = ("auto", "hashed", "tfree")


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

    def forward(self, x: torch.Tensor, mask: torch.Tensor, slots: torch.Tensor | None = None) -> torch.Tensor:
        """x (N, T, e), mask (N, T) valid tokens, slots (N, T) positions whose input is
        replaced by the [MASK] vector -> (N, T, d)."""
        h = self.proj(x)  # (N, T, d)
        if slots is not None:
            h = torch.where(slots.unsqueeze(-1), self.mask_vec.to(h.dtype), h)
        if self.pos is not None:
            h = h + self.pos.weight[: h.shape[1]]
        if self.layers is None:
            return h
        pad = ~mask
        pad[:, 0] = False  # a row with no tokens would make attention NaN; its output is unused
        return self.layers(h, src_key_padding_mask=pad)  # (N, T, d)


class HashedTransformer(nn.Module):
    """Embedding + encoder + the heads of ``cfg.learner.task``.

    Build it under a seeded RNG (the learner does) for reproducible dense weights; the
    embedding tables derive their init from ``cfg.hashing.seed`` themselves.
    """

    def __init__(self, cfg: Config):
        super().__init__()
        self.cfg = cfg
        self.embedding: TokenEmbedding = build_embedding(cfg.embedding, cfg.hashing.seed)
        self.encoder = Encoder(cfg.model, self.embedding.out_dim, cfg.hashing.max_tokens)
        d = cfg.model.d_model
        self.label_head = LabelHead(d, cfg.model.max_labels) if cfg.learner.task == "classify" else None
        self.space: OutputSpace | None = None
        self.hashed_head = self.tfree_head = None
        if cfg.learner.task != "classify":
            self._build_output(cfg)
        self.sr_head = ShuffleRandomHead(d) if cfg.learner.shuffle_random > 0 else None

    def _build_output(self, cfg: Config) -> None:
        d, tie = cfg.model.d_model, cfg.model.tie_output
        if output_kind(cfg) == "tfree":
            spec = tfree_tie(self.embedding) if tie else None
            m, v, seed = spec or (cfg.embedding.m, cfg.embedding.tfree_rows, cfg.hashing.seed)
            self.pattern_hasher = tfree_pattern_hasher(m, v, seed)
            self.tfree_tied = spec is not None
            self.tfree_head = TFreeHead(d, v, self.embedding.out_dim if spec else d, own_table=spec is None)
            return
        space = tied_space(self.embedding) if tie else None
        self.space = space or untied_space(cfg.model.out_m, cfg.model.out_B, d, cfg.hashing.seed)
        self.hashed_head = HashedHead(d, self.space)

    # ------------------------------------------------------------------ encoding

    def encode(self, feats: dict[str, torch.Tensor], slots: torch.Tensor | None = None) -> torch.Tensor:
        """Final states (N, T, d) of a featurized batch."""
        x = self.embedding(feats)  # (N, T, e)
        return self.encoder(x, feats["mask"], slots)

    def read_slots(self, feats: dict[str, torch.Tensor], slots: torch.Tensor, rows: torch.Tensor,
                   cols: torch.Tensor) -> torch.Tensor:
        """The states (n, d) an mlm head reads for the positions (rows[i], cols[i]).

        With layers, the final state there. At depth 0 nothing carries the context to a
        [MASK] slot, whose state is the [MASK] vector alone (every answer would be the
        same): there each position reads its record's pooled tokens outside the slots,
        as word2vec's CBOW does.
        """
        h = self.encode(feats, slots)  # (N, T, d)
        if self.encoder.layers is None:
            return self.pool(h, feats["mask"] & ~slots)[rows]  # (n, d)
        return h[rows, cols]  # (n, d)

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

    # ------------------------------------------------------------------ heads

    def classify(self, feats: dict[str, torch.Tensor], n_labels: int) -> torch.Tensor:
        """Label logits (N, n_labels)."""
        return self.label_head(self.pool(self.encode(feats), feats["mask"]), n_labels)

    def output_table(self) -> torch.Tensor:
        """The output head's table: the embedding's own parameter when tied."""
        head = self.hashed_head or self.tfree_head
        if head.table is not None:
            return head.table
        name = self.space.table if self.hashed_head is not None else "E"
        return self.embedding.row_tables()[name]

    @property
    def tied(self) -> bool:
        head = self.hashed_head or self.tfree_head
        return head is not None and head.table is None

    def output(self, x: torch.Tensor) -> torch.Tensor:
        """States (n, d) -> hashed logits (n, m, size) or T-Free logits (n, v)."""
        head = self.hashed_head or self.tfree_head
        return head(x, None if head.table is not None else self.output_table())

    def output_loss(self, logits: torch.Tensor, targets: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        head = self.hashed_head or self.tfree_head
        return head.loss(logits, targets, weight)

    def row_tables(self) -> dict[str, nn.Parameter]:
        return self.embedding.row_tables()

    def dense_parameters(self) -> dict[str, nn.Parameter]:
        """Every parameter that is not a row table, by its state_dict name."""
        rows = {id(p) for p in self.row_tables().values()}
        return {n: p for n, p in self.named_parameters() if id(p) not in rows}


def output_kind(cfg: Config) -> str:
    """"hashed" or "tfree": ``model.output``, with "auto" picking T-Free's head for the
    tfree scheme and Superbloom's hashed head otherwise."""
    if cfg.model.output == "auto":
        return "tfree" if cfg.embedding.scheme == "tfree" else "hashed"
    return cfg.model.output
