"""Suffix decoding's drafts (SuffixDecoding, Oliaro et al. 2024), on the host: no JAX.

``SuffixTree`` is a depth-bounded suffix trie over one or more token sequences: every substring of
length <= ``max_depth`` of every sequence is a path from the root, and each node counts the
occurrences of its substring. Appending a token to a sequence extends the paths of its last
``max_depth`` suffixes (O(max_depth) per token); removing a sequence walks its suffixes back down.

``SuffixTree.speculate(pattern)`` drafts the continuation of the sequence that ends in ``pattern``:
for every match length m (the last m tokens of the pattern as a path from the root; a longer suffix
matches only if a shorter one does), it follows the most frequent child from the match node while
the estimated path probability (the product of child count / node count, the tree's empirical
next-token frequencies) stays >= ``min_token_prob``, and at most ``floor(spec_factor * m)`` tokens
(the paper's adaptive speculation length: the longer the context that matched, the further the draft
reaches). The candidate's score is the sum of its tokens' path probabilities (the expected number of
tokens accepted if the frequencies were the target's); the best-scoring candidate over match lengths
wins, the longer match on a tie.

``SuffixCache`` holds the paper's two trees: one per live request over its prompt and outputs so far
(keyed by the caller: a sequence id), and a global one over the outputs of finished requests, bounded
to the ``max_cached_requests`` most recent (FIFO eviction). A draft is the better-scoring of the two
trees' candidates (the request's own on a tie).
"""
from __future__ import annotations

import math
import numbers
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Hashable, Sequence

from jaxserve.validation import is_int


class _Node:
    __slots__ = ("count", "depth", "children", "best")

    def __init__(self, depth: int):
        self.count = 0  # occurrences of the node's substring (suffixes that pass through or end here)
        self.depth = depth  # the substring's length
        self.children: dict[int, _Node] = {}
        # the most frequent child's token (the smallest on a tie), kept as counts grow; None: to be found
        self.best: int | None = None

    def best_child(self) -> tuple[int, "_Node"] | None:
        if self.best is None and self.children:
            self.best = max(self.children.items(), key=lambda kv: (kv[1].count, -kv[0]))[0]
        return None if self.best is None else (self.best, self.children[self.best])

    def counted(self, token: int, child: "_Node") -> None:
        """child (under token) gained an occurrence: it may now be the best."""
        b = self.best
        if b is not None and b != token:
            other = self.children[b].count
            if child.count > other or (child.count == other and token < b):
                self.best = token


@dataclass(frozen=True)
class Draft:
    """A speculation: tokens, each one's estimated path probability, their sum and the match length."""
    tokens: tuple[int, ...] = ()
    probs: tuple[float, ...] = ()
    score: float = 0.0
    match_len: int = 0


@dataclass
class _Seq:
    tokens: list[int] = field(default_factory=list)
    open: list[_Node] = field(default_factory=list)  # nodes of the suffixes that can still grow


class SuffixTree:
    """Depth-bounded suffix trie over sequences keyed by any hashable id."""

    def __init__(self, max_depth: int = 32):
        check_suffix_settings("SuffixTree", max_depth=max_depth)
        self.max_depth = max_depth
        self.root = _Node(0)
        self._seqs: dict[Hashable, _Seq] = {}

    def __contains__(self, seq_id: Hashable) -> bool:
        return seq_id in self._seqs

    def __len__(self) -> int:
        return len(self._seqs)

    def num_tokens(self, seq_id: Hashable) -> int:
        """Tokens held for the sequence (0 if unknown)."""
        s = self._seqs.get(seq_id)
        return 0 if s is None else len(s.tokens)

    def tail(self, seq_id: Hashable, n: int) -> list[int]:
        """The sequence's last n tokens."""
        return self._seqs[seq_id].tokens[-n:]

    def extend(self, seq_id: Hashable, tokens: Sequence[int]) -> None:
        """Appends tokens to the sequence (created empty if new)."""
        s = self._seqs.setdefault(seq_id, _Seq())
        for t in tokens:
            t = int(t)
            s.tokens.append(t)
            grown = []
            for node in s.open + [self.root]:
                child = node.children.get(t)
                if child is None:
                    child = node.children[t] = _Node(node.depth + 1)
                child.count += 1
                node.counted(t, child)
                if child.depth < self.max_depth:
                    grown.append(child)
            s.open = grown

    def remove(self, seq_id: Hashable) -> None:
        """Forgets the sequence: every suffix path is walked down again, nodes left at count 0 dropped."""
        s = self._seqs.pop(seq_id)
        toks, d = s.tokens, self.max_depth
        for i in range(len(toks)):
            node = self.root
            for t in toks[i:i + d]:
                child = node.children[t]
                child.count -= 1
                node.best = None  # found again when next asked
                if child.count == 0:  # its descendants count only this suffix's occurrences: all gone
                    del node.children[t]
                    break
                node = child

    def match(self, pattern: Sequence[int]) -> _Node | None:
        """The node of pattern (a path from the root), or None."""
        node = self.root
        for t in pattern:
            node = node.children.get(int(t))
            if node is None:
                return None
        return node

    def speculate(self, pattern: Sequence[int], max_tokens: int, spec_factor: float = 1.0,
                  min_token_prob: float = 0.1) -> Draft:
        """The best draft continuing ``pattern`` (see the module docstring); empty when nothing matches."""
        pattern = [int(t) for t in pattern[-self.max_depth:]]

        def nodes():
            for m in range(1, len(pattern) + 1):
                node = self.match(pattern[-m:])
                if node is None:
                    return  # a longer suffix contains this one: it cannot match either
                yield node
        return _best_draft(nodes(), max_tokens, spec_factor, min_token_prob)

    def speculate_own(self, seq_id: Hashable, max_tokens: int, spec_factor: float = 1.0,
                      min_token_prob: float = 0.1) -> Draft:
        """``speculate(tail of the sequence)`` without matching: its open suffixes are those nodes."""
        return _best_draft(reversed(self._seqs[seq_id].open), max_tokens, spec_factor, min_token_prob)


