"""Suffix decoding's host trees against brute-force substring counting (no model, no JAX)."""
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxserve.speculative.suffix_tree import Draft, SuffixCache, SuffixTree

VOCAB = 4  # a small alphabet: sequences repeat themselves, so matches are long and branch
seqs_st = st.lists(st.lists(st.integers(0, VOCAB - 1), max_size=30), min_size=1, max_size=3)


def occurrences(seqs, s) -> int:
    n = len(s)
    return sum(1 for q in seqs for i in range(len(q) - n + 1) if q[i:i + n] == list(s))


def oracle_speculate(seqs, depth, pattern, max_tokens, factor, min_prob) -> Draft:
    """The module docstring's rule, by counting substrings in the raw sequences."""
    pattern = list(pattern)[-depth:]
    best = Draft()
    for m in range(1, len(pattern) + 1):
        ctx = pattern[-m:]
        if occurrences(seqs, ctx) == 0:
            break
        tokens, probs, prob = [], [], 1.0
        while len(tokens) < min(max_tokens, math.floor(factor * m)) and len(ctx) < depth:
            counts = {c: occurrences(seqs, ctx + [c]) for c in range(VOCAB)}
            c = max((c for c in counts if counts[c]), key=lambda c: (counts[c], -c), default=None)
            if c is None:
                break
            prob *= counts[c] / occurrences(seqs, ctx)
            if prob < min_prob:
                break
            tokens.append(c)
            probs.append(prob)
            ctx = ctx + [c]
        if tokens and sum(probs) >= best.score:
            best = Draft(tuple(tokens), tuple(probs), sum(probs), m)
    return best


def tree_counts(tree: SuffixTree) -> dict[tuple[int, ...], int]:
    out, stack = {}, [((), tree.root)]
    while stack:
        path, node = stack.pop()
        for t, child in node.children.items():
            out[path + (t,)] = child.count
            stack.append((path + (t,), child))
    return out


def brute_counts(seqs, depth) -> dict[tuple[int, ...], int]:
    subs = {tuple(q[i:j]) for q in seqs for i in range(len(q)) for j in range(i + 1, min(i + depth, len(q)) + 1)}
    return {s: occurrences(seqs, s) for s in subs}


@settings(max_examples=60, deadline=None)
@given(seqs=seqs_st, depth=st.integers(1, 6), data=st.data())
def test_every_short_substring_is_a_node_counting_its_occurrences_however_tokens_arrive(seqs, depth, data):
    tree = SuffixTree(depth)
    for i, q in enumerate(seqs):  # appended in random chunks: the incremental update
        at = 0
        while at < len(q):
            step = data.draw(st.integers(1, len(q) - at))
            tree.extend(i, q[at:at + step])
            at += step
    assert tree_counts(tree) == brute_counts(seqs, depth)
    assert [tree.num_tokens(i) for i in range(len(seqs))] == [len(q) for q in seqs]


@settings(max_examples=40, deadline=None)
@given(seqs=seqs_st, depth=st.integers(1, 6), drop=st.integers(0, 2))
def test_removing_a_sequence_leaves_the_tree_of_the_others(seqs, depth, drop):
    tree = SuffixTree(depth)
    for i, q in enumerate(seqs):
        tree.extend(i, q)
    drop = drop % len(seqs)
    tree.remove(drop)
    rest = [q for i, q in enumerate(seqs) if i != drop]
    assert tree_counts(tree) == brute_counts(rest, depth) and drop not in tree


@settings(max_examples=80, deadline=None)
@given(seqs=seqs_st, pattern=st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=10),
       depth=st.integers(2, 8), max_tokens=st.integers(1, 6), factor=st.sampled_from([0.5, 1.0, 2.0]),
       min_prob=st.sampled_from([0.0, 0.1, 0.4]))
def test_speculation_equals_the_brute_force_rule(seqs, pattern, depth, max_tokens, factor, min_prob):
    tree = SuffixTree(depth)
    for i, q in enumerate(seqs):
        tree.extend(i, q)
    got = tree.speculate(pattern, max_tokens, factor, min_prob)
    assert got == oracle_speculate(seqs, depth, pattern, max_tokens, factor, min_prob)
    assert len(got.tokens) <= min(max_tokens, math.floor(factor * got.match_len))
    own = SuffixTree(depth)  # a request's own tree drafts from its open suffixes, with no matching
    own.extend("r", seqs[0] + pattern)
    assert own.speculate_own("r", max_tokens, factor, min_prob) == own.speculate(seqs[0] + pattern, max_tokens,
                                                                                factor, min_prob)


