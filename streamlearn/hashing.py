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
import unicodedata
from functools import cache
from itertools import repeat
from typing import Iterable, Sequence

import numpy as np
import xxhash

from .exceptions import ConfigError

_WORD_RE = re.compile(r"\w+|[^\w\s]", re.UNICODE)  # the tokenizer of hashing.scripts=false
_H64 = xxhash.xxh3_64_intdigest
_H128 = xxhash.xxh3_128_digest
_MASK64 = (1 << 64) - 1
_MAX_RANGE = 1 << 32

Token = str | int


# ---------------------------------------------------------------------------- tokenizers

# Characters that are a token each under hashing.scripts (with the marks that follow them):
# the scripts written without spaces between words. Han ideographs as BERT's basic
# tokenizer splits them (its _is_chinese_char: the Unified Ideographs, extension A, the
# compatibility ideographs, and planes 2 and 3, which hold ideographs alone), and the
# kana, which run on into the ideographs in Japanese. Hangul is written with spaces
# between words and keeps its words whole, as BERT and UAX #29 keep them.
_SPLIT_BMP = (
    "\u3040-\u309f"  # Hiragana
    "\u30a0-\u30ff"  # Katakana
    "\u31f0-\u31ff"  # Katakana phonetic extensions
    "\u3400-\u4dbf"  # CJK Unified Ideographs extension A
    "\u4e00-\u9fff"  # CJK Unified Ideographs
    "\uf900-\ufaff"  # CJK Compatibility Ideographs
    "\uff66-\uff9f"  # halfwidth Katakana
)
SPLIT_CHARS = (_SPLIT_BMP
               + "\U0001b000-\U0001b16f"  # Kana supplement and extensions
               + "\U00020000-\U0003ffff")  # CJK extensions B to H, compatibility supplement
_SPLIT_RE = re.compile(f"[{SPLIT_CHARS}]")
_JOINER = "\u200d"  # ZWJ: joins emoji into one (family, profession); inside a word, as a mark
_REGIONAL = "\U0001f1e6-\U0001f1ff"  # regional indicators: a pair is a flag


@cache
def _scripts_re() -> re.Pattern:
    """The tokenizer of hashing.scripts=true (see :func:`words`); built on first use (a
    scan of the Unicode database and a compile, about 40 ms), so a model without it
    never pays."""
    attached = _class(_attached_ranges())
    marks, inside = f"[{attached}]", f"[{attached}{_JOINER}]"
    letter = f"[^\\W{SPLIT_CHARS}]"  # a word character that is not a token alone
    symbol = f"[^\\w\\s{SHAPE_MARK}]"  # SHAPE_MARK stays a token alone (is_word_token)
    return re.compile(
        f"[{SPLIT_CHARS}]{marks}*"  # a Han or kana character
        f"|{letter}+(?:{inside}+{letter}*)*"  # a word, with the marks and joiners inside it
        f"|(?:[{_REGIONAL}]{{2}}|{symbol}){marks}*(?:{_JOINER}{symbol}{marks}*)*"  # a flag; an emoji sequence
        "|[^\\w\\s]")  # SHAPE_MARK


@cache
def _special_re() -> re.Pattern:
    """A character :func:`_scripts_re` may read otherwise than :data:`_WORD_RE`: one of
    :data:`SPLIT_CHARS`, an attached one, the joiner, or any beyond the BMP (emoji,
    flags, rarer scripts' marks). A text without one gets the same tokens from both, and
    :data:`_WORD_RE` is the faster: ``re`` tests the BMP part of a class in one lookup,
    but the ranges beyond it one by one (about 250 of marks): one range covers them here,
    so the search costs about 5 ns a character, a tenth of the words themselves (War and Peace)."""
    bmp = [(a, b) for a, b in _attached_ranges() if b < 0x10000]
    return re.compile(f"[{_SPLIT_BMP}{_class(bmp)}{_JOINER}\\U00010000-\\U0010ffff]")


