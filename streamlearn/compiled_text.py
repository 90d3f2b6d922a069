"""A text's tokens straight to their hashes, compiled (numba): the default tokenizer
(:func:`streamlearn.hashing.tokenize`: regex words, word n-grams, digit shapes) and
xxh3_64 of each token, in one call with no Python string per token.

Preparing a classify batch was two fifths of a prequential replay's time (py-spy, AG
News): the regex, the n-grams' joins, the digit shapes and one ``xxh3_64_intdigest``
call per token, about 30 us a record of 95 tokens. :func:`text_hashes` reads the text's
bytes once and hashes each token as it finds it, into the same 64-bit values
:func:`streamlearn.hashing.hash64` gives the same tokens' strings.

It takes ASCII text only (:meth:`TextHasher.__call__` answers None otherwise, and the
caller tokenizes in Python, which reads ``hashing.scripts``: the two settings give ASCII
the same tokens, so one kernel serves both): on ASCII, ``\\w`` and ``\\s`` are fixed byte classes,
read off the tokenizer's own regex (:func:`byte_classes`), and a lowercased byte is a
lowercased character. A token over 240 bytes (xxh3's long-input path, not written here)
sends its text the same way. ``xxh3_64`` follows the reference algorithm's short and
mid-size paths (Collet, xxHash 0.8: 0, 1-3, 4-8, 9-16, 17-128 and 129-240 bytes, with a
seed); tests/test_compiled_text.py holds it to the ``xxhash`` package on every length and
the whole kernel to :func:`~streamlearn.hashing.tokenize` + ``hash64`` on real and
random texts.
"""
from __future__ import annotations

import re

import numpy as np
from numba import njit

from .hashing import SHAPE_MARK, HashedText, TokenHasher, hash64, words

__all__ = ["MAX_TOKEN_BYTES", "TextHasher", "byte_classes", "hashed_batch", "text_hashes", "xxh3_64"]

MAX_TOKEN_BYTES = 240  # the longest token hashed here; a longer one sends its text to Python

# xxh3's default secret (the first 144 of its 192 bytes: the short and mid-size paths read
# no further) and its primes
_SECRET = np.array([
    0xb8, 0xfe, 0x6c, 0x39, 0x23, 0xa4, 0x4b, 0xbe, 0x7c, 0x01, 0x81, 0x2c, 0xf7, 0x21, 0xad, 0x1c,
    0xde, 0xd4, 0x6d, 0xe9, 0x83, 0x90, 0x97, 0xdb, 0x72, 0x40, 0xa4, 0xa4, 0xb7, 0xb3, 0x67, 0x1f,
    0xcb, 0x79, 0xe6, 0x4e, 0xcc, 0xc0, 0xe5, 0x78, 0x82, 0x5a, 0xd0, 0x7d, 0xcc, 0xff, 0x72, 0x21,
    0xb8, 0x08, 0x46, 0x74, 0xf7, 0x43, 0x24, 0x8e, 0xe0, 0x35, 0x90, 0xe6, 0x81, 0x3a, 0x26, 0x4c,
    0x3c, 0x28, 0x52, 0xbb, 0x91, 0xc3, 0x00, 0xcb, 0x88, 0xd0, 0x65, 0x8b, 0x1b, 0x53, 0x2e, 0xa3,
    0x71, 0x64, 0x48, 0x97, 0xa2, 0x0d, 0xf9, 0x4e, 0x38, 0x19, 0xef, 0x46, 0xa9, 0xde, 0xac, 0xd8,
    0xa8, 0xfa, 0x76, 0x3f, 0xe3, 0x9c, 0x34, 0x3f, 0xf9, 0xdc, 0xbb, 0xc7, 0xc7, 0x0b, 0x4f, 0x1d,
    0x8a, 0x51, 0xe0, 0x4b, 0xcd, 0xb4, 0x59, 0x31, 0xc8, 0x9f, 0x7e, 0xc9, 0xd9, 0x78, 0x73, 0x64,
    0xea, 0xc5, 0xac, 0x83, 0x34, 0xd3, 0xeb, 0xc3, 0xc5, 0x81, 0xa0, 0xff, 0xfa, 0x13, 0x63, 0xeb,
], dtype=np.uint8)
_P32_1, _P32_2, _P32_3 = np.uint64(0x9E3779B1), np.uint64(0x85EBCA77), np.uint64(0xC2B2AE3D)
_P64_1, _P64_2, _P64_3 = np.uint64(0x9E3779B185EBCA87), np.uint64(0xC2B2AE3D27D4EB4F), np.uint64(0x165667B19E3779F9)
_MX1, _MX2 = np.uint64(0x165667919E3779F9), np.uint64(0x9FB21C651E98DF25)
_M32 = np.uint64(0xFFFFFFFF)

