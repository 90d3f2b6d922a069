"""Tokens -> feature arrays: the numpy half of every embedding scheme. No torch here.

Each scheme is two objects built from one frozen scheme config:

- a :class:`Featurizer` (this module): hashes a batch of token lists into padded
  integer arrays with a boolean ``mask`` (N, T), names the rows each table will be read
  at, and says which output space a tied head may share. It is numpy and xxhash only and
  picklable, so ingest can run in another thread or process;
- a ``TokenEmbedding`` module (:mod:`streamlearn.embeddings`): looks the arrays up in its
  tables and returns (N, T, out_dim) vectors.

:func:`build_featurizer` builds the featurizer of an :class:`~streamlearn.config.EmbeddingConfig`
without importing torch; :func:`streamlearn.embeddings.build_embedding` returns the same
featurizer beside its module.

>>> from streamlearn.config import EmbeddingConfig
>>> f = build_featurizer(EmbeddingConfig(scheme="hash", K=100, B=10, d=4), seed=0)
>>> feats = f.featurize([["a", "b"], ["c"]], max_len=8)
>>> sorted(feats), feats["buckets"].shape, feats["mask"].tolist()
(['buckets', 'd1', 'mask'], (2, 2, 2), [[True, True], [True, False]])
>>> flat, mask = flatten_batch([["a", "b", "c"], [], ["d"]], max_len=2)
>>> flat, mask.astype(int).tolist()
(['a', 'b', 'd'], [[1, 1], [0, 0], [1, 0]])
"""
from __future__ import annotations

import math
import threading
from dataclasses import dataclass
from functools import partial
from typing import Any, Callable, Sequence

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from .config import EmbeddingConfig
from .exceptions import ConfigError, RecordError, StreamlearnError
from .hashing import TokenHasher, canonical_id, derive_seed, hash64, multi_hash, tfree_hashes, token_bits

__all__ = [
    "BloomEmbeddingConfig", "Featurizer", "HashEmbeddingConfig", "HashFormerConfig", "HashedSpace",
    "HashingTrickConfig", "PatternSpace", "PlainEmbeddingConfig", "TFreeEmbeddingConfig", "add_ngram_inputs",
    "build_featurizer", "flatten_batch", "input_ngrams", "input_rows", "ngram_groups", "scheme_config",
]

Feats = dict[str, np.ndarray]


# ---------------------------------------------------------------------------- helpers

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


# ---------------------------------------------------------------------------- output spaces

@dataclass(frozen=True)
class HashedSpace:
    """The rows of an input table a token's ids index, which a hashed output head can
    share (Superbloom's tied output, ``eta_j = h_j``): ``table`` names the row table,
    ``ids(tokens) -> (n, m)`` int64 in [0, size)."""

    table: str
    m: int
    size: int
    ids: Callable[[Sequence[str]], np.ndarray]