def _best_draft(nodes, max_tokens: int, spec_factor: float, min_token_prob: float) -> Draft:
    """The best-scoring greedy path over match nodes of lengths 1, 2, ... (the longer on a tie)."""
    best = Draft()
    for m, node in enumerate(nodes, start=1):
        cand = _greedy_path(node, min(max_tokens, math.floor(spec_factor * m)), min_token_prob, m)
        if cand.tokens and cand.score >= best.score:
            best = cand
    return best


def _greedy_path(node: _Node, limit: int, min_token_prob: float, match_len: int) -> Draft:
    """Follows the most frequent child (the smallest token on a tie) while the path probability holds."""
    tokens, probs, prob = [], [], 1.0
    while len(tokens) < limit and node.children:
        token, child = node.best_child()
        prob *= child.count / node.count
        if prob < min_token_prob:
            break
        tokens.append(token)
        probs.append(prob)
        node = child
    return Draft(tuple(tokens), tuple(probs), sum(probs), match_len)


class SuffixCache:
    """Per-request trees over prompt + outputs and a bounded global tree over finished requests' outputs.

    ``max_cached_requests``: finished outputs kept in the global tree (0: no global tree).
    """

    def __init__(self, max_depth: int = 32, max_cached_requests: int = 256, spec_factor: float = 1.0,
                 min_token_prob: float = 0.1):
        check_suffix_settings("SuffixCache", max_depth=max_depth, max_cached_requests=max_cached_requests,
                              spec_factor=spec_factor, min_token_prob=min_token_prob)
        self.max_depth, self.max_cached = max_depth, max_cached_requests
        self.spec_factor, self.min_token_prob = spec_factor, min_token_prob
        self.global_tree = SuffixTree(max_depth)
        self._local: dict[Hashable, SuffixTree] = {}
        self._cached: OrderedDict[int, None] = OrderedDict()  # global-tree ids, oldest first
        self._next_id = 0

    def __contains__(self, key: Hashable) -> bool:
        return key in self._local

    def num_tokens(self, key: Hashable) -> int:
        """Tokens of the request's tree (0 if it has none yet): what the caller has already passed."""
        tree = self._local.get(key)
        return 0 if tree is None else tree.num_tokens(0)

    def extend(self, key: Hashable, tokens: Sequence[int]) -> None:
        """Appends tokens (prompt first, then outputs as they come) to the request's tree."""
        self._local.setdefault(key, SuffixTree(self.max_depth)).extend(0, tokens)

    def propose(self, key: Hashable, max_tokens: int) -> Draft:
        """A draft of at most ``max_tokens`` continuing the request's tokens so far."""
        tree = self._local.get(key)
        if tree is None or max_tokens < 1:
            return Draft()
        best = tree.speculate_own(0, max_tokens, self.spec_factor, self.min_token_prob)
        if len(self.global_tree):
            other = self.global_tree.speculate(tree.tail(0, self.max_depth), max_tokens, self.spec_factor,
                                               self.min_token_prob)
            if other.score > best.score:
                best = other
        return best

    def finish(self, key: Hashable, output_tokens: Sequence[int] | None = None) -> None:
        """Drops the request's tree; its outputs join the global tree (the oldest evicted past the bound)."""
        self._local.pop(key, None)
        if self.max_cached == 0 or not output_tokens:
            return
        gid, self._next_id = self._next_id, self._next_id + 1
        self.global_tree.extend(gid, output_tokens)
        self._cached[gid] = None
        while len(self._cached) > self.max_cached:
            self.global_tree.remove(self._cached.popitem(last=False)[0])

    @property
    def num_cached(self) -> int:
        return len(self._cached)


_RULES = {  # setting -> (is it valid, what it must be)
    "max_depth": (lambda x: is_int(x) and x >= 1, "an int >= 1"),
    "max_cached_requests": (lambda x: is_int(x) and x >= 0, "an int >= 0"),
    "spec_factor": (lambda x: _is_real(x) and 0 < x < math.inf, "a finite number > 0"),
    "min_token_prob": (lambda x: _is_real(x) and 0 <= x <= 1, "a number in [0, 1]"),
}


def check_suffix_settings(owner: str, prefix: str = "", **values) -> None:
    """ValueError naming ``owner.<prefix><setting>`` and its value unless every setting is usable."""
    for name, value in values.items():
        ok, rule = _RULES[name]
        if not ok(value):
            raise ValueError(f"{owner}.{prefix}{name} must be {rule}, got {value!r}")


def _is_real(x) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, bool) and not math.isnan(x)