# byte classes of the tokenizer's regex (\w+|[^\w\s])
SPACE, WORD, MARK = 0, 1, 2
_MARK_BYTE = ord(SHAPE_MARK)  # a digit shape's first byte


# ---------------------------------------------------------------------------- xxh3_64
# Every constant and shift is a uint64: numba turns uint64 with a plain int into float64.

@njit(cache=True, nogil=True, inline="always")
def _r64(b, i):
    """Little-endian uint64 of b[i:i + 8]."""
    v = np.uint64(0)
    for j in range(7, -1, -1):
        v = (v << np.uint64(8)) | np.uint64(b[i + j])
    return v


@njit(cache=True, nogil=True, inline="always")
def _r32(b, i):
    return (np.uint64(b[i]) | (np.uint64(b[i + 1]) << np.uint64(8)) | (np.uint64(b[i + 2]) << np.uint64(16))
            | (np.uint64(b[i + 3]) << np.uint64(24)))


@njit(cache=True, nogil=True, inline="always")
def _fold(a, b):
    """The 128-bit product of a and b, its halves xor-ed (XXH3_mul128_fold64)."""
    a_lo, a_hi, b_lo, b_hi = a & _M32, a >> np.uint64(32), b & _M32, b >> np.uint64(32)
    lo_lo, hi_lo, lo_hi, hi_hi = a_lo * b_lo, a_hi * b_lo, a_lo * b_hi, a_hi * b_hi
    cross = (lo_lo >> np.uint64(32)) + (hi_lo & _M32) + lo_hi
    upper = (hi_lo >> np.uint64(32)) + (cross >> np.uint64(32)) + hi_hi
    lower = (cross << np.uint64(32)) | (lo_lo & _M32)
    return lower ^ upper


@njit(cache=True, nogil=True, inline="always")
def _avalanche(h):
    h ^= h >> np.uint64(37)
    h *= _MX1
    return h ^ (h >> np.uint64(32))


@njit(cache=True, nogil=True, inline="always")
def _xxh64_avalanche(h):
    h ^= h >> np.uint64(33)
    h *= _P64_2
    h ^= h >> np.uint64(29)
    h *= _P64_3
    return h ^ (h >> np.uint64(32))


@njit(cache=True, nogil=True, inline="always")
def _mix16(b, i, s, seed):
    return _fold(_r64(b, i) ^ (_r64(_SECRET, s) + seed), _r64(b, i + 8) ^ (_r64(_SECRET, s + 8) - seed))


