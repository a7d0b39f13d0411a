"""Block manager unit tests: slots, copy-on-write, prefix cache, eviction order, errors."""
import random

import pytest

from jaxserve.cache.block_manager import BlockManager, NoFreeBlocksError


def filled(bm, seq_id, tokens, cache=True):
    """Allocates, gives slots to every uncached token, and publishes the full blocks."""
    cached = bm.allocate(seq_id, tokens)
    copies = bm.append_slots(seq_id, len(tokens) - cached)
    if cache:
        bm.cache_blocks(seq_id, tokens, len(tokens))
    bm.check_invariants()
    return cached, copies


def test_slots_follow_the_block_table():
    bm = BlockManager(num_blocks=8, block_size=4)
    filled(bm, 0, list(range(10)))
    table = bm.get_block_table(0)
    assert len(table) == 3 and bm.num_used == 3 and bm.num_free == 5
    assert [bm.slot(0, p) for p in range(10)] == [table[p // 4] * 4 + p % 4 for p in range(10)]
    with pytest.raises(ValueError, match="position 10"):
        bm.slot(0, 10)
    bm.free(0)
    bm.check_invariants()
    assert bm.num_free == 8


def test_fork_shares_partial_block_and_first_writer_copies():
    bm = BlockManager(num_blocks=8, block_size=4, enable_prefix_caching=False)
    filled(bm, 0, list(range(6)))  # blocks: one full, one holding 2 of 4 slots
    bm.fork(0, 1)
    parent_table = bm.get_block_table(0)
    assert bm.get_block_table(1) == parent_table
    assert all(bm.ref_count(b) == 2 for b in parent_table)
    used = bm.num_used

    copies = bm.append_slots(1, 1)  # the child writes first: it gets the copy
    bm.check_invariants()
    child_table = bm.get_block_table(1)
    assert copies == [(parent_table[1], child_table[1])]
    assert child_table[0] == parent_table[0] and child_table[1] != parent_table[1]
    assert bm.get_block_table(0) == parent_table  # the other owner keeps its block
    assert bm.num_used == used + 1

    assert bm.append_slots(0, 1) == []  # now the sole owner: writes in place
    assert bm.get_block_table(0) == parent_table
    bm.free(0), bm.free(1)
    bm.check_invariants()
    assert bm.num_free == 8


def test_fork_at_block_boundary_needs_no_copy():
    bm = BlockManager(num_blocks=8, block_size=4)
    filled(bm, 0, list(range(8)))
    bm.fork(0, 1)
    assert bm.append_slots(0, 3) == [] and bm.append_slots(1, 3) == []
    assert bm.get_block_table(0)[:2] == bm.get_block_table(1)[:2]
    assert bm.get_block_table(0)[2] != bm.get_block_table(1)[2]
    bm.check_invariants()


def test_out_of_blocks_raises_and_changes_nothing():
    bm = BlockManager(num_blocks=3, block_size=4, enable_prefix_caching=False)
    filled(bm, 0, list(range(6)))
    bm.fork(0, 1)
    filled(bm, 2, list(range(3)))  # pool now full: 2 shared + 1
    before = (bm.get_block_table(0), bm.get_block_table(1), bm.stats())
    assert not bm.can_append_slots(0, 1)  # COW of the shared partial block needs a block
    with pytest.raises(NoFreeBlocksError, match="needs 1 blocks"):
        bm.append_slots(0, 1)
    assert (bm.get_block_table(0), bm.get_block_table(1), bm.stats()) == before
    bm.check_invariants()


def test_prefix_hits_share_full_blocks_and_leave_one_token():
    bm = BlockManager(num_blocks=16, block_size=4)
    a = list(range(100, 112))
    filled(bm, 0, a)
    assert bm.num_cached == 3
    assert bm.can_allocate(a[:8] + [1, 2, 3])
    cached, _ = filled(bm, 1, a[:8] + [1, 2, 3])
    assert cached == 8 and bm.get_block_table(1)[:2] == bm.get_block_table(0)[:2]
    assert bm.ref_count(bm.get_block_table(0)[0]) == 2
    # The whole prompt is cached, but its last token must still run to give logits.
    assert bm.num_cached_tokens(a) == 8 and bm.num_cached_tokens(a + [5]) == 12
    assert bm.num_cached_tokens([7] + a[1:]) == 0  # first block differs: no hit at all
    s = bm.stats()
    assert (s.prefix_hit_tokens, s.prefix_query_tokens) == (8, 23)


def test_freed_cached_blocks_are_reused_until_evicted():
    bm = BlockManager(num_blocks=4, block_size=4)
    a = list(range(9))
    filled(bm, 0, a)
    bm.free(0)
    bm.check_invariants()
    assert bm.num_free == 4 and bm.num_cached == 2 and bm.stats().num_evictable == 2
    cached, _ = filled(bm, 1, a)
    assert cached == 8 and bm.num_used == 3
    bm.free(1)
    filled(bm, 2, list(range(50, 66)), cache=False)  # needs all four blocks: evicts both
    assert bm.num_cached == 0 and bm.num_cached_tokens(a) == 0


def test_lru_eviction_order():
    bm = BlockManager(num_blocks=4, block_size=2)
    a, b = [1, 2, 3, 4, 9], [5, 6, 7, 8, 9]
    for sid, toks in ((0, a), (1, b)):
        bm.allocate(sid, toks)
        bm.append_slots(sid, 4)
        bm.cache_blocks(sid, toks, 4)
    bm.free(0)
    bm.free(1)
    a_head, a_tail = 0, 1
    # Re-using a's head refreshes it: it becomes the most recently freed.
    assert bm.allocate(2, a[:2] + [9]) == 2
    bm.free(2)
    order = []
    for sid in range(3, 7):
        bm.allocate(sid, [])
        bm.append_slots(sid, 1)
        order += bm.get_block_table(sid)
        bm.check_invariants()
    # a's tail, then b's tail before b's head (a sequence's tail goes first), then a's head.
    assert order == [a_tail, 3, 2, a_head]


def test_forced_hash_collisions_are_verified():
    bm = BlockManager(num_blocks=16, block_size=2, hash_fn=lambda parent, tokens: 0)
    x, y, w = [1, 2], [3, 4], [5, 6]
    filled(bm, 0, x + y + [0])
    filled(bm, 1, w + y + [0])  # same second block after a different first block
    t0, t1 = bm.get_block_table(0), bm.get_block_table(1)
    assert t0[1] != t1[1]  # the second blocks are different blocks with the same hash
    cached, _ = filled(bm, 2, w + y + [7])
    assert cached == 4 and bm.get_block_table(2)[:2] == t1[:2]
    cached, _ = filled(bm, 3, x + y + [7])
    assert cached == 4 and bm.get_block_table(3)[:2] == t0[:2]
    assert bm.num_cached_tokens(y + y + [7]) == 0
    assert bm.num_cached_tokens(x + w + [7]) == 2


def test_prefix_caching_off_never_hits():
    bm = BlockManager(num_blocks=8, block_size=4, enable_prefix_caching=False)
    a = list(range(9))
    filled(bm, 0, a)
    assert filled(bm, 1, a)[0] == 0 and bm.num_cached == 0
    bm.free(0)
    bm.free(1)
    bm.check_invariants()
    assert bm.stats().num_evictable == 0


def test_truncate_into_a_cached_block_does_not_corrupt_the_cache():
    bm = BlockManager(num_blocks=8, block_size=4)
    a = list(range(8))
    filled(bm, 0, a + [8])
    cached_block = bm.get_block_table(0)[1]
    bm.truncate(0, 6)  # a rejected speculative tail, say
    bm.check_invariants()
    assert bm.num_slots(0) == 6 and len(bm.get_block_table(0)) == 2
    assert bm.append_slots(0, 1) == []  # sole owner writes in place, so the cache forgets it
    assert bm.num_cached_tokens(a + [8]) == 4
    bm.check_invariants()
    filled(bm, 1, a + [9])
    bm.truncate(1, 5)
    shared = bm.get_block_table(1)[1]
    bm.fork(1, 2)
    copies = bm.append_slots(1, 1)
    assert copies == [(shared, bm.get_block_table(1)[1])] and cached_block != shared
    bm.check_invariants()


def test_errors_name_the_offending_value():
    bm = BlockManager(num_blocks=4, block_size=4)
    with pytest.raises(ValueError, match="unknown sequence id 7"):
        bm.free(7)
    bm.allocate(1, [1, 2])
    with pytest.raises(ValueError, match="sequence 1 is already allocated"):
        bm.allocate(1, [1, 2])
    with pytest.raises(ValueError, match="truncate sequence 1 with 0 slots to 3"):
        bm.truncate(1, 3)
    with pytest.raises(ValueError, match="num_blocks and block_size"):
        BlockManager(num_blocks=0)


def test_check_invariants_catches_a_leak():
    bm = BlockManager(num_blocks=4, block_size=4)
    filled(bm, 0, list(range(5)))
    bm._ref[bm.get_block_table(0)[0]] += 1  # a leaked reference
    with pytest.raises(AssertionError, match="refcount"):
        bm.check_invariants()


def test_can_allocate_counts_evictable_hits_as_taken():
    rng = random.Random(0)
    bm = BlockManager(num_blocks=3, block_size=4)
    a = [rng.randrange(100) for _ in range(9)]
    filled(bm, 0, a)
    bm.free(0)  # two cached blocks evictable, one plain free
    # Hits on both cached blocks + 1 new token needs the third block: fits exactly.
    assert bm.can_allocate(a, 1)
    # Two hits (taken from the free count) + 5 new tokens need 2 more blocks: does not fit.
    assert not bm.can_allocate(a[:8] + [1, 2, 3, 4, 5], 5)
    assert bm.can_allocate(list(range(12)))
    assert not bm.can_allocate(list(range(13)))


def test_reset_prefix_cache_forgets_every_prefix_only_when_idle():
    bm = BlockManager(num_blocks=8, block_size=4)
    tokens = list(range(12))
    filled(bm, 0, tokens)
    assert not bm.reset_prefix_cache()  # a sequence holds blocks: nothing changes
    assert bm.num_cached == 3 and bm.get_block_table(0)
    bm.free(0)
    assert bm.reset_prefix_cache()
    bm.check_invariants()
    assert bm.num_cached == 0 and bm.num_free == 8
    assert filled(bm, 1, tokens)[0] == 0  # no hit: the prefill runs again
    assert bm.get_block_table(1) == [0, 1, 2]  # the fresh pool's order: the same memory as a first run
