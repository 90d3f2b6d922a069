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
_MAX_RANGE = 1 << 32

Token = str | int


# ---------------------------------------------------------------------------- tokenizers

def words(text: str, lowercase: bool = True) -> list[str]:
    """Regex words: runs of word characters, and each punctuation mark on its own."""
    return _WORD_RE.findall(text.lower() if lowercase else text)


def word_ngrams(tokens: Sequence[str], n: int) -> list[str]:
    """The contiguous word n-grams of ``tokens`` (exactly n words each), space-joined."""
    if n < 1:
        raise ConfigError(f"n-gram order must be >= 1, got {n}")
    # zip over n shifted views: one C-level join per n-gram, no slice per position
    # (0.7x the list comprehension over slices, AG News + SMS).
    return list(map(" ".join, zip(*(tokens[j:] for j in range(n)))))


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
    """xxh3_64 of each token's UTF-8 bytes with ``seed``: uint64 array (N,).

    ``map`` over ``map(str.encode, ...)`` keeps encode and hash in one C-level pass with
    no Python frame per token; non-str tokens (ints) take the slower canonical path.
    """
    seeds = repeat(seed & _MASK64)
    try:
        if tokens and isinstance(tokens[0], bytes):
            hashes = map(_H64, tokens, seeds)
        else:
            hashes = map(_H64, map(str.encode, tokens), seeds)
        return np.fromiter(hashes, dtype=np.uint64, count=len(tokens))
    except TypeError:
        return np.fromiter(map(_H64, encode(tokens), seeds), dtype=np.uint64, count=len(tokens))


def _project(base: np.ndarray, seed: int, size: int) -> np.ndarray:
    """One hash function of a uniform 64-bit base hash into [0, size): int64 (N,).

    Multiply-shift (Dietzfelbinger et al.): multiply by an odd seeded constant (a
    bijection on uint64) and keep the top 32 bits; then Lemire's multiply-high maps them
    into [0, size) without a modulo. Distinct constants give near-independent functions
    of the same base. Four in-place uint64 ops and one allocation per column: the
    profile of the batch hasher showed splitmix64 + modulo, and a float rescale, each
    costing a third of the xxhash pass itself.
    """
    if not 0 < size <= _MAX_RANGE:
        raise ConfigError(f"hash range must be in [1, 2^32], got {size}")
    x = base * np.uint64(seed | 1)
    x >>= np.uint64(32)  # uniform in [0, 2^32)
    x *= np.uint64(size)
    x >>= np.uint64(32)  # floor(u * size / 2^32) in [0, size)
    return x.view(np.int64)


def multi_hash(tokens: Sequence[Token], n: int, size: int, seed: int, purpose: str = "multi") -> np.ndarray:
    """n hash functions of each token into [0, size): int64 array (N, n).

    One xxh3_64 per token, then n seeded multiply-shift projections. Used for Superbloom's m
    Bloom hashes and T-Free's m hashes per trigram.
    """
    if n < 1 or size < 1:
        raise ConfigError(f"multi_hash needs n >= 1 and size >= 1, got n={n}, size={size}")
    return _columns(hash64(tokens, derive_seed(seed, purpose)), n, size, seed, purpose)


def _columns(base: np.ndarray, n: int, size: int, seed: int, purpose: str) -> np.ndarray:
    """n seeded functions of one base hash into [0, size): int64 (N, n)."""
    out = np.empty((len(base), n), dtype=np.int64)
    for j in range(n):
        out[:, j] = _project(base, derive_seed(seed, f"{purpose}/{j}"), size)
    return out


# ---------------------------------------------------------------------------- hashers

