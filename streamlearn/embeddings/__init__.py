"""Every paper's token embedding behind one contract (:class:`TokenEmbedding`).

:func:`build_embedding` maps the flat :class:`~streamlearn.config.EmbeddingConfig` to the
scheme's own frozen config and returns its two halves: the numpy featurizer
(:mod:`streamlearn.featurize`; a data thread runs it) and the torch module. The learner
calls ``featurizer.featurize``, :func:`to_tensors`, then the module; a row-wise optimizer
updates the rows of ``featurizer.rows_touched`` in the tables of ``module.row_tables()``.

>>> from streamlearn.config import EmbeddingConfig
>>> featurizer, emb = build_embedding(EmbeddingConfig(scheme="hash", d=8, K=1000, B=100), seed=0)
>>> out = emb(to_tensors(featurizer.featurize([["new", "tokens"], ["ok"]], max_len=16)))
>>> tuple(out.shape)
(2, 2, 8)
"""
from __future__ import annotations

from ..config import EmbeddingConfig
from ..featurize import (
    BloomEmbeddingConfig, Featurizer, HashEmbeddingConfig, HashFormerConfig, HashingTrickConfig,
    PlainEmbeddingConfig, TFreeEmbeddingConfig, scheme_config,
)
from .base import TokenEmbedding, to_tensors
from .bloom import BloomEmbedding
from .hash import HashEmbedding, HashingTrickEmbedding
from .hashformer import HashFormerEmbedding
from .plain import PlainEmbedding
from .tfree import TFreeEmbedding

__all__ = [
    "BloomEmbedding",
    "BloomEmbeddingConfig",
    "HashEmbedding",
    "HashEmbeddingConfig",
    "HashingTrickConfig",
    "HashingTrickEmbedding",
    "HashFormerConfig",
    "HashFormerEmbedding",
    "PlainEmbedding",
    "PlainEmbeddingConfig",
    "TFreeEmbedding",
    "TFreeEmbeddingConfig",
    "TokenEmbedding",
    "build_embedding",
    "to_tensors",
]

MODULES: dict[type, type[TokenEmbedding]] = {
    HashEmbeddingConfig: HashEmbedding,
    HashingTrickConfig: HashingTrickEmbedding,
    BloomEmbeddingConfig: BloomEmbedding,
    HashFormerConfig: HashFormerEmbedding,
    TFreeEmbeddingConfig: TFreeEmbedding,
    PlainEmbeddingConfig: PlainEmbedding,
}


def build_embedding(cfg: EmbeddingConfig, seed: int) -> tuple[Featurizer, TokenEmbedding]:
    """``(featurizer, module)`` of ``cfg.scheme``. ``seed`` (pass ``Config.hashing.seed``)
    derives every hash function and every table init, so two processes given the same
    config build identical halves."""
    scheme = scheme_config(cfg, seed)
    module = MODULES[type(scheme)](scheme)
    return module.featurizer, module
