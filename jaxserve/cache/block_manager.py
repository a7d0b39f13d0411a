"""Block manager: the host-side map from sequences to physical KV blocks (no JAX).

Owns a fixed pool of ``num_blocks`` blocks of ``block_size`` token slots, and for every live
sequence a block table (``list[int]`` of physical block ids, logical block i -> table[i]) and
a slot count (positions ``[0, num_slots)`` have a slot; position p lives in flat slot
``table[p // block_size] * block_size + p % block_size``, the layout of ``cache.kv_pool``).

Sharing. Blocks carry reference counts. ``fork`` shares every block, the partial last one
included; the first sequence that writes into a shared block gets a fresh copy, and
``append_slots`` returns the ``(src, dst)`` block copies the device must perform *before* the
step writes new K/V (apply them as one gather then scatter, ``pool[dst] = pool[src]``; dsts
are distinct fresh blocks). Full blocks are never written again, so they are shared for free.

Prefix caching (``enable_prefix_caching``). ``cache_blocks`` registers a sequence's full,
computed blocks in a ``PrefixCache`` under a hash chained over the parent's hash and the
block's tokens; ``allocate`` reuses the longest verified cached prefix. A cached block whose
last reference goes away stays in the evictor with its content, reusable until a new
allocation evicts it, least recently freed first (a sequence's tail blocks go first).

Life of a sequence (the scheduler drives this)::

    n_cached = bm.allocate(seq_id, token_ids)       # prefix hits, no new blocks
    copies = bm.append_slots(seq_id, n)             # slots for the next n positions (+ COW)
    ... device step writes K/V at bm.slot(seq_id, p) ...
    bm.cache_blocks(seq_id, token_ids, num_computed)  # publish the now-full blocks
    bm.fork(seq_id, child_id); bm.truncate(seq_id, n); bm.free(seq_id)

Out of blocks: ``append_slots`` raises ``NoFreeBlocksError`` and changes nothing; ask first
with ``can_append_slots`` / ``can_allocate``. "Free" blocks (``num_free``) are the never- or
no-longer-cached free list plus the evictor: both can be handed out.
"""
from __future__ import annotations

from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Hashable, Sequence

from jaxserve.cache.prefix_cache import HashFn, PrefixCache, sha256_block_hash