@dataclass(frozen=True)
class PatternSpace:
    """T-Free's code: m hashes of each character trigram into v rows, with ``seed``."""

    m: int
    v: int
    seed: int

    def patterns(self, tokens: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """Words -> CSR rows (ids (L,), offsets (n + 1,)) of their trigram patterns."""
        return tfree_hashes(tokens, self.m, self.v, self.seed)


# ---------------------------------------------------------------------------- featurizers

class Featurizer:
    """The numpy half of a scheme (see the module docstring)."""

    def featurize(self, token_lists: Sequence[Sequence[str]], max_len: int, grow: bool = True) -> Feats:
        """Hash a batch into numpy arrays. Always includes ``"mask"``: bool (N, T) with
        T = min(max_len, longest list), at least 1; longer lists are truncated to
        ``max_len``. The other keys are int64/uint8 arrays the scheme needs. A pure
        function of the tokens and the config, except that a featurizer with a
        dictionary (``plain``) admits new tokens while ``grow`` is True (queries pass
        False)."""
        raise NotImplementedError

    def rows_touched(self, feats: Feats) -> dict[str, np.ndarray]:
        """Unique sorted int64 row ids per row table that the module reads for
        ``feats``: exactly the rows whose sparse gradient is present after backward."""
        return {}

    def hashed_space(self) -> HashedSpace | None:
        """The input row space a hashed output head may tie to (None: none)."""
        return None

    def pattern_space(self) -> PatternSpace | None:
        """The T-Free code a T-Free output head may tie to (None: none)."""
        return None


E_STD = 0.1  # the Hash Embeddings reference implementation's E ~ N(0, 0.1): a standard deviation


@dataclass(frozen=True)
class HashEmbeddingConfig:
    """K importance rows (D1's range), B component vectors of width d, k hashes.

    init="paper": E ~ N(0, 0.1^2), P ~ N(0, 0.0005^2): tokens start near zero and E
    learns slowly at first (its gradient is scaled by p ~ 5e-4).
    init="mean": E as above, P ~ N(1/k, 0.0005^2): each token starts as the mean of its
    k components, so E gets full-size gradients from the first step.
    """

    K: int = 1_000_000
    B: int = 100_000
    d: int = 64
    k: int = 2
    append_p: bool = False
    combine: str = "sum"
    init: str = "paper"
    seed: int = 0

    @property
    def out_dim(self) -> int:
        width = self.d if self.combine == "sum" else self.k * self.d
        return width + (self.k if self.append_p else 0)


class HashFeaturizer(Featurizer):
    """``d1`` int64 (N, T) in [0, K); ``buckets`` int64 (N, T, k) in [0, B)."""

    def __init__(self, cfg: HashEmbeddingConfig):
        self.cfg = cfg
        self.hasher = TokenHasher(K=cfg.K, B=cfg.B, k=cfg.k, seed=cfg.seed)

    def featurize(self, token_lists, max_len: int, grow: bool = True) -> Feats:
        flat, mask = flatten_batch(token_lists, max_len)
        d1, buckets = guard_tokens(self.hasher, flat)  # (M,), (M, k): one call per batch
        return {"mask": mask, "d1": pad(d1, mask), "buckets": pad(buckets, mask)}

    def rows_touched(self, feats: Feats) -> dict[str, np.ndarray]:
        mask = feats["mask"]
        return {"E": unique_rows(feats["buckets"][mask]), "P": unique_rows(feats["d1"][mask])}

    def hashed_space(self) -> HashedSpace:
        # Hash embeddings tie to their B component vectors with eta_j = h_j (j = 1..k).
        return HashedSpace("E", self.cfg.k, self.cfg.B, self.buckets)

    def buckets(self, tokens: Sequence[str]) -> np.ndarray:
        """h_1..h_k of each token: (n, k) int64 in [0, B)."""
        return guard_tokens(self.hasher, tokens)[1]


@dataclass(frozen=True)
class HashingTrickConfig:
    """One hash into B rows of width d (Weinberger et al.; the paper's k = 1, p = 1).

    The hash is HashEmbedding's h_1 for the same seed, so the two agree bucket for bucket.
    """

    B: int = 100_000
    d: int = 64
    seed: int = 0


class HashingTrickFeaturizer(Featurizer):
    """``buckets`` int64 (N, T) in [0, B)."""

    def __init__(self, cfg: HashingTrickConfig):
        self.cfg = cfg

    def buckets(self, tokens: Sequence[str]) -> np.ndarray:
        # purpose "H" reproduces TokenHasher's first bucket hash exactly.
        return guard_tokens(multi_hash, tokens, 1, self.cfg.B, self.cfg.seed, "H")  # (n, 1)

    def featurize(self, token_lists, max_len: int, grow: bool = True) -> Feats:
        flat, mask = flatten_batch(token_lists, max_len)
        return {"mask": mask, "buckets": pad(self.buckets(flat)[:, 0], mask)}

    def rows_touched(self, feats: Feats) -> dict[str, np.ndarray]:
        return {"E": unique_rows(feats["buckets"][feats["mask"]])}

    def hashed_space(self) -> HashedSpace:
        return HashedSpace("E", 1, self.cfg.B, self.buckets)


@dataclass(frozen=True)
class BloomEmbeddingConfig:
    """B rows of width d; m hash functions per id (the paper uses m = 2)."""

    B: int = 100_000
    d: int = 64
    m: int = 2
    seed: int = 0


class BloomFeaturizer(Featurizer):
    """``ids`` int64 (N, T, m) in [0, B)."""

    def __init__(self, cfg: BloomEmbeddingConfig):
        self.cfg = cfg

    def hash_ids(self, tokens: Sequence[str]) -> np.ndarray:
        """The Bloom digest (n, m) of each token; a tied hashed output uses this same
        function (identical input and output hashes, Superbloom section 2.3)."""
        return guard_tokens(multi_hash, tokens, self.cfg.m, self.cfg.B, self.cfg.seed, "bloom")

    def featurize(self, token_lists, max_len: int, grow: bool = True) -> Feats:
        flat, mask = flatten_batch(token_lists, max_len)
        return {"mask": mask, "ids": pad(self.hash_ids(flat), mask)}

    def rows_touched(self, feats: Feats) -> dict[str, np.ndarray]:
        return {"E": unique_rows(feats["ids"][feats["mask"]])}

    def hashed_space(self) -> HashedSpace:
        return HashedSpace("E", self.cfg.m, self.cfg.B, self.hash_ids)


HASHFORMER_VARIANTS = ("pool", "add", "proj")
NGRAM_ORDERS = (1, 2, 3, 4)


@dataclass(frozen=True)
class HashFormerConfig:
    """``bits`` = T (at most 128); ``pool_bits`` = the Pool codeword length k."""

    variant: str = "pool"
    d: int = 64
    bits: int = 128
    pool_bits: int = 10
    hash: str = "md5"
    lsh_features: int = 1 << 16  # d_x: dimensions the character n-grams are hashed into
    seed: int = 0

    def __post_init__(self) -> None:
        # d, bits, pool_bits and hash are embedding.* keys, checked by EmbeddingConfig;
        # the variant comes from embedding.scheme and lsh_features is this class's own.
        if self.variant not in HASHFORMER_VARIANTS:
            raise ConfigError(f"HashFormer variant {self.variant!r}; choose one of {HASHFORMER_VARIANTS}"
                              " (embedding.scheme=hashformer-<variant>)")
        if self.lsh_features < 1:
            raise ConfigError(f"HashFormerConfig.lsh_features must be >= 1, got {self.lsh_features}")

    @property
    def n_codewords(self) -> int:
        return math.ceil(self.bits / self.pool_bits)


class HashFormerFeaturizer(Featurizer):
    """Pool: ``codes`` int64 (N, T, ceil(T/k)); Add/Proj: ``bits`` uint8 (N, T, T)."""

    def __init__(self, cfg: HashFormerConfig):
        self.cfg = cfg
        self._eta = None
        if cfg.hash == "lsh":
            rng = np.random.default_rng(derive_seed(cfg.seed, "lsh-eta"))
            self._eta = rng.standard_normal(cfg.lsh_features).astype(np.float32)  # (d_x,)
        self._powers = 1 << np.arange(cfg.pool_bits - 1, -1, -1, dtype=np.int64)  # MSB first

    def token_code(self, tokens: Sequence[str]) -> np.ndarray:
        """tau: the {0, 1} uint8 code (M, T) of each token."""
        cfg = self.cfg
        if cfg.hash == "lsh":
            return guard_tokens(lsh_bits, tokens, self._eta, cfg.bits, cfg.seed)
        return guard_tokens(token_bits, tokens, cfg.seed, cfg.hash, cfg.bits)

    def featurize(self, token_lists, max_len: int, grow: bool = True) -> Feats:
        flat, mask = flatten_batch(token_lists, max_len)
        tau = self.token_code(flat)  # (M, T)
        if self.cfg.variant == "pool":
            return {"mask": mask, "codes": pad(self.codewords(tau), mask)}
        return {"mask": mask, "bits": pad(tau, mask)}

    def codewords(self, tau: np.ndarray) -> np.ndarray:
        """(M, T) bits -> (M, n) integers of k bits each; the last, shorter chunk is read
        as a number of its own bits (zero-padded on the left)."""
        k, n = self.cfg.pool_bits, self.cfg.n_codewords
        padded = np.zeros((len(tau), n * k), dtype=np.int64)
        padded[:, :tau.shape[1]] = tau
        last = tau.shape[1] - (n - 1) * k  # bits in the last chunk
        padded[:, (n - 1) * k:] = np.roll(padded[:, (n - 1) * k:], k - last, axis=1)
        return padded.reshape(len(tau), n, k) @ self._powers  # (M, n)


def char_ngrams(token: str) -> list[str]:
    """Character 1..4-grams of ``token``, with repeats (x counts n-gram frequency).

    >>> char_ngrams("abc")
    ['a', 'b', 'c', 'ab', 'bc', 'abc']
    """
    return [token[i:i + n] for n in NGRAM_ORDERS for i in range(len(token) - n + 1)]


def lsh_bits(tokens: Sequence[str], eta: np.ndarray, bits: int, seed: int) -> np.ndarray:
    """HashFormers-LSH code (M, bits) uint8: bit j = [x . r_j >= 0], x the token's
    n-gram counts hashed into len(eta) dimensions, r_j = eta cyclically shifted by j.

    Each token's dot products are summed over its own n-grams only, in a fixed order,
    so a token's bits do not depend on the rest of the batch.
    """
    grams = [char_ngrams(canonical_id(t)) for t in tokens]
    counts = np.fromiter(map(len, grams), dtype=np.int64, count=len(grams))
    flat = [g for gs in grams for g in gs]
    slot = (hash64(flat, derive_seed(seed, "lsh-ngram")) % np.uint64(len(eta))).astype(np.int64)  # (G,)
    # Row i of the windows is (eta[i], eta[i+1], ..., eta[i+bits-1]) cyclically, i.e.
    # r_j[i] for j = 0..bits-1: a view, so picking rows is one contiguous copy each.
    windows = sliding_window_view(np.concatenate([eta, eta[:bits - 1]]), bits)  # (d_x, bits)
    proj = windows[slot]  # (G, bits): r_j[slot(g)]
    dots = np.zeros((len(tokens), bits), dtype=np.float32)  # (M, bits); no n-grams: 0
    has = counts > 0
    if has.any():
        starts = np.cumsum(counts) - counts
        dots[has] = np.add.reduceat(proj, starts[has], axis=0)
    return (dots >= 0).astype(np.uint8)


@dataclass(frozen=True)
class TFreeEmbeddingConfig:
    """v rows of width d; m hashes per trigram."""

    v: int = 32_768
    d: int = 64
    m: int = 2
    seed: int = 0


class TFreeFeaturizer(Featurizer):
    """``ids`` int64 (L,) in [0, v): each valid position's trigram hashes, row-major;
    ``counts`` int64 (N, T): how many (0 at padding)."""

    def __init__(self, cfg: TFreeEmbeddingConfig):
        self.cfg = cfg

    def featurize(self, token_lists, max_len: int, grow: bool = True) -> Feats:
        flat, mask = flatten_batch(token_lists, max_len)
        words = guard_tokens(lambda ts: [canonical_id(t) for t in ts], flat)
        ids, offsets = tfree_hashes(words, self.cfg.m, self.cfg.v, self.cfg.seed)  # (L,), (M + 1,)
        counts = np.zeros(mask.shape, dtype=np.int64)
        counts[mask] = np.diff(offsets)
        return {"mask": mask, "ids": ids, "counts": counts}

    def rows_touched(self, feats: Feats) -> dict[str, np.ndarray]:
        return {"E": unique_rows(feats["ids"])}

    def pattern_space(self) -> PatternSpace:
        return PatternSpace(self.cfg.m, self.cfg.v, self.cfg.seed)


@dataclass(frozen=True)
class PlainEmbeddingConfig:
    """``vocab`` dictionary rows plus one out-of-vocabulary row, width d."""

    vocab: int = 100_000
    d: int = 64
    seed: int = 0


class PlainFeaturizer(Featurizer):
    """The bounded dictionary of the ``plain`` reference: ``ids`` int64 (N, T) in
    [0, vocab], ``vocab`` being the out-of-vocabulary row.

    The first ``vocab`` distinct tokens get rows 0..vocab-1 in the order the stream shows
    them (while ``grow`` is True); every later new token shares the OOV row. Keys are
    64-bit xxh3 fingerprints (two tokens share a row only if they collide: about
    V^2 / 2^65, 3e-10 for V = 10^5). The one featurizer with state: ids depend on the
    order batches are featurized (deterministic for a given stream order).
    """

    def __init__(self, cfg: PlainEmbeddingConfig):
        self.cfg = cfg
        self.oov = cfg.vocab
        self._fp_seed = derive_seed(cfg.seed, "plain")
        self._lock = threading.Lock()  # featurize (data thread) vs checkpointing (learner)
        self._set_keys(np.empty(0, dtype=np.uint64))

    def __len__(self) -> int:
        """Tokens in the dictionary (at most ``vocab``)."""
        return len(self._keys)

    def featurize(self, token_lists, max_len: int, grow: bool = True) -> Feats:
        flat, mask = flatten_batch(token_lists, max_len)
        keys = guard_tokens(hash64, flat, self._fp_seed)  # (M,) uint64 fingerprints
        with self._lock:
            if grow:
                self._add(keys)
            ids = self._lookup(keys)  # (M,)
        return {"mask": mask, "ids": pad(ids, mask)}

    def rows_touched(self, feats: Feats) -> dict[str, np.ndarray]:
        return {"E": unique_rows(feats["ids"][feats["mask"]])}

    def keys(self) -> np.ndarray:
        """The fingerprints in row order (uint64), a copy."""
        with self._lock:
            return self._keys.copy()

    def load_keys(self, keys: np.ndarray) -> None:
        """Replace the dictionary by ``keys`` (uint64, row order), e.g. from a checkpoint."""
        keys = np.asarray(keys, dtype=np.uint64)
        if len(keys) > self.cfg.vocab or len(np.unique(keys)) != len(keys):
            raise StreamlearnError(
                f"plain dictionary state holds {len(keys)} keys (unique: {len(np.unique(keys))}) "
                f"but embedding.plain_vocab={self.cfg.vocab}; load it with the config it was saved with"
            )
        with self._lock:
            self._set_keys(keys.copy())

    def __getstate__(self) -> dict:
        # A lock cannot be pickled or deep-copied; the copy gets its own.
        state = self.__dict__.copy()
        del state["_lock"]
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def _set_keys(self, keys: np.ndarray) -> None:
        self._keys = keys  # (n,) uint64, row order
        order = np.argsort(keys, kind="stable")
        self._sorted_keys, self._sorted_rows = keys[order], order.astype(np.int64)

    def _lookup(self, keys: np.ndarray) -> np.ndarray:
        """Row of each key, ``oov`` when absent (a binary search, batched)."""
        if not len(self._sorted_keys):
            return np.full(len(keys), self.oov, dtype=np.int64)
        pos = np.minimum(np.searchsorted(self._sorted_keys, keys), len(self._sorted_keys) - 1)
        return np.where(self._sorted_keys[pos] == keys, self._sorted_rows[pos], self.oov)

    def _add(self, keys: np.ndarray) -> None:
        room = self.cfg.vocab - len(self._keys)
        if room <= 0 or not len(keys):
            return
        uniq, first = np.unique(keys, return_index=True)
        fresh = uniq[np.argsort(first, kind="stable")]  # distinct keys, first-seen order
        fresh = fresh[self._lookup(fresh) == self.oov][:room]
        rows = np.arange(len(self._keys), len(self._keys) + len(fresh), dtype=np.int64)
        order = np.argsort(fresh)
        # Merge into the sorted index in O(V) instead of re-sorting all V keys.
        at = np.searchsorted(self._sorted_keys, fresh[order])
        self._sorted_keys = np.insert(self._sorted_keys, at, fresh[order])
        self._sorted_rows = np.insert(self._sorted_rows, at, rows[order])
        self._keys = np.concatenate([self._keys, fresh])


# ---------------------------------------------------------------------------- n-gram inputs

NGRAM_SEP = "\x1f"  # joins an n-gram's words into the one string its hashes read (ASCII unit separator)


def input_ngrams(token_lists: Sequence[Sequence[str]], n: int) -> list[list[str]]:
    """The word n-gram ending at each position of each list, its n words joined by
    :data:`NGRAM_SEP`; a list's first n - 1 positions read empty words before its start.

    >>> [g.replace(NGRAM_SEP, " ") for g in input_ngrams([["a", "b", "c"]], 2)[0]]
    [' a', 'a b', 'b c']
    """
    if n == 2:  # the order measured: f-strings, 71 us against 198 for the joins below (16 records of 38)
        return [[f"{a}{NGRAM_SEP}{b}" for a, b in zip(("", *tokens), tokens)] for tokens in token_lists]
    out = []
    for tokens in token_lists:
        padded = [*[""] * (n - 1), *tokens]
        out.append([NGRAM_SEP.join(padded[j:j + n]) for j in range(len(tokens))])
    return out


def add_ngram_inputs(featurizer: Featurizer, feats: Feats, token_lists: Sequence[Sequence[str]], max_len: int,
                     orders: int, grow: bool = True) -> Feats:
    """``feats`` (of ``token_lists``) with the arrays of each position's n-grams, n = 2 ..
    ``orders``, under ``"ngram{n}.{key}"``: the same scheme's arrays of the n-gram strings,
    aligned with the tokens (one n-gram per position, so the tokens' mask is theirs).
    :meth:`HashedTransformer.encode <streamlearn.model.HashedTransformer.encode>` adds their
    vectors to the tokens' (``model.input_ngrams``)."""
    for n in range(2, orders + 1):
        grams = featurizer.featurize(input_ngrams(token_lists, n), max_len, grow)
        feats.update({f"ngram{n}.{name}": a for name, a in grams.items() if name != "mask"})
    return feats


def ngram_groups(feats: dict[str, Any]) -> list[dict[str, Any]]:
    """The n-gram inputs of a batch's features (numpy or torch), one dict of the scheme's
    keys per order, each with the batch's ``mask``; [] when it has none."""
    groups: dict[str, dict[str, Any]] = {}
    for name, value in feats.items():
        if name.startswith("ngram"):
            order, _, key = name.partition(".")
            groups.setdefault(order, {"mask": feats["mask"]})[key] = value
    return list(groups.values())


def input_rows(featurizer: Featurizer, feats: Feats) -> dict[str, np.ndarray]:
    """:meth:`Featurizer.rows_touched` of the tokens and of their n-gram inputs, per table."""
    rows = dict(featurizer.rows_touched(feats))
    for group in ngram_groups(feats):
        for table, more in featurizer.rows_touched(group).items():
            rows[table] = np.union1d(rows[table], more) if table in rows else more
    return rows


# ---------------------------------------------------------------------------- building

SchemeConfig = (HashEmbeddingConfig | HashingTrickConfig | BloomEmbeddingConfig | HashFormerConfig
                | TFreeEmbeddingConfig | PlainEmbeddingConfig)


def _hash(cfg: EmbeddingConfig, seed: int) -> HashEmbeddingConfig:
    return HashEmbeddingConfig(K=cfg.K, B=cfg.B, d=cfg.d, k=cfg.k, append_p=cfg.append_p,
                               combine=cfg.combine, init=cfg.init, seed=seed)


def _hashformer(variant: str, cfg: EmbeddingConfig, seed: int) -> HashFormerConfig:
    return HashFormerConfig(variant=variant, d=cfg.d, bits=cfg.hashformer_bits, pool_bits=cfg.hashformer_pool_bits,
                            hash=cfg.hashformer_hash, seed=seed)


_SCHEMES: dict[str, Callable[[EmbeddingConfig, int], SchemeConfig]] = {
    "hash": _hash,
    "bloom": lambda cfg, seed: BloomEmbeddingConfig(B=cfg.B, d=cfg.d, m=cfg.m, seed=seed),
    "hashformer-pool": partial(_hashformer, "pool"),
    "hashformer-add": partial(_hashformer, "add"),
    "hashformer-proj": partial(_hashformer, "proj"),
    "tfree": lambda cfg, seed: TFreeEmbeddingConfig(v=cfg.tfree_rows, d=cfg.d, m=cfg.m, seed=seed),
    "hashing-trick": lambda cfg, seed: HashingTrickConfig(B=cfg.B, d=cfg.d, seed=seed),
    "plain": lambda cfg, seed: PlainEmbeddingConfig(vocab=cfg.plain_vocab, d=cfg.d, seed=seed),
}

FEATURIZERS: dict[type, type[Featurizer]] = {
    HashEmbeddingConfig: HashFeaturizer,
    HashingTrickConfig: HashingTrickFeaturizer,
    BloomEmbeddingConfig: BloomFeaturizer,
    HashFormerConfig: HashFormerFeaturizer,
    TFreeEmbeddingConfig: TFreeFeaturizer,
    PlainEmbeddingConfig: PlainFeaturizer,
}


def scheme_config(cfg: EmbeddingConfig, seed: int) -> SchemeConfig:
    """The scheme's own frozen config from the flat ``EmbeddingConfig``; ``seed`` (pass
    ``Config.hashing.seed``) derives every hash function and every table init."""
    try:
        return _SCHEMES[cfg.scheme](cfg, seed)
    except KeyError:
        raise ConfigError(f"embedding.scheme={cfg.scheme!r}; choose one of {sorted(_SCHEMES)}") from None


def featurizer_for(scheme: SchemeConfig) -> Featurizer:
    """The featurizer of a scheme config (each scheme module builds its own this way)."""
    return FEATURIZERS[type(scheme)](scheme)


def build_featurizer(cfg: EmbeddingConfig, seed: int) -> Featurizer:
    """The featurizer of ``cfg.scheme``, without torch: two processes given the same
    config build featurizers that give identical arrays."""
    return featurizer_for(scheme_config(cfg, seed))
