"""Tokenizers and batch hashers: record text -> tokens -> integer ids.

Every id here is a pure function of the token bytes and of seeds derived from one
config seed (:func:`derive_seed`), computed with xxhash, so the same token gives the
same ids in every process, under any ``PYTHONHASHSEED``, on any machine. Python's
``hash()`` is never used.

The batch hashers do one C call per token per xxhash seed (``map`` over encoded
tokens into ``np.fromiter``) and all further mixing in vectorised numpy; per-token
Python work is limited to the UTF-8 encode.

>>> words("Hello, World!")
['hello', ',', 'world', '!']
>>> tfree_trigrams("Hi")
[' hi', 'hi ']
>>> h = TokenHasher(K=1000, B=100, k=2, seed=0)
>>> d1, buckets = h(["a", "b", "a"])
>>> d1.shape, buckets.shape, bool(d1[0] == d1[2])
((3,), (3, 2), True)
"""
from __future__ import annotations

import hashlib
import re
from itertools import repeat
from typing import Iterable, Sequence

import numpy as np
import xxhash

from .exceptions import ConfigError

_WORD_RE = re.compile(r"\w+|[^\w\s]", re.UNICODE)
_H64 = xxhash.xxh3_64_intdigest
_H128 = xxhash.xxh3_128_digest
_MASK64 = (1 << 64) - 1

Token = str | int


# ---------------------------------------------------------------------------- tokenizers

def words(text: str, lowercase: bool = True) -> list[str]:
    """Regex words: runs of word characters, and each punctuation mark on its own."""
    return _WORD_RE.findall(text.lower() if lowercase else text)


def word_ngrams(tokens: Sequence[str], n: int) -> list[str]:
    """The contiguous word n-grams of ``tokens`` (exactly n words each), space-joined."""
    if n < 1:
        raise ConfigError(f"n-gram order must be >= 1, got {n}")
    return [" ".join(tokens[i:i + n]) for i in range(len(tokens) - n + 1)]


def with_ngrams(tokens: list[str], max_n: int) -> list[str]:
    """``tokens`` followed by its 2..max_n-grams (fastText-style extra features)."""
    out = list(tokens)
    for n in range(2, max_n + 1):
        out.extend(word_ngrams(tokens, n))
    return out


def tfree_trigrams(word: str, lowercase: bool = True) -> list[str]:
    """T-Free's trigram *set* of the space-padded word, in first-seen order.

    >>> tfree_trigrams("Hello")
    [' he', 'hel', 'ell', 'llo', 'lo ']
    """
    padded = f" {word.lower() if lowercase else word} "
    return list(dict.fromkeys(padded[i:i + 3] for i in range(len(padded) - 2)))


def canonical_id(token: Token) -> str:
    """Opaque ids may arrive as int (msgpack) or str (JSON); both map to one token.

    >>> canonical_id(42) == canonical_id("42")
    True
    """
    if isinstance(token, bool) or not isinstance(token, (int, str)):
        raise TypeError(f"a token must be str or int, got {type(token).__name__}")
    return str(token) if isinstance(token, int) else token


# ---------------------------------------------------------------------------- seeds

def derive_seed(seed: int, purpose: str) -> int:
    """A 64-bit seed for one named hash function, derived from the config seed.

    >>> derive_seed(0, "D1") == derive_seed(0, "D1") != derive_seed(0, "H")
    True
    """
    return xxhash.xxh64_intdigest(purpose.encode("utf-8"), seed & _MASK64)


def encode(tokens: Iterable[Token]) -> list[bytes]:
    """UTF-8 bytes of each token (ints through :func:`canonical_id`)."""
    return [canonical_id(t).encode("utf-8") for t in tokens]


def _encode_fast(tokens: Sequence[Token]) -> list[bytes]:
    try:
        return list(map(str.encode, tokens))  # the common case: all str
    except TypeError:
        return encode(tokens)


def hash64(tokens: Sequence[Token], seed: int) -> np.ndarray:
    """xxh3_64 of each token with ``seed``: uint64 array of shape (N,)."""
    data = tokens if tokens and isinstance(tokens[0], bytes) else _encode_fast(tokens)
    return np.fromiter(map(_H64, data, repeat(seed & _MASK64)), dtype=np.uint64, count=len(data))


def mix64(x: np.ndarray, seed: int) -> np.ndarray:
    """splitmix64's finaliser of ``x ^ seed``: a bijection on uint64, so distinct seeds
    give independent-looking hash functions of the same base hash. Vectorised."""
    z = x ^ np.uint64(seed & _MASK64)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def _reduce(x: np.ndarray, size: int) -> np.ndarray:
    return (x % np.uint64(size)).astype(np.int64)