def table_slots(table: Sequence[int], start: int, stop: int, block_size: int) -> list[int]:
    """Flat KV slots of positions ``[start, stop)`` through a block table (the module docstring's layout)."""
    return [table[p // block_size] * block_size + p % block_size for p in range(start, stop)]


class NoFreeBlocksError(RuntimeError):
    """Raised by ``append_slots`` when the pool cannot supply the blocks; no state changed."""


@dataclass(frozen=True)
class BlockManagerStats:
    num_blocks: int
    num_free: int  # free list + evictable cached blocks
    num_used: int  # referenced by at least one block table
    num_cached: int  # holding registered prefix-cache content (used or evictable)
    num_evictable: int
    prefix_hit_tokens: int  # tokens served from the prefix cache by ``allocate``
    prefix_query_tokens: int  # tokens looked up by ``allocate``

    @property
    def prefix_hit_rate(self) -> float:
        return self.prefix_hit_tokens / self.prefix_query_tokens if self.prefix_query_tokens else 0.0


@dataclass
class _SeqBlocks:
    table: list[int] = field(default_factory=list)
    num_slots: int = 0
    hashes: list[Hashable] = field(default_factory=list)  # of the first len(uids) full blocks
    uids: list[int] = field(default_factory=list)  # content uids of those blocks


class BlockManager:
    """Paged KV bookkeeping: free list, block tables, refcounts, COW, prefix cache."""

    def __init__(self, num_blocks: int, block_size: int = 16, enable_prefix_caching: bool = True,
                 hash_fn: HashFn = sha256_block_hash):
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"num_blocks and block_size must be >= 1, got {num_blocks}, {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self._ref = [0] * num_blocks
        self._num_used = 0
        self._free: deque[int] = deque(range(num_blocks))  # uncached free blocks
        self._cache = PrefixCache(hash_fn)
        self._seqs: dict[int, _SeqBlocks] = {}
        self._hit_tokens = 0
        self._query_tokens = 0

    # ---- queries -------------------------------------------------------------------------

    @property
    def num_free(self) -> int:
        return len(self._free) + len(self._cache.evictor)

    @property
    def num_used(self) -> int:
        return self._num_used

    @property
    def num_cached(self) -> int:
        return len(self._cache.blocks)

    def stats(self) -> BlockManagerStats:
        return BlockManagerStats(self.num_blocks, self.num_free, self.num_used, self.num_cached,
                                 len(self._cache.evictor), self._hit_tokens, self._query_tokens)

    def blocks_for(self, num_tokens: int) -> int:
        """Blocks that hold ``num_tokens`` slots."""
        return -(-num_tokens // self.block_size)

    def has_seq(self, seq_id: int) -> bool:
        return seq_id in self._seqs

    def get_block_table(self, seq_id: int) -> list[int]:
        return list(self._state(seq_id).table)

    def num_slots(self, seq_id: int) -> int:
        return self._state(seq_id).num_slots

    def ref_count(self, block_id: int) -> int:
        return self._ref[block_id]

    def slot(self, seq_id: int, position: int) -> int:
        """Flat KV slot (block * block_size + offset) of ``position`` in the sequence."""
        st = self._state(seq_id)
        if not 0 <= position < st.num_slots:
            raise ValueError(f"position {position} has no slot in sequence {seq_id} "
                             f"(num_slots={st.num_slots})")
        return table_slots(st.table, position, position + 1, self.block_size)[0]

    def num_cached_tokens(self, token_ids: Sequence[int]) -> int:
        """Tokens of ``token_ids`` that ``allocate`` would serve from the cache (no side effects)."""
        return len(self._match(token_ids)) * self.block_size

    def can_allocate(self, token_ids: Sequence[int], num_new_tokens: int | None = None) -> bool:
        """Whether ``allocate(token_ids)`` then ``append_slots(num_new_tokens)`` would succeed.

        ``num_new_tokens`` defaults to every token not served by the prefix cache.
        """
        hits = self._match(token_ids)
        num_cached = len(hits) * self.block_size
        if num_new_tokens is None:
            num_new_tokens = len(token_ids) - num_cached
        # Hits sitting in the evictor count as free now but stop being free once taken.
        taken = sum(1 for b, _, _ in hits if self._ref[b] == 0)
        new = self.blocks_for(num_cached + num_new_tokens) - len(hits)
        return new + taken <= self.num_free

    def can_append_slots(self, seq_id: int, num_new_tokens: int) -> bool:
        return self._blocks_needed(self._state(seq_id), num_new_tokens) <= self.num_free

    # ---- mutations -----------------------------------------------------------------------

    def allocate(self, seq_id: int, token_ids: Sequence[int]) -> int:
        """Registers ``seq_id`` and takes references on its cached prefix.

        Returns the number of leading tokens whose K/V is already in the pool (a multiple of
        block_size, at most ``len(token_ids) - 1`` so the last token is always computed and
        yields logits). Never allocates fresh blocks, so it cannot run out of them.
        """
        if seq_id in self._seqs:
            raise ValueError(f"sequence {seq_id} is already allocated")
        hits = self._match(token_ids)
        st = _SeqBlocks()
        for b, h, uid in hits:
            self._incref(b)
            st.table.append(b)
            st.hashes.append(h)
            st.uids.append(uid)
        st.num_slots = len(hits) * self.block_size
        self._seqs[seq_id] = st
        if self.enable_prefix_caching:
            self._hit_tokens += st.num_slots
            self._query_tokens += len(token_ids)
        return st.num_slots

    def append_slots(self, seq_id: int, num_new_tokens: int) -> list[tuple[int, int]]:
        """Gives slots to positions ``[num_slots, num_slots + num_new_tokens)``.

        Returns the ``(src, dst)`` block copies to perform before the step (copy-on-write of a
        shared partial last block). Raises ``NoFreeBlocksError`` without changing anything if
        the pool is short.
        """
        st = self._state(seq_id)
        if num_new_tokens < 0:
            raise ValueError(f"num_new_tokens must be >= 0, got {num_new_tokens}")
        need = self._blocks_needed(st, num_new_tokens)
        if need > self.num_free:
            raise NoFreeBlocksError(f"sequence {seq_id} needs {need} blocks for {num_new_tokens} "
                                    f"tokens, {self.num_free} free")
        copies = []
        if num_new_tokens and st.num_slots % self.block_size:
            last = st.table[-1]
            if self._ref[last] > 1:
                dst = self._alloc_block()
                st.table[-1] = dst
                self._decref(last)
                copies.append((last, dst))
            elif last in self._cache:
                # Only after truncate: a sole owner may overwrite, but the cache must forget it.
                self._cache.remove(last)
        while len(st.table) * self.block_size < st.num_slots + num_new_tokens:
            st.table.append(self._alloc_block())
        st.num_slots += num_new_tokens
        return copies

    def cache_blocks(self, seq_id: int, token_ids: Sequence[int], num_computed_tokens: int) -> None:
        """Publishes the sequence's full blocks among its first ``num_computed_tokens`` tokens.

        Call after the device step has written their K/V; ``token_ids`` are the sequence's
        tokens (at least ``num_computed_tokens`` of them). A no-op without prefix caching.
        """
        if not self.enable_prefix_caching:
            return
        st = self._state(seq_id)
        bs = self.block_size
        num_full = min(num_computed_tokens, st.num_slots, len(token_ids)) // bs
        for i in range(len(st.uids), num_full):
            toks = tuple(int(t) for t in token_ids[i * bs:(i + 1) * bs])
            parent_hash, parent_uid = (st.hashes[-1], st.uids[-1]) if i else (None, None)
            found, h = self._cache.find(parent_hash, parent_uid, toks)
            if found is None:
                assert st.table[i] not in self._cache, f"block {st.table[i]} cached with other content"
                uid = self._cache.insert(st.table[i], h, parent_uid, toks)
            else:  # same content already cached (maybe this very block): adopt its identity
                uid = self._cache.blocks[found].uid
            st.hashes.append(h)
            st.uids.append(uid)

    def fork(self, parent_id: int, child_id: int) -> None:
        """Gives ``child_id`` the parent's block table, sharing every block (COW on write)."""
        parent = self._state(parent_id)
        if child_id in self._seqs:
            raise ValueError(f"sequence {child_id} is already allocated")
        for b in parent.table:
            self._incref(b)
        self._seqs[child_id] = _SeqBlocks(list(parent.table), parent.num_slots,
                                          list(parent.hashes), list(parent.uids))

    def truncate(self, seq_id: int, num_tokens: int) -> None:
        """Shrinks the sequence to ``num_tokens`` slots (e.g. rejected speculative tokens)."""
        st = self._state(seq_id)
        if not 0 <= num_tokens <= st.num_slots:
            raise ValueError(f"cannot truncate sequence {seq_id} with {st.num_slots} slots "
                             f"to {num_tokens}")
        keep = self.blocks_for(num_tokens)
        for b in reversed(st.table[keep:]):
            self._decref(b)
        del st.table[keep:]
        st.num_slots = num_tokens
        del st.hashes[num_tokens // self.block_size:]
        del st.uids[num_tokens // self.block_size:]

    def free(self, seq_id: int) -> None:
        """Drops the sequence and its references; cached blocks go to the evictor."""
        st = self._state(seq_id)
        del self._seqs[seq_id]
        # Tail first: the evictor evicts in insertion order, and a prompt's tail is the part
        # least likely to be shared by the next request.
        for b in reversed(st.table):
            self._decref(b)

    # ---- invariants ----------------------------------------------------------------------

    def reset_prefix_cache(self) -> bool:
        """Forgets every cached block and restores the fresh pool's free order, as vLLM's ``reset_prefix_cache``:
        only when no sequence holds blocks (returns False, changing nothing, otherwise). Benchmarks call it between
        runs of one workload, whose repeated prompts would otherwise skip their prefill from the second run on."""
        if self._seqs or self._num_used:
            return False
        self._cache = PrefixCache(self._cache.hash_fn)
        self._free = deque(range(self.num_blocks))
        return True

    def check_invariants(self) -> None:
        """Asserts the accounting holds; tests call it after every operation."""
        refs = Counter(b for st in self._seqs.values() for b in st.table)
        free, evictable = set(self._free), set(self._cache.evictor)
        assert len(free) == len(self._free), "duplicate block in the free list"
        assert not free & evictable, "block both in free list and evictor"
        for b in range(self.num_blocks):
            assert self._ref[b] == refs[b], f"block {b}: refcount {self._ref[b]} != {refs[b]} refs"
            if self._ref[b]:
                assert b not in free and b not in evictable, f"block {b} free but referenced"
            else:
                assert (b in free) != (b in evictable), f"block {b} lost (neither free nor evictable)"
            assert (b in evictable) <= (b in self._cache), f"evictable block {b} not cached"
            assert (b in free) <= (b not in self._cache), f"free-list block {b} still cached"
        used = sum(1 for r in self._ref if r)
        assert used == self._num_used, f"used counter {self._num_used} != {used}"
        assert self.num_free + self.num_used == self.num_blocks, "free + used != total"
        for sid, st in self._seqs.items():
            assert len(st.table) == self.blocks_for(st.num_slots), f"seq {sid}: table/slots mismatch"
            assert len(set(st.table)) == len(st.table), f"seq {sid}: block listed twice"
            assert len(st.hashes) == len(st.uids) <= st.num_slots // self.block_size
            for b, uid in zip(st.table, st.uids):
                if b in self._cache:
                    assert self._cache.blocks[b].uid == uid, f"seq {sid}: block {b} uid mismatch"
        if not self.enable_prefix_caching:
            assert not self._cache.blocks, "blocks cached with prefix caching off"
        self._cache.check()

    # ---- internals -----------------------------------------------------------------------

    def _state(self, seq_id: int) -> _SeqBlocks:
        try:
            return self._seqs[seq_id]
        except KeyError:
            raise ValueError(f"unknown sequence id {seq_id}") from None

    def _match(self, token_ids: Sequence[int]) -> list[tuple[int, Hashable, int]]:
        """Longest verified cached prefix as (block, hash, uid), leaving >= 1 token to compute."""
        if not self.enable_prefix_caching:
            return []
        bs = self.block_size
        hits: list[tuple[int, Hashable, int]] = []
        parent_hash, parent_uid = None, None
        for i in range((len(token_ids) - 1) // bs):
            toks = tuple(int(t) for t in token_ids[i * bs:(i + 1) * bs])
            b, h = self._cache.find(parent_hash, parent_uid, toks)
            if b is None:
                break
            parent_hash, parent_uid = h, self._cache.blocks[b].uid
            hits.append((b, h, parent_uid))
        return hits

    def _blocks_needed(self, st: _SeqBlocks, num_new_tokens: int) -> int:
        if num_new_tokens <= 0:
            return 0
        new = self.blocks_for(st.num_slots + num_new_tokens) - len(st.table)
        cow = bool(st.num_slots % self.block_size) and self._ref[st.table[-1]] > 1
        return new + int(cow)

    def _alloc_block(self) -> int:
        if self._free:
            b = self._free.popleft()
        elif self._cache.evictor:
            b = self._cache.evict_lru()
        else:
            raise NoFreeBlocksError("no free KV blocks")
        self._ref[b] = 1
        self._num_used += 1
        return b

    def _incref(self, b: int) -> None:
        if self._ref[b] == 0:
            self._cache.evictor.pop(b)  # a hit revives an evictable block
            self._num_used += 1
        self._ref[b] += 1

    def _decref(self, b: int) -> None:
        self._ref[b] -= 1
        if self._ref[b] == 0:
            self._num_used -= 1
            if b in self._cache:
                self._cache.evictor[b] = None
            else:
                self._free.append(b)
