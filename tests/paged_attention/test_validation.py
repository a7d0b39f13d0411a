"""Bad inputs to the public paged-attention functions raise ValueError before any kernel runs."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pallas_kernels.paged_attention import paged_attention, ragged_paged_attention

DIMS = dict(heads=4, kv_heads=2, head_dim=64, page_size=8)


@pytest.fixture
def decode_args(decode_case):
    return decode_case([5, 17], **DIMS)  # q(2,4,64), pool (7,8,2,64), tables (2,3)


@pytest.fixture
def ragged_args(ragged_case):
    return ragged_case([3, 2], [10, 2], **DIMS)  # q(8,4,64), cu [0,3,5]


def _replace(args, i, value):
    return tuple(value if j == i else a for j, a in enumerate(args))


def _decode_bad_cases(args):
    q, k, v, tables, lengths = args
    num_pages = k.shape[0]
    return {
        "heads not a multiple": (_replace(args, 0, jnp.zeros((2, 3, 64))), r"multiple of kv heads"),
        "head dim": (_replace(args, 0, jnp.zeros((2, 4, 32))), r"head dim"),
        "q rank": (_replace(args, 0, jnp.zeros((2, 4, 1, 64))), r"q must be \[B, H, D\]"),
        "k/v shapes": (_replace(args, 2, v[:-1]), r"equal shapes"),
        "q dtype": (_replace(args, 0, q.astype(jnp.bfloat16)), r"share one dtype"),
        "int q": (_replace(args, 0, q.astype(jnp.int32)), r"floating"),
        "lengths dtype": (_replace(args, 4, lengths.astype(jnp.float32)), r"lengths must be int32"),
        "tables dtype": (_replace(args, 3, tables.astype(jnp.int16)), r"block_tables must be int32"),
        "lengths shape": (_replace(args, 4, lengths[:1]), r"lengths must have shape \(2,\)"),
        "tables batch": (_replace(args, 3, tables[:1]), r"block_tables must have shape"),
        "length > capacity": (_replace(args, 4, jnp.asarray([5, 25], jnp.int32)),
                              r"lengths\[1\] = 25 outside \[0, 24\]"),
        "negative length": (_replace(args, 4, jnp.asarray([-1, 5], jnp.int32)), r"lengths\[0\] = -1"),
        "page past pool": (_replace(args, 3, tables.at[1, 2].set(num_pages)),
                           rf"block_tables\[1, 2\] = {num_pages} outside the pool"),
        "negative page": (_replace(args, 3, tables.at[0, 0].set(-1)), r"block_tables\[0, 0\] = -1"),
    }


@pytest.mark.parametrize("case", [
    "heads not a multiple", "head dim", "q rank", "k/v shapes", "q dtype", "int q",
    "lengths dtype", "tables dtype", "lengths shape", "tables batch", "length > capacity",
    "negative length", "page past pool", "negative page"])
def test_decode_rejects(decode_args, case):
    args, pattern = _decode_bad_cases(decode_args)[case]
    with pytest.raises(ValueError, match=pattern) as info:
        paged_attention(*args)
    assert "q(" in str(info.value)  # the message names the shapes


@pytest.mark.parametrize("opts,pattern", [
    (dict(soft_cap=0.0), "soft_cap"), (dict(sliding_window=0), "sliding_window"),
    (dict(sm_scale=float("nan")), "sm_scale")])
def test_decode_rejects_options(decode_args, opts, pattern):
    with pytest.raises(ValueError, match=pattern):
        paged_attention(*decode_args, **opts)


def test_unused_table_entries_are_not_checked(decode_args):
    q, k, v, tables, lengths = decode_args
    tables = tables.at[0, 1:].set(10_000)  # sequence 0 (5 tokens) uses only its first page
    out = paged_attention(q, k, v, tables, lengths, num_splits=1)
    assert np.all(np.isfinite(np.asarray(out)))


def test_shapes_checked_under_jit_values_not(decode_args):
    q, k, v, tables, lengths = decode_args
    with pytest.raises(ValueError, match="multiple of kv heads"):
        jax.jit(paged_attention)(jnp.zeros((2, 3, 64)), k, v, tables, lengths)
    # Traced values cannot be checked; the kernel must still run (tables are clipped).
    out = jax.jit(paged_attention)(q, k, v, tables.at[1, 2].set(999), lengths)
    assert out.shape == q.shape


def _ragged_bad_cases(args):
    q, k, v, tables, ctx, cu = args
    return {
        "cu length": (_replace(args, 5, cu[:-1]), r"cu_q_lens must have shape \(3,\)"),
        "cu dtype": (_replace(args, 5, cu.astype(jnp.float32)), r"cu_q_lens must be int32"),
        "cu start": (_replace(args, 5, jnp.asarray([1, 3, 5], jnp.int32)), r"start at 0"),
        "cu decreasing": (_replace(args, 5, jnp.asarray([0, 4, 3], jnp.int32)), r"never decrease"),
        "cu past T": (_replace(args, 5, jnp.asarray([0, 3, 9], jnp.int32)), r"T=8"),
        "context < q_len": (_replace(args, 4, jnp.asarray([10, 1], jnp.int32)),
                            r"context_lens\[1\] = 1 is shorter than its 2 new tokens"),
        "context > capacity": (_replace(args, 4, jnp.asarray([10, 17], jnp.int32)),
                               r"context_lens\[1\] = 17 outside \[0, 16\]"),
        "page past pool": (_replace(args, 3, tables.at[0, 1].set(k.shape[0])), r"outside the pool"),
        "heads": (_replace(args, 0, jnp.zeros((8, 5, 64))), r"multiple of kv heads"),
        "q rank": (_replace(args, 0, q[0]), r"q must be \[T, H, D\]"),
    }


@pytest.mark.parametrize("case", [
    "cu length", "cu dtype", "cu start", "cu decreasing", "cu past T", "context < q_len",
    "context > capacity", "page past pool", "heads", "q rank"])
def test_ragged_rejects(ragged_args, case):
    args, pattern = _ragged_bad_cases(ragged_args)[case]
    with pytest.raises(ValueError, match=pattern) as info:
        ragged_paged_attention(*args)
    assert "q(" in str(info.value)


def test_ragged_rejects_tile_q(ragged_args):
    with pytest.raises(ValueError, match="tile_q"):
        ragged_paged_attention(*ragged_args, tile_q=0)