def multi_hash(tokens: Sequence[Token], n: int, size: int, seed: int, purpose: str = "multi") -> np.ndarray:
    """n hash functions of each token into [0, size): int64 array (N, n).

    One xxh3_64 per token, then n seeded :func:`mix64` passes. Used for Superbloom's m
    Bloom hashes and T-Free's m hashes per trigram.
    """
    if n < 1 or size < 1:
        raise ConfigError(f"multi_hash needs n >= 1 and size >= 1, got n={n}, size={size}")
    base = hash64(tokens, derive_seed(seed, purpose))
    out = np.empty((len(base), n), dtype=np.int64)
    for j in range(n):
        out[:, j] = _reduce(mix64(base, derive_seed(seed, f"{purpose}/{j}")), size)
    return out


# ---------------------------------------------------------------------------- hashers

class TokenHasher:
    """Hash Embeddings' two layers of hashing (Svenstrup et al., section 3).

    ``D1(w)`` in [0, K) picks the importance row; ``h_1..h_k(w)`` in [0, B) pick the
    component vectors. D1 and the bucket hashes come from different xxhash seeds, so
    two tokens that collide in D1 need not share their buckets (the paper's suggested
    improvement over reusing D1).
    """

    def __init__(self, K: int, B: int, k: int, seed: int = 0):
        if K < 1 or B < 1 or k < 1:
            raise ConfigError(f"TokenHasher needs K, B, k >= 1, got K={K}, B={B}, k={k}")
        self.K, self.B, self.k = K, B, k
        self._d1_seed = derive_seed(seed, "D1")
        self._h_seed = derive_seed(seed, "H")
        self._bucket_seeds = [derive_seed(seed, f"H/{i}") for i in range(k)]

    def __call__(self, tokens: Sequence[Token]) -> tuple[np.ndarray, np.ndarray]:
        """Return ``d1`` int64 (N,) in [0, K) and ``buckets`` int64 (N, k) in [0, B)."""
        data = _encode_fast(tokens)
        d1 = _reduce(hash64(data, self._d1_seed), self.K)
        base = hash64(data, self._h_seed)
        buckets = np.empty((len(data), self.k), dtype=np.int64)
        for i, s in enumerate(self._bucket_seeds):
            buckets[:, i] = _reduce(mix64(base, s), self.B)
        return d1, buckets

    def batch(self, token_lists: Sequence[Sequence[Token]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Hash a batch of token lists at once: flat ``d1`` (M,), ``buckets`` (M, k) and
        ``lengths`` (N,) with M = lengths.sum(); row order follows the input."""
        lengths = np.fromiter(map(len, token_lists), dtype=np.int64, count=len(token_lists))
        flat = [t for tokens in token_lists for t in tokens]
        d1, buckets = self(flat)
        return d1, buckets, lengths


def token_bits(tokens: Sequence[Token], seed: int, method: str = "xxh3", bits: int = 128) -> np.ndarray:
    """HashFormers' T-bit token code as a {0, 1} uint8 array (N, bits), bits <= 128.

    ``method="md5"`` is the paper's keyed MD5 (the key derived from ``seed``);
    ``"xxh3"`` is a keyed 128-bit xxh3, equally "random" and much faster.
    """
    if not 1 <= bits <= 128:
        raise ConfigError(f"token_bits supports 1..128 bits, got {bits}")
    data = _encode_fast(tokens)
    if method == "xxh3":
        digests = b"".join(map(_H128, data, repeat(derive_seed(seed, "T128"))))
    elif method == "md5":
        key = derive_seed(seed, "md5-key").to_bytes(8, "little")
        digests = b"".join(hashlib.md5(key + d, usedforsecurity=False).digest() for d in data)
    else:
        raise ConfigError(f"token_bits method must be 'xxh3' or 'md5', got {method!r}")
    raw = np.frombuffer(digests, dtype=np.uint8).reshape(len(data), 16)
    return np.unpackbits(raw, axis=1)[:, :bits]


def tfree_hashes(word_list: Sequence[str], m: int, v: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """T-Free's sparse code: for each word, m hashes of each of its trigrams into [0, v).

    Returns CSR arrays: ``ids`` int64 (M,) and ``offsets`` int64 (N + 1,), so word i
    activates ``ids[offsets[i]:offsets[i + 1]]`` (its trigram count times m entries;
    duplicates are kept and simply add up, as in the paper's summed embedding).
    """
    grams = [tfree_trigrams(w) for w in word_list]
    counts = np.fromiter(map(len, grams), dtype=np.int64, count=len(grams))
    flat = [g for gs in grams for g in gs]
    ids = multi_hash(flat, m, v, seed, purpose="tfree") if flat else np.empty((0, m), np.int64)
    offsets = np.zeros(len(grams) + 1, dtype=np.int64)
    np.cumsum(counts * m, out=offsets[1:])
    return ids.reshape(-1), offsets


def tokenize(text: str, max_n: int = 1, lowercase: bool = True) -> list[str]:
    """The default text pipeline: regex words, then word n-grams up to ``max_n``."""
    return with_ngrams(words(text, lowercase), max_n)