@njit(cache=True, nogil=True)
def xxh3_64(b: np.ndarray, start: int, n: int, seed: np.uint64) -> np.uint64:
    """xxh3_64 of the ``n`` bytes ``b[start:start + n]`` (uint8) with ``seed``, for n <= 240:
    equal to ``xxhash.xxh3_64_intdigest(bytes(b[start:start + n]), seed)``."""
    length = np.uint64(n)
    if n == 0:
        return _xxh64_avalanche(seed ^ (_r64(_SECRET, 56) ^ _r64(_SECRET, 64)))
    if n <= 3:
        c1, c2, c3 = np.uint64(b[start]), np.uint64(b[start + (n >> 1)]), np.uint64(b[start + n - 1])
        combined = (c1 << np.uint64(16)) | (c2 << np.uint64(24)) | c3 | (length << np.uint64(8))
        flip = (_r32(_SECRET, 0) ^ _r32(_SECRET, 4)) + seed
        return _xxh64_avalanche(combined ^ flip)
    if n <= 8:
        low = seed & _M32
        swapped = ((low & np.uint64(0xFF)) << np.uint64(24)) | ((low & np.uint64(0xFF00)) << np.uint64(8)) \
            | ((low >> np.uint64(8)) & np.uint64(0xFF00)) | (low >> np.uint64(24))
        s = seed ^ (swapped << np.uint64(32))
        flip = (_r64(_SECRET, 8) ^ _r64(_SECRET, 16)) - s
        keyed = (_r32(b, start + n - 4) + (_r32(b, start) << np.uint64(32))) ^ flip
        keyed ^= ((keyed << np.uint64(49)) | (keyed >> np.uint64(15))) ^ ((keyed << np.uint64(24)) | (keyed >> np.uint64(40)))
        keyed *= _MX2
        keyed ^= (keyed >> np.uint64(35)) + length
        keyed *= _MX2
        return keyed ^ (keyed >> np.uint64(28))
    if n <= 16:
        flip1 = (_r64(_SECRET, 24) ^ _r64(_SECRET, 32)) + seed
        flip2 = (_r64(_SECRET, 40) ^ _r64(_SECRET, 48)) - seed
        lo = _r64(b, start) ^ flip1
        hi = _r64(b, start + n - 8) ^ flip2
        swapped = np.uint64(0)
        for j in range(8):
            swapped = (swapped << np.uint64(8)) | ((lo >> np.uint64(8 * j)) & np.uint64(0xFF))
        return _avalanche(length + swapped + hi + _fold(lo, hi))
    acc = length * _P64_1
    if n <= 128:
        if n > 32:
            if n > 64:
                if n > 96:
                    acc += _mix16(b, start + 48, 96, seed)
                    acc += _mix16(b, start + n - 64, 112, seed)
                acc += _mix16(b, start + 32, 64, seed)
                acc += _mix16(b, start + n - 48, 80, seed)
            acc += _mix16(b, start + 16, 32, seed)
            acc += _mix16(b, start + n - 32, 48, seed)
        acc += _mix16(b, start, 0, seed)
        acc += _mix16(b, start + n - 16, 16, seed)
        return _avalanche(acc)
    for i in range(8):
        acc += _mix16(b, start + 16 * i, 16 * i, seed)
    acc = _avalanche(acc)
    for i in range(8, n // 16):
        acc += _mix16(b, start + 16 * i, 16 * (i - 8) + 3, seed)
    acc += _mix16(b, start + n - 16, 136 - 17, seed)
    return _avalanche(acc)


# ---------------------------------------------------------------------------- the tokenizer

@njit(cache=True, nogil=True)
def text_hashes(text: np.ndarray, classes: np.ndarray, seed: np.uint64, max_n: int,
                shapes: bool) -> tuple[np.ndarray, int]:
    """The hashes of :func:`~streamlearn.hashing.tokenize`'s tokens of one ASCII text
    (``text``: its bytes, lowercased as the tokenizer would), in its order: the words,
    their 2..``max_n``-grams, then (``shapes``) the digit shapes; and the number of words.
    ``classes``: :func:`byte_classes`. (empty, -1) when a token is over
    :data:`MAX_TOKEN_BYTES` long."""
    n = len(text)
    starts = np.empty(n, np.int64)
    ends = np.empty(n, np.int64)
    words = 0
    i = 0
    while i < n:
        c = classes[text[i]]
        if c == SPACE:
            i += 1
            continue
        j = i + 1
        if c == WORD:
            while j < n and classes[text[j]] == WORD:
                j += 1
        if j - i > MAX_TOKEN_BYTES:
            return np.empty(0, np.uint64), -1
        starts[words], ends[words] = i, j
        words += 1
        i = j
    total = words
    for m in range(2, max_n + 1):
        total += max(0, words - m + 1)
    digits = np.zeros(words, np.bool_)
    if shapes:
        for w in range(words):
            for j in range(starts[w], ends[w]):
                if 48 <= text[j] <= 57:
                    digits[w] = True
                    total += 1
                    break
    out = np.empty(total, np.uint64)
    scratch = np.empty(MAX_TOKEN_BYTES + 1, np.uint8)
    for w in range(words):
        out[w] = xxh3_64(text, starts[w], ends[w] - starts[w], seed)
    k = words
    for m in range(2, max_n + 1):
        for w in range(words - m + 1):
            size = m - 1
            for q in range(m):
                size += ends[w + q] - starts[w + q]
            if size > MAX_TOKEN_BYTES:
                return np.empty(0, np.uint64), -1
            at = 0
            for q in range(m):
                if q:
                    scratch[at] = 32  # " ".join
                    at += 1
                for j in range(starts[w + q], ends[w + q]):
                    scratch[at] = text[j]
                    at += 1
            out[k] = xxh3_64(scratch, 0, size, seed)
            k += 1
    for w in range(words):
        if digits[w]:
            size = ends[w] - starts[w] + 1
            if size > MAX_TOKEN_BYTES:
                return np.empty(0, np.uint64), -1
            scratch[0] = _MARK_BYTE
            for j in range(starts[w], ends[w]):
                scratch[j - starts[w] + 1] = 48 if 48 <= text[j] <= 57 else text[j]
            out[k] = xxh3_64(scratch, 0, size, seed)
            k += 1
    return out, words



@njit(cache=True, nogil=True)
def hashed_batch(base: np.ndarray, lengths: np.ndarray, words: np.ndarray, max_tokens: int, d1_mult: np.uint64,
                 K: int, mults: np.ndarray, B: int, nb_span: int):
    """A training batch's hash-embedding arrays from its records' token hashes, as
    :class:`~streamlearn.featurize.HashFeaturizer` and the Naive Bayes part's token ids
    make them from the tokens: ``base`` every record's hashes one after another
    (``lengths`` (N,) each), cut to ``max_tokens``; D1 and h_1..h_k are the multiply-shift
    projections :func:`~streamlearn.hashing._project` computes (``d1_mult``, ``mults``);
    the Naive Bayes id of each of a record's first ``words[n]`` tokens is its D1 modulo
    ``nb_span`` (-1 elsewhere). Returns mask (N, T), d1 (N, T), buckets (N, T, k) and the
    Naive Bayes ids (N, T), T = the longest cut record (at least 1)."""
    N, k = len(lengths), len(mults)
    T = 1
    for n in range(N):
        T = max(T, min(lengths[n], max_tokens))
    mask = np.zeros((N, T), np.bool_)
    d1 = np.zeros((N, T), np.int64)
    buckets = np.zeros((N, T, k), np.int64)
    nb = np.full((N, T), -1, np.int64)
    top, size_K, size_B = np.uint64(32), np.uint64(K), np.uint64(B)
    at = 0
    for n in range(N):
        for t in range(min(lengths[n], max_tokens)):
            h = base[at + t]
            mask[n, t] = True
            row = (((h * d1_mult) >> top) * size_K) >> top
            d1[n, t] = np.int64(row)
            for j in range(k):
                buckets[n, t, j] = np.int64((((h * mults[j]) >> top) * size_B) >> top)
            if t < words[n]:
                nb[n, t] = np.int64(row) % nb_span
        at += lengths[n]
    return mask, d1, buckets, nb


def byte_classes() -> np.ndarray:
    """SPACE, WORD or MARK for each ASCII byte, as the tokenizer's regex reads it: WORD
    where ``\\w`` matches, SPACE where ``\\s`` does, MARK (a token of its own) elsewhere.
    Read off the tokenizer itself (:func:`streamlearn.hashing.words`), so the two cannot
    disagree."""
    classes = np.full(256, MARK, np.uint8)
    for c in range(128):
        found = words(chr(c), lowercase=False)
        if not found:
            classes[c] = SPACE
        elif re.fullmatch(r"\w", chr(c)):
            classes[c] = WORD
    return classes


class TextHasher:
    """:func:`text_hashes` and :func:`hashed_batch` for a hash embedding's
    :class:`~streamlearn.hashing.TokenHasher` and a tokenizer's settings
    (``hashing.ngrams``, ``hashing.lowercase``, ``hashing.shapes``)."""

    def __init__(self, hasher: TokenHasher, ngrams: int, lowercase: bool, shapes: bool):
        self.hasher = hasher
        self.seed, self.ngrams, self.lowercase, self.shapes = np.uint64(hasher.base_seed), ngrams, lowercase, shapes
        d1_mult, mults = hasher.multipliers()
        self._d1_mult, self._mults = np.uint64(d1_mult), np.array(mults, dtype=np.uint64)
        self.classes = byte_classes()
        self._loaded = False

    def batch(self, token_lists: list, words: np.ndarray, max_tokens: int,
              nb_span: int) -> tuple[dict[str, np.ndarray], np.ndarray]:
        """The featurizer's arrays (mask, d1, buckets) and the Naive Bayes ids (N, T) of
        a batch whose rows are :class:`~streamlearn.hashing.HashedText` or token lists
        (hashed here); ``words`` (N,): the tokens of each row the Naive Bayes part counts,
        from its first (``nb_span`` 0: none)."""
        bases = [tokens.base if type(tokens) is HashedText else hash64(tokens[:max_tokens], self.hasher.base_seed)
                 for tokens in token_lists]
        lengths = np.fromiter(map(len, bases), dtype=np.int64, count=len(bases))
        mask, d1, buckets, nb = hashed_batch(np.concatenate(bases), lengths, words, max_tokens, self._d1_mult,
                                             self.hasher.K, self._mults, self.hasher.B, max(nb_span, 1))
        return {"mask": mask, "d1": d1, "buckets": buckets}, nb

    def __call__(self, text: str) -> HashedText | None:
        """The text's :class:`HashedText`; None where it is not ASCII or holds a token
        over :data:`MAX_TOKEN_BYTES` (the caller tokenizes it in Python)."""
        if not text.isascii():
            return None
        if not self._loaded:  # the kernels load in a thread (streamlearn.compiled_loading)
            from .compiled_loading import loaded
            loaded()
            self._loaded = True
        data = np.frombuffer((text.lower() if self.lowercase else text).encode("ascii"), np.uint8)
        base, words = text_hashes(data, self.classes, self.seed, self.ngrams, self.shapes)
        return None if words < 0 else HashedText(base, words)
