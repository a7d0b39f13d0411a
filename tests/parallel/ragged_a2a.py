"""``lax.ragged_all_to_all`` emulated with ``all_gather``, so the ragged expert dispatch runs on XLA:CPU (which has
no ragged_all_to_all) and its offsets are checked against the padded dispatch. Semantics as the JAX docstring
states them, for one slice per peer: the slice ``operand[input_offsets[j] : + send_sizes[j]]`` goes to peer j and
lands there at ``output_offsets[j]`` (the sender says where)."""
import contextlib
from unittest import mock

import jax
import jax.numpy as jnp


def emulated_ragged_all_to_all(operand, output, input_offsets, send_sizes, output_offsets, recv_sizes, *,
                               axis_name, axis_index_groups=None):
    assert axis_index_groups is None
    n = jax.lax.axis_size(axis_name)
    assert input_offsets.shape == (n,), "one slice per peer only"
    me = jax.lax.axis_index(axis_name)
    sources = jax.lax.all_gather(operand, axis_name)  # [N src, rows, ...]
    starts, sizes, lands = (jax.lax.all_gather(a, axis_name)[:, me] for a in (input_offsets, send_sizes,
                                                                               output_offsets))  # [N src]
    rows = jnp.arange(output.shape[0])
    result = output
    for src in range(n):  # src's slice for me: its rows [start, start + size) to my rows [land, land + size)
        live = (rows >= lands[src]) & (rows < lands[src] + sizes[src])
        picked = jnp.take(sources[src], jnp.clip(starts[src] + rows - lands[src], 0, operand.shape[0] - 1), axis=0)
        result = jnp.where(live.reshape(-1, *([1] * (output.ndim - 1))), picked, result)
    return result


@contextlib.contextmanager
def emulated():
    """Inside: every ``jax.lax.ragged_all_to_all`` looked up at trace time is the emulation."""
    with mock.patch.object(jax.lax, "ragged_all_to_all", emulated_ragged_all_to_all):
        yield


def check_docstring_example(mesh_devices):
    """The emulation gives the JAX docstring's example result over 2 devices (``mesh_devices``: at least 2)."""
    import numpy as np
    from jax.sharding import PartitionSpec as P
    mesh = jax.make_mesh((2,), ("x",), devices=mesh_devices[:2], axis_types=(jax.sharding.AxisType.Auto,))
    args = [[1, 2, 2, 3, 4, 0], [0] * 8, [0, 1, 0, 1], [1, 2, 1, 1], [0, 0, 1, 2], [1, 1, 2, 1]]  # both devices'

    def body(operand, output, *offsets_and_sizes):
        return emulated_ragged_all_to_all(operand, output, *offsets_and_sizes, axis_name="x")

    fn = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("x"), out_specs=P("x")))
    got = fn(*(jnp.asarray(a, jnp.int32) for a in args))
    np.testing.assert_array_equal(got, [1, 3, 0, 0, 2, 2, 4, 0])