def test_longer_matches_draft_further_and_score_by_frequency():
    tree = SuffixTree(16)
    tree.extend("a", [1, 2, 3, 4, 5, 6, 7, 8, 0, 9, 9, 3, 4, 0])
    # [3, 4] occurs twice, followed by 5 and by 0: the smaller token, 0 (p = 1/2), and the longer match
    # of equal score
    assert tree.speculate([3, 4], 8) == Draft((0,), (0.5,), 0.5, 2)
    # the longer context [2, 3, 4] occurs once: a sure path, and up to 3 tokens (factor 1 x match 3)
    d = tree.speculate([2, 3, 4], 8)
    assert d == Draft((5, 6, 7), (1.0, 1.0, 1.0), 3.0, 3)
    assert tree.speculate([2, 3, 4], 8, spec_factor=2.0).tokens == (5, 6, 7, 8, 0, 9)  # factor 2: 6 tokens
    assert tree.speculate([2, 3, 4], 2).tokens == (5, 6)  # γ caps it
    assert tree.speculate([7], 8) == Draft((8,), (1.0,), 1.0, 1)  # match 1: one token
    assert tree.speculate([5, 5], 8) == Draft((6,), (1.0,), 1.0, 1)  # [5, 5] never occurs, [5] does
    assert tree.speculate([42], 8) == Draft()


def test_the_probability_floor_cuts_a_draft_where_the_history_branches():
    tree = SuffixTree(8)
    tree.extend(0, [1, 2, 3, 1, 2, 4, 1, 2, 5, 1, 2])  # after [1, 2]: 3, 4, 5 once each, and the end
    assert tree.speculate([1, 2], 4, spec_factor=2.0, min_token_prob=0.3) == Draft()  # 1/4 < 0.3
    # at 0.2: match [2] drafts 2 tokens (factor 2 x 1) of path probability 1/4 each; match [1, 2] drafts 4
    assert tree.speculate([1, 2], 4, spec_factor=2.0, min_token_prob=0.2) == Draft((3, 1, 2, 4), (0.25,) * 4, 1.0, 2)


def test_the_cache_drafts_from_earlier_outputs_and_bounds_the_global_tree():
    cache = SuffixCache(max_depth=8, max_cached_requests=2)
    cache.extend("r0", [7, 7])
    cache.finish("r0", [10, 11, 12, 13])
    cache.extend("r1", [5, 10, 11])  # its own tokens never continue [10, 11]: the global tree does
    assert cache.propose("r1", 4).tokens == (12, 13)
    assert cache.num_tokens("r1") == 3 and "r1" in cache
    cache.finish("r1", [1, 2])
    cache.finish("r2", [3, 4])  # a third output: r0's is evicted (FIFO)
    assert cache.num_cached == 2 and "r1" not in cache
    cache.extend("r3", [10, 11])
    assert cache.propose("r3", 4) == Draft()
    none = SuffixCache(max_cached_requests=0)
    none.finish("x", [1, 2, 3])
    assert none.num_cached == 0 and len(none.global_tree) == 0


@pytest.mark.parametrize("old, expected", [([4, 9, 4, 7], 8),  # both score 1/2: the request's own tree
                                           ([4, 9], 9)])  # the global tree's 1 beats 1/2
def test_the_better_scoring_tree_drafts_and_the_requests_own_wins_a_tie(old, expected):
    cache = SuffixCache(max_depth=8)
    cache.finish("old", old)
    cache.extend("new", [4, 8, 4])  # its own [4] -> 8 once in two occurrences: 1/2
    assert cache.propose("new", 1).tokens == (expected,)


@pytest.mark.parametrize("kwargs, message", [
    (dict(max_depth=0), "SuffixCache.max_depth must be an int >= 1, got 0"),
    (dict(max_cached_requests=-1), "SuffixCache.max_cached_requests must be an int >= 0, got -1"),
    (dict(spec_factor=0.0), "SuffixCache.spec_factor must be a finite number > 0, got 0.0"),
    (dict(min_token_prob=float("nan")), "SuffixCache.min_token_prob must be a number in \\[0, 1\\], got nan"),
])
def test_bad_settings_raise_naming_the_field(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SuffixCache(**kwargs)
