"""Prefix-cache index: content hashes of full KV blocks and the LRU evictor (host, no JAX).

A full block is identified by a hash chained over its parent block's hash and its own token
ids, so equal hashes mean "same tokens after the same prefix" with overwhelming probability.
The index never trusts a hash alone: each cached block keeps its token ids and a *content
uid* of its parent (a never-reused integer naming one verified prefix), and a hit must match
both. A forced collision (tests pass ``hash_fn=lambda parent, tokens: 0``) therefore only
makes lookups slower, never wrong.

``PrefixCache`` owns: hash -> bucket of block ids, per-block (hash, uid, parent uid, tokens),
and the evictor, an ordered set of cached blocks nobody references, evicted oldest first.
The block manager owns reference counts and decides when a block enters or leaves here.
"""
from __future__ import annotations

import hashlib
import itertools
from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable, Hashable, Sequence

import numpy as np

HashFn = Callable[[Hashable, tuple[int, ...]], Hashable]


def sha256_block_hash(parent_hash: Hashable, token_ids: tuple[int, ...]) -> bytes:
    """Default chained hash: sha256(parent digest || int64 token ids); the root parent is None."""
    h = hashlib.sha256(b"" if parent_hash is None else bytes(parent_hash))
    h.update(np.asarray(token_ids, dtype=np.int64).tobytes())
    return h.digest()


@dataclass(slots=True)
class CachedBlock:
    hash: Hashable
    uid: int  # names this block's content (prefix + tokens); never reused
    parent_uid: int | None  # None for the first block of a sequence
    token_ids: tuple[int, ...]


class PrefixCache:
    """Hash index of full blocks plus the LRU evictor of unreferenced cached blocks."""

    def __init__(self, hash_fn: HashFn = sha256_block_hash):
        self.hash_fn = hash_fn
        self.blocks: dict[int, CachedBlock] = {}  # block id -> its cached content
        self.buckets: dict[Hashable, list[int]] = {}  # hash -> block ids (several on collision)
        self.evictor: OrderedDict[int, None] = OrderedDict()  # first = evicted first
        self._uids = itertools.count()

    def find(self, parent_hash: Hashable, parent_uid: int | None,
             token_ids: tuple[int, ...]) -> tuple[int | None, Hashable]:
        """Returns (block id or None, hash) of the verified block for these tokens after parent."""
        h = self.hash_fn(parent_hash, token_ids)
        for bid in self.buckets.get(h, ()):
            c = self.blocks[bid]
            if c.parent_uid == parent_uid and c.token_ids == token_ids:
                return bid, h
        return None, h

    def insert(self, block_id: int, h: Hashable, parent_uid: int | None,
               token_ids: tuple[int, ...]) -> int:
        """Registers a freshly computed full block; returns its content uid."""
        uid = next(self._uids)
        self.blocks[block_id] = CachedBlock(h, uid, parent_uid, token_ids)
        self.buckets.setdefault(h, []).append(block_id)
        return uid

    def remove(self, block_id: int) -> None:
        """Forgets a block's content (on eviction, or before its slots are overwritten)."""
        c = self.blocks.pop(block_id)
        bucket = self.buckets[c.hash]
        bucket.remove(block_id)
        if not bucket:
            del self.buckets[c.hash]
        self.evictor.pop(block_id, None)

    def evict_lru(self) -> int:
        """Pops the least recently freed cached block and forgets its content."""
        block_id, _ = self.evictor.popitem(last=False)
        self.remove(block_id)
        return block_id

    def __contains__(self, block_id: int) -> bool:
        return block_id in self.blocks

    def check(self) -> None:
        """Asserts the index is self-consistent (used by BlockManager.check_invariants)."""
        listed = [b for bucket in self.buckets.values() for b in bucket]
        assert sorted(listed) == sorted(self.blocks), "hash buckets disagree with cached blocks"
        for h, bucket in self.buckets.items():
            assert bucket, f"empty bucket for hash {h!r}"
            for b in bucket:
                assert self.blocks[b].hash == h, f"block {b} filed under the wrong hash"
        uids = [c.uid for c in self.blocks.values()]
        assert len(uids) == len(set(uids)), "content uid shared by two cached blocks"
        assert all(b in self.blocks for b in self.evictor), "evictor holds an uncached block"
