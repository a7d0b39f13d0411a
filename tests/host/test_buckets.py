"""Shape buckets: every size fits a bucket, and the padding a bucket costs is bounded."""
import pytest
from hypothesis import given, strategies as st

from jaxserve.buckets import bucket, decode_batch_buckets, half_octaves, powers_of_two


@given(lo=st.integers(1, 64), hi=st.integers(1, 4096))
def test_buckets_cover_and_bound_padding(lo, hi):
    # half octaves start from the next power of two when lo is not one
    for make, waste in ((powers_of_two, 2.0), (half_octaves, 1.5 if lo & (lo - 1) == 0 else 2.0)):
        buckets = make(lo, hi)
        assert buckets == sorted(set(buckets)) and buckets[0] == lo and buckets[-1] >= hi
        for n in range(lo, hi + 1, max(1, hi // 50)):
            assert n <= bucket(n, buckets) <= waste * n


def test_half_octaves_of_the_default_batch_range():
    assert half_octaves(8, 64) == [8, 12, 16, 24, 32, 48, 64]


def test_too_large_is_refused():
    with pytest.raises(ValueError, match="65 exceeds the largest bucket 64"):
        bucket(65, half_octaves(8, 64))


def test_decode_batch_buckets_start_at_one():
    assert decode_batch_buckets(64) == [1, 2, 4, 8, 12, 16, 24, 32, 48, 64]
    assert decode_batch_buckets(4) == [1, 2, 4]
    assert decode_batch_buckets(3) == [1, 2, 3]
    assert decode_batch_buckets(1) == [1]


def test_decode_buckets_start_at_one_for_every_attention_backend():
    """A lone request decodes in a 1-row program whether the attention reads live pages only (the XLA path) or the
    table's width (the CPU and Pallas kernels): an 8-row one made the VNNI kernels decode their weights twice and
    read the int8 head four times a token."""
    from jaxserve.engine.batching import BucketPolicy

    def policy(live, max_num_seqs=64):
        return BucketPolicy(max_num_seqs=max_num_seqs, max_num_batched_tokens=256, max_model_len=512, block_size=16,
                            live_pages_only=live)
    assert policy(True).seq_buckets[:3] == [1, 2, 4]
    assert policy(False).seq_buckets == [1, 2, 4, 8, 16, 32, 64]
    assert policy(False, 4).seq_buckets == [1, 2, 4] and policy(False, 1).seq_buckets == [1]
    assert policy(False).step([_Entry(3)], 1) == (1, 1, 8, True)


class _Entry:
    def __init__(self, pages):
        self.block_table, self.token_ids = [0] * pages, [7]