class TokenHasher:
    """Hash Embeddings' two layers of hashing (Svenstrup et al., section 3).

    ``D1(w)`` in [0, K) picks the importance row; ``h_1..h_k(w)`` in [0, B) pick the
    component vectors. Each token costs one fused encode + xxh3_64 call (the profile of
    an earlier three-pass version showed each pass costing as much as a bare hashing
    loop); D1 and every h_i are then separate seeded multiply-shift functions of that
    64-bit hash. So D1 and the buckets are independent functions: two tokens that
    collide in D1 (equal modulo K) have different 64-bit hashes and, almost surely,
    different buckets, the paper's suggested improvement over reusing D1.
    """

    def __init__(self, K: int, B: int, k: int, seed: int = 0):
        if K < 1 or B < 1 or k < 1:
            raise ConfigError(f"TokenHasher needs K, B, k >= 1, got K={K}, B={B}, k={k}")
        self.K, self.B, self.k, self.seed = K, B, k, seed
        self.base_seed = derive_seed(seed, "H")  # of the one xxh3_64 per token
        self._d1_seed = derive_seed(seed, "D1")

    def __call__(self, tokens: Sequence[Token]) -> tuple[np.ndarray, np.ndarray]:
        """Return ``d1`` int64 (N,) in [0, K) and ``buckets`` int64 (N, k) in [0, B).

        The buckets equal ``multi_hash(tokens, k, B, seed, purpose="H")``, so a k = 1
        hashing-trick table indexes exactly like a hash embedding's first bucket.
        """
        base = hash64(tokens, self.base_seed)
        d1 = _project(base, self._d1_seed, self.K)
        return d1, _columns(base, self.k, self.B, self.seed, "H")

    def multipliers(self) -> tuple[int, list[int]]:
        """The odd constants of D1's and of each h_i's multiply-shift (:func:`_project`),
        for code that projects the base hashes itself (:mod:`streamlearn.compiled_text`)."""
        return self._d1_seed | 1, [derive_seed(self.seed, f"H/{j}") | 1 for j in range(self.k)]

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


SHAPE_MARK = "\x05"  # starts a digit-shape token; a word holding it is that one mark alone (_WORD_RE)
_DIGIT_RE = re.compile(r"\d")


def digit_shapes(word_list: Sequence[str]) -> list[str]:
    """The shape of each word that holds a digit: digits replaced by 0, marked with
    :data:`SHAPE_MARK`, so numbers that never repeat (phone numbers, prices, codes) still
    share a token with their kind.

    >>> [s[1:] for s in digit_shapes(["call", "08712300220", "4u"])]
    ['00000000000', '0u']
    """
    # isalpha first: a C call that rules out most words before the regex search (a word of
    # letters holds no digit); AG News's tokenizing 1.14x, SMS's 1.08x
    return [SHAPE_MARK + _DIGIT_RE.sub("0", w) for w in word_list if not w.isalpha() and _DIGIT_RE.search(w)]


def is_word_token(token: str) -> bool:
    """True for a word of :func:`words`; False for a word n-gram (it holds a space) or a
    digit shape (:func:`digit_shapes`).

    >>> [is_word_token(t) for t in tokenize("call 0800 now", 2, shapes=True)]
    [True, True, True, False, False, False]
    """
    return " " not in token and not (token.startswith(SHAPE_MARK) and len(token) > 1)


def tokenize(text: str, max_n: int = 1, lowercase: bool = True, shapes: bool = False) -> list[str]:
    """The default text pipeline: regex words, then word n-grams up to ``max_n``, then
    (``shapes``) the digit shapes of the words that hold a digit."""
    ws = words(text, lowercase)
    out = with_ngrams(ws, max_n)
    return out + digit_shapes(ws) if shapes else out


class HashedText:
    """A text's tokens as their hashes (``base``: uint64, every token of :func:`tokenize`,
    in its order, hashed as :func:`hash64` would) and how many of them are words (they
    come first), where a batch needs no token as a string
    (:class:`streamlearn.compiled_text.TextHasher` makes them). ``len`` is the token
    list's.

    >>> h = HashedText(hash64(["a", "b", "a b"], 0), 2)
    >>> len(h), h.words
    (3, 2)
    """

    __slots__ = ("base", "words")

    def __init__(self, base: np.ndarray, words: int):
        self.base, self.words = base, words

    def __len__(self) -> int:
        return len(self.base)
