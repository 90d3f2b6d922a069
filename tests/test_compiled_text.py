"""The compiled tokenizer and hasher (streamlearn.compiled_text) against the Python
tokenizer and xxhash: the same hashes to the bit, the same batches, the same learner."""
from __future__ import annotations

import random
import string

import numpy as np
import pytest
import torch
import xxhash
from hypothesis import given, settings, strategies as st

from streamlearn.compiled_text import MAX_TOKEN_BYTES, TextHasher, byte_classes, text_hashes, xxh3_64
from streamlearn.config import Config
from streamlearn.hashing import SHAPE_MARK, TokenHasher, hash64, tokenize, words
from streamlearn.learner import Learner
from tests.test_learner import params, topic_stream

SEEDS = [0, 1, 2**63 + 12345, 2**64 - 1, 0x9E3779B97F4A7C15]


@pytest.mark.parametrize("seed", SEEDS)
def test_xxh3_is_the_xxhash_packages_at_every_length_it_takes(seed):
    """Every length class of the reference algorithm (0, 1-3, 4-8, 9-16, 17-128, 129-240
    bytes), read from inside a larger buffer."""
    rng = np.random.default_rng(seed % 1000)
    for n in range(MAX_TOKEN_BYTES + 1):
        data = rng.integers(0, 256, size=n + 7, dtype=np.uint8)
        assert int(xxh3_64(data, 5, n, np.uint64(seed))) == xxhash.xxh3_64_intdigest(bytes(data[5:5 + n]), seed), n


def python_hashes(text: str, seed: int, ngrams: int, lowercase: bool, shapes: bool,
                  scripts: bool = False) -> tuple[np.ndarray, int]:
    return hash64(tokenize(text, ngrams, lowercase, shapes, scripts), seed), len(words(text, lowercase, scripts))


# every ASCII character, the marks the tokenizer treats specially and long runs of each kind
ASCII_TEXT = st.lists(st.sampled_from([chr(c) for c in range(128)] + ["word", "12", "a_b", "Xy9", SHAPE_MARK, "  ",
                                                                   "\x1c\x1f"]), max_size=60).map("".join)


@settings(max_examples=300, deadline=None)
@given(ASCII_TEXT, st.integers(1, 3), st.booleans(), st.booleans(), st.sampled_from(SEEDS), st.booleans())
def test_a_texts_hashes_are_its_tokens_hashes(text, ngrams, lowercase, shapes, seed, scripts):
    """Under either hashing.scripts: on ASCII the two tokenizers agree, so one kernel serves both."""
    hasher = TokenHasher(K=10, B=10, k=1, seed=seed)
    hashed = TextHasher(hasher, ngrams, lowercase, shapes)(text)
    base, count = python_hashes(text, hasher.base_seed, ngrams, lowercase, shapes, scripts)
    assert hashed is not None and hashed.words == count
    np.testing.assert_array_equal(hashed.base, base)


def test_real_texts_hash_as_the_python_tokenizer_does():
    """Text of the kinds the streams carry: prices, phone numbers, URLs, contractions, runs of punctuation."""
    rng = random.Random(0)
    pieces = ["Call 08712300220 now!", "£5", "won't", "U.S.", "http://x.co/a?b=1", "...", "4u", "r2-d2", "2nd",
              "__init__", "A&B", "tab\there", "new\nline", "CAPS", "x" * 300]
    hasher = TextHasher(TokenHasher(K=1000, B=100, k=2, seed=7), 2, True, True)
    for _ in range(300):
        text = " ".join(rng.choice(pieces) for _ in range(rng.randint(0, 12)))
        hashed = hasher(text)
        if not text.isascii() or max((len(t) for t in words(text)), default=0) > MAX_TOKEN_BYTES // 2:
            continue  # Python's (asserted below)
        assert hashed is not None
        base, count = python_hashes(text, hasher.hasher.base_seed, 2, True, True)
        np.testing.assert_array_equal(hashed.base, base)
        assert hashed.words == count


def test_what_the_kernel_does_not_take_is_left_to_python():
    hasher = TextHasher(TokenHasher(K=1000, B=100, k=2, seed=0), 2, True, True)
    assert hasher("café au lait") is None  # not ASCII
    assert hasher("a" * (MAX_TOKEN_BYTES + 1)) is None  # a word over xxh3's mid-size path
    assert hasher("a" * 120 + " " + "b" * 120) is None  # its bigram is
    assert hasher("a" * MAX_TOKEN_BYTES) is not None
    empty = hasher(" \t\n")
    assert len(empty) == 0 and empty.words == 0
    out, count = text_hashes(np.frombuffer(b"a 1", np.uint8), byte_classes(), np.uint64(0), 2, True)
    assert count == 2 and len(out) == 4  # a, 1, "a 1", the shape of 1


def test_the_byte_classes_are_the_regexs():
    classes = byte_classes()
    assert classes[ord("a")] == classes[ord("_")] == classes[ord("7")] == 1
    assert classes[ord(" ")] == classes[ord("\x1c")] == classes[ord("\n")] == 0
    assert classes[ord("!")] == classes[ord(SHAPE_MARK)] == 2
    # read off the tokenizer of hashing.scripts=false: the other reads every ASCII byte alike
    for c in range(128):
        for pair in (chr(c), chr(c) * 2, f"a{chr(c)}b", f"!{chr(c)}"):
            assert words(pair, False, scripts=True) == words(pair, False), repr(pair)


