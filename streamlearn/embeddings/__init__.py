"""Every paper's token embedding behind one contract (:class:`TokenEmbedding`).

:func:`build_embedding` maps the flat :class:`~streamlearn.config.EmbeddingConfig` to
the scheme's own frozen config and module. The learner calls ``featurize`` in a data
thread, :func:`to_tensors`, then the module; a row-wise optimizer updates the rows of
``rows_touched`` in the tables of ``row_tables``.

>>> from streamlearn.config import EmbeddingConfig
>>> emb = build_embedding(EmbeddingConfig(scheme="hash", d=8, K=1000, B=100), seed=0)
>>> out = emb(to_tensors(emb.featurize([["new", "tokens"], ["ok"]], max_len=16)))
>>> tuple(out.shape)
(2, 2, 8)
"""
from __future__ import annotations

from typing import Callable

from ..config import EmbeddingConfig
from ..exceptions import ConfigError
from .base import TokenEmbedding, to_tensors
from .bloom import BloomEmbedding, BloomEmbeddingConfig
from .hash import HashEmbedding, HashEmbeddingConfig, HashingTrickConfig, HashingTrickEmbedding
from .hashformer import HashFormerConfig, HashFormerEmbedding
from .plain import PlainEmbedding, PlainEmbeddingConfig
from .tfree import TFreeEmbedding, TFreeEmbeddingConfig

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


def _hash(cfg: EmbeddingConfig, seed: int) -> TokenEmbedding:
    return HashEmbedding(HashEmbeddingConfig(
        K=cfg.K, B=cfg.B, d=cfg.d, k=cfg.k, append_p=cfg.append_p,
        combine=cfg.combine, init=cfg.init, seed=seed,
    ))


def _hashing_trick(cfg: EmbeddingConfig, seed: int) -> TokenEmbedding:
    return HashingTrickEmbedding(HashingTrickConfig(B=cfg.B, d=cfg.d, seed=seed))


def _bloom(cfg: EmbeddingConfig, seed: int) -> TokenEmbedding:
    return BloomEmbedding(BloomEmbeddingConfig(B=cfg.B, d=cfg.d, m=cfg.m, seed=seed))


def _hashformer(variant: str) -> Callable[[EmbeddingConfig, int], TokenEmbedding]:
    def build(cfg: EmbeddingConfig, seed: int) -> TokenEmbedding:
        return HashFormerEmbedding(HashFormerConfig(
            variant=variant, d=cfg.d, bits=cfg.hashformer_bits, pool_bits=cfg.hashformer_pool_bits,
            hash=cfg.hashformer_hash, seed=seed,
        ))
    return build


def _tfree(cfg: EmbeddingConfig, seed: int) -> TokenEmbedding:
    return TFreeEmbedding(TFreeEmbeddingConfig(v=cfg.tfree_rows, d=cfg.d, m=cfg.m, seed=seed))


def _plain(cfg: EmbeddingConfig, seed: int) -> TokenEmbedding:
    return PlainEmbedding(PlainEmbeddingConfig(vocab=cfg.plain_vocab, d=cfg.d, seed=seed))


_BUILDERS: dict[str, Callable[[EmbeddingConfig, int], TokenEmbedding]] = {
    "hash": _hash,
    "bloom": _bloom,
    "hashformer-pool": _hashformer("pool"),
    "hashformer-add": _hashformer("add"),
    "hashformer-proj": _hashformer("proj"),
    "tfree": _tfree,
    "hashing-trick": _hashing_trick,
    "plain": _plain,
}


def build_embedding(cfg: EmbeddingConfig, seed: int) -> TokenEmbedding:
    """The module for ``cfg.scheme``. ``seed`` (pass ``Config.hashing.seed``) derives
    every hash function and every table init, so two processes given the same config
    build identical modules."""
    try:
        builder = _BUILDERS[cfg.scheme]
    except KeyError:
        raise ConfigError(f"embedding.scheme={cfg.scheme!r}; choose one of {sorted(_BUILDERS)}") from None
    return builder(cfg, seed)
