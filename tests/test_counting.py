"""The counting baselines of token tasks against brute force from the counts by hand:
the incremental ranking, Markov, the Kneser-Ney trigram and the two-sided n-gram."""
import random
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamlearn.objectives import BOS_TOKEN as BOS
from streamlearn.objectives import EOS_TOKEN as EOS
from streamlearn.replay.counting import Markov, NGram, RankedCounts
from streamlearn.tasks.base import Event


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from("abcdefgh"), max_size=60))
def test_ranked_counts_equal_a_sort_of_the_counts(items):
    ranked, seen = RankedCounts(), []
    for item in items:
        ranked.add(item)
        if item not in seen:
            seen.append(item)
    counts = Counter(items)
    assert list(ranked.ranked()) == sorted(seen, key=lambda i: (-counts[i], seen.index(i)))
    assert ranked.top(3, lambda i: i == "a") == [i for i in sorted(seen, key=lambda i: (-counts[i], seen.index(i)))
                                                  if i != "a"][:3]


def next_token_events(tokens):
    padded = [BOS, BOS, *tokens]
    for i, t in enumerate(tokens):
        u, v = padded[i], padded[i + 1]
        yield Event(i, None, t, True, None, prev=tokens[i - 1] if i else None, left=(u, v), counts=(t,),
                    transitions=((tokens[i - 1], t),) if i else (), ngrams=((u, v, t),))


def kn_trigram(trigrams, u, v, vocab_order):
    """Interpolated Kneser-Ney by hand, from the list of trigrams seen (Chen & Goodman)."""
    c3 = Counter(trigrams)
    n2 = Counter((b, c) for (a, b, c) in set(trigrams))  # N1+(. v w)
    n1 = Counter(c for (b, c) in n2)  # N1+(. w)

    def discount(counts):
        cc = Counter(counts.values())
        return cc[1] / (cc[1] + 2 * cc[2]) if cc[1] + 2 * cc[2] else 0.5

    D3, D2, D1 = discount(c3), discount(n2), discount(n1)
    tot1 = sum(n1.values())

    def p1(w):
        return (max(n1[w] - D1, 0) + D1) / tot1

    row2 = {w: n for (b, w), n in n2.items() if b == v}
    tot2 = sum(row2.values())

    def p2(w):
        if not tot2:
            return p1(w)
        return max(row2.get(w, 0) - D2, 0) / tot2 + D2 * len(row2) / tot2 * p1(w)

    row3 = {w: n for (a, b, w), n in c3.items() if (a, b) == (u, v)}
    tot3 = sum(row3.values())

    def p3(w):
        if not tot3:
            return p2(w)
        return max(row3.get(w, 0) - D3, 0) / tot3 + D3 * len(row3) / tot3 * p2(w)

    return {w: p3(w) for w in vocab_order if n1[w]}


def test_kneser_ney_trigram_top_lists_equal_the_formula_by_hand():
    rng = random.Random(4)
    words = "the cat sat on a mat and dog ran far".split()
    stream = [[rng.choice(words[:rng.randint(3, 10)]) for _ in range(rng.randint(1, 9))] for _ in range(80)]
    ng, trigrams, first = NGram(k=4), [], {}
    checked = 0
    for tokens in stream:
        for e in next_token_events(tokens):
            if trigrams:
                order = sorted(first, key=first.get)
                scores = kn_trigram(trigrams, *e.left, order)
                pop = Counter(w for (b, w) in set((b, c) for (_, b, c) in trigrams))
                want = sorted(scores, key=lambda w: (-round(scores[w], 12), -pop[w], first[w]))[:4]
                assert ng.predict([e])[0] == want
                checked += 1
            ng.learn([e])
            trigrams.append(e.ngrams[0])
            for w in e.ngrams[0][2:]:
                first.setdefault(w, len(first))
    assert checked > 300


def test_two_sided_ngram_uses_both_neighbours():
    """Masked tokens: counts of (left, w, right), backing off to each side then unigrams."""
    ng = NGram(k=2)

    def masked(tokens, pos):
        padded = [BOS, BOS, *tokens, EOS]
        return Event(0, None, tokens[pos], True, None, left=tuple(padded[pos:pos + 2]), right=padded[pos + 3],
                     counts=tuple(tokens), ngrams=tuple(zip(padded[1:], padded[2:], padded[3:])))

    for tokens in (["red", "apple", "pie"], ["red", "cherry", "pie"], ["red", "apple", "pie"], ["green", "apple", "tart"]):
        ng.learn([masked(tokens, 0)])
    assert ng.predict([masked(["red", "?", "pie"], 1)]) == [["apple", "cherry"]]  # (red, pie) seen with both, apple twice
    assert ng.predict([masked(["green", "?", "tart"], 1)])[0][0] == "apple"
    assert ng.predict([masked(["?", "apple", "pie"], 0)])[0][0] == "red"  # right context only: (BOS, apple)


def test_markov_ranks_followers_then_popularity():
    m = Markov(k=3)
    for tokens in (["a", "b", "c"], ["a", "b", "d"], ["x", "c", "c"]):
        for e in next_token_events(tokens):
            m.learn([e])
    e = next(next_token_events(["a", "?"]))  # the event at position 0 has no previous token
    assert m.predict([e]) == [["c", "a", "b"]]  # popularity: c 3, then a and b 2 (a seen first)
    e = list(next_token_events(["a", "?"]))[1]
    assert m.predict([e]) == [["b", "c", "a"]]  # b followed a twice, then popularity


@pytest.mark.parametrize("k", [1, 3])
def test_ngram_on_next_item_events_skips_the_keys_own_items(k):
    """Next-item events carry the key's last two items as the n-gram context."""
    from streamlearn.config import Config
    from streamlearn.learner import Learner
    from streamlearn.records import Record

    build = Learner(Config().override("learner.task=next-item", "embedding.K=100", "embedding.B=64",
                                      "model.out_B=64")).task.events(seed=0)
    ng = NGram(k=k)
    stream = [("u1", "a"), ("u1", "b"), ("u1", "c"), ("u2", "a"), ("u2", "b"), ("u2", "d"), ("u3", "c"),
              ("u3", "a"), ("u3", "b")]
    for i, (key, item) in enumerate(stream):
        [e] = build(i, Record(key=key, item=item))
        if key == "u3" and item == "b":
            assert e.left == ("c", "a")
        ng.learn([e])
    [query] = build(len(stream), Record(key="u3", item="?"))  # u3 had c, a, b: after (a, b) came c and d
    got = ng.predict([query])[0]
    assert got[0] == "d" and not set(got) & {"a", "b", "c"} and len(got) == min(k, 1)