# the cases hashing.scripts reads otherwise: Han and kana, marks, emoji sequences, the dotted I
SCRIPT_TEXTS = ["我喜欢吃苹果，你呢？", "東京タワーへ行きました", "नमस्ते दुनिया", "cafe\u0301 au lait",
                "\U0001f468\u200d\U0001f469\u200d\U0001f467 love \u2764\ufe0f", "İstanbul 2024", "\U0001f1eb\U0001f1f7 4u"]


def test_the_texts_hashing_scripts_reads_otherwise_are_left_to_python():
    """The kernel takes ASCII alone, where hashing.scripts changes no token, so the key
    needs no compiled twin: each text it does change goes to Python's tokenizer, which
    reads the key (a kernel grown to take more than ASCII must read it too)."""
    hasher = TextHasher(TokenHasher(K=1000, B=100, k=2, seed=3), 2, True, True)
    for text in SCRIPT_TEXTS:
        assert tokenize(text, 2, True, True, scripts=True) != tokenize(text, 2, True, True), text
        assert hasher(text) is None, text


# ---------------------------------------------------------------------------- through a learner

# SMALL's tables, with a hash range that lets the Naive Bayes part reuse D1 (the kernel's condition)
TEXT = ("embedding.K=262144", "embedding.B=256", "embedding.d=16", "model.max_labels=16", "learner.device=cpu",
        "learner.nb_cells=262144")


def mixed_stream() -> list[dict]:
    """Texts the kernel takes and texts it leaves (non-ASCII, a long token), token lists,
    an empty text, a record without a label, truncated texts and digits."""
    rng = random.Random(5)
    out = topic_stream(120, seed=5)
    for i in range(0, 120, 7):
        out[i] = dict(out[i], text=out[i]["text"] + " café 4u £10 " + "x" * (300 if i % 2 else 3))
    for i in range(3, 120, 11):
        out[i] = {"tokens": out[i]["text"].split(), "label": out[i]["label"]}
    out[10] = {"text": "  ", "label": "sport"}
    out[20] = {"text": "no label here"}
    out[30] = dict(out[30], text=" ".join(rng.choice(string.ascii_lowercase) for _ in range(400)))
    return out


def assert_same_arrays(a, b) -> None:
    """Two prepared batches hold the same features and Naive Bayes ids."""
    assert a.feats.keys() == b.feats.keys()
    for key in b.feats:
        np.testing.assert_array_equal(a.feats[key], b.feats[key], err_msg=key)
    if b.nb_tokens is None:
        assert a.nb_tokens is None
    else:
        np.testing.assert_array_equal(a.nb_tokens, b.nb_tokens)


@pytest.mark.parametrize("overrides", [(), ("hashing.ngrams=3", "hashing.shapes=false"), ("learner.nb_weight=0",),
                                       ("hashing.lowercase=false", "hashing.max_tokens=12")])
def test_a_learner_prepares_and_learns_the_same_with_the_kernel(overrides):
    """Every batch's arrays, rejections and truncation counts equal, and the parameters
    after the stream equal to the bit."""
    fast = Learner(Config().override(*TEXT, *overrides))
    slow = Learner(Config().override(*TEXT, *overrides))
    slow.task.prep.text_hasher = None
    assert fast.task.prep.text_hasher is not None
    records = mixed_stream()
    for i in range(0, len(records), 8):
        a, b = fast.prepare(records[i:i + 8]), slow.prepare(records[i:i + 8])
        assert_same_arrays(a, b)
        assert [(j, str(e)) for j, e in a.rejected] == [(j, str(e)) for j, e in b.rejected]
        assert a.truncated == b.truncated and a.records == b.records
        fast.learn_batch(a)
        slow.learn_batch(b)
    pa, pb = params(fast), params(slow)
    for name in pb:
        assert torch.equal(pa[name], pb[name]), name
    # queries too (frozen replay, predict, the service): the same arrays and answers
    queries = [{k: v for k, v in r.items() if k != "label"} for r in records
               if not (isinstance(r.get("text"), str) and r["text"].isspace())]  # a blank query is refused
    for i in range(0, len(queries), 16):
        assert_same_arrays(fast.prepare(queries[i:i + 16], train=False), slow.prepare(queries[i:i + 16], train=False))
    assert fast.predict_proba_many(queries) == slow.predict_proba_many(queries)
    assert fast.predict_proba_many([]) == fast.predict_many([]) == []  # was: np.concatenate of nothing


@pytest.mark.parametrize("overrides", [("learner.compiled=false",), ("embedding.scheme=bloom",),
                                       ("learner.nb_cells=1048576",), ("hashing.tokenizer=ids",)])
def test_the_kernel_is_used_only_where_nothing_reads_the_tokens_as_strings(overrides):
    """Off with torch's reference path, for another input scheme, where the Naive Bayes
    part hashes the tokens itself (D1's range under half its span) and for another tokenizer."""
    assert Learner(Config().override(*TEXT, *overrides)).task.prep.text_hasher is None