@cache
def _pieces_re() -> re.Pattern:
    return re.compile(f"([{SPLIT_CHARS}][{_class(_attached_ranges())}]*)")


@cache
def _attached_ranges() -> tuple[tuple[int, int], ...]:
    """The code point ranges of the characters that attach to the one before them (UAX
    #29's Extend and Format rule, WB4, narrowed): the combining marks (Mn, Mc, Me:
    virama, vowel signs, accents, variation selectors, the keycap), the zero-width
    non-joiner, the emoji skin-tone modifiers and the tag characters of subdivision flags.
    The zero-width joiner is handled apart (it also joins emoji). Other format characters
    (soft hyphen, direction marks) stay tokens of their own, as before."""
    # marks lie below plane 2 and in plane 14's variation selectors supplement
    codes = [c for c in (*range(0x20000), *range(0xE0100, 0xE01F0))
             if unicodedata.category(chr(c)) in ("Mn", "Mc", "Me")]
    codes += [0x200C, *range(0x1F3FB, 0x1F400), *range(0xE0020, 0xE0080)]
    ranges: list[tuple[int, int]] = []
    for c in sorted(codes):
        if ranges and c == ranges[-1][1] + 1:
            ranges[-1] = (ranges[-1][0], c)
        else:
            ranges.append((c, c))
    return tuple(ranges)


def _class(ranges: Iterable[tuple[int, int]]) -> str:
    """A regex character class's body holding ``ranges`` (inclusive)."""
    return "".join(f"\\U{a:08x}-\\U{b:08x}" for a, b in ranges)


def words(text: str, lowercase: bool = True, scripts: bool = False) -> list[str]:
    """Regex words: runs of word characters, and each punctuation mark on its own.

    ``scripts`` (``hashing.scripts``): text in any script keeps its words. Each Han
    ideograph and kana character (:data:`SPLIT_CHARS`) is a token of its own, as
    Chinese and Japanese put no space between words; a combining mark (Devanagari's
    virama and vowel signs, an accent written apart, the dot of a lowercased ``İ``) stays
    inside its word; an emoji keeps its variation selector, skin tone and zero-width-joined
    partners, and a flag its pair. Without it each of those is cut out as a token alone
    and an unspaced Chinese clause is one token. ASCII text, and text whose characters
    are none of those, gives the same tokens either way.

    >>> words("我喜欢吃苹果，你呢？", scripts=True)
    ['我', '喜', '欢', '吃', '苹', '果', '，', '你', '呢', '？']
    >>> words("नमस्ते दुनिया", scripts=True), words("नमस्ते")
    (['नमस्ते', 'दुनिया'], ['नमस', '्', 'त', 'े'])
    """
    if lowercase:
        text = text.lower()
    if not scripts or text.isascii() or not _special_re().search(text):  # the two agree there
        return _WORD_RE.findall(text)
    return _scripts_re().findall(text)


def split_pieces(word: str) -> list[str]:
    """The pieces of a space-free ``word`` that :func:`words` (``scripts``) reads as one
    word each or more: each Han or kana character, and the runs between them (the
    plain-text reader counts a record's words so).

    >>> split_pieces("iPhone价格。"), split_pieces("hello")
    (['iPhone', '价', '格', '。'], ['hello'])
    """
    if not has_split_chars(word):
        return [word]
    return [p for p in _pieces_re().split(word) if p]


def has_split_chars(text: str) -> bool:
    """Whether ``text`` holds a Han or kana character (:data:`SPLIT_CHARS`)."""
    return not text.isascii() and _SPLIT_RE.search(text) is not None


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


def tokenize(text: str, max_n: int = 1, lowercase: bool = True, shapes: bool = False,
             scripts: bool = False) -> list[str]:
    """The default text pipeline: regex words (:func:`words`; ``scripts``: of every
    script, ``hashing.scripts``), then word n-grams up to ``max_n``, then (``shapes``)
    the digit shapes of the words that hold a digit."""
    ws = words(text, lowercase, scripts)
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
