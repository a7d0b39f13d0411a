"""QuantizedTensor: a pytree holding one quantized array, plus block reshaping helpers.

Array fields are pytree leaves (they pass through jit, live in params pytrees); shape, format,
axis and block size are static metadata (part of the treedef, hence of the jit cache key).
Along `axis` the source length n is cut into n/block_size blocks; every other axis is kept.
"""
import math

import jax
import jax.numpy as jnp
from flax import struct


@struct.dataclass
class QuantizedTensor:
    """One quantized array of logical shape `shape`, quantized in blocks along `axis`.

    data:         uint8[shape with n -> n/2 on axis] packed 4-bit codes (nvfp4, mxfp4, int4),
                  or float8_e4m3fn[shape] (fp8).
    scales:       block scales, shape with n -> n/block_size on axis: float8_e4m3fn (nvfp4),
                  uint8 E8M0 bytes (mxfp4), float32 (int4, fp8 per-channel);
                  float32[1, ..., 1] of ones for fp8 per-tensor.
    tensor_scale: float32[] second-level scale (nvfp4 s_global, fp8 per-tensor scale; else 1).
    """
    data: jax.Array
    scales: jax.Array
    tensor_scale: jax.Array
    shape: tuple = struct.field(pytree_node=False)
    fmt: str = struct.field(pytree_node=False)
    axis: int = struct.field(pytree_node=False)
    block_size: int = struct.field(pytree_node=False)
    scale_rule: str = struct.field(pytree_node=False, default="")
    dtype: str = struct.field(pytree_node=False, default="float32")

    @property
    def nbytes(self) -> int:
        """Bytes held: codes + block scales + tensor scale."""
        return sum(int(a.size) * a.dtype.itemsize for a in (self.data, self.scales, self.tensor_scale))

    @property
    def bits_per_element(self) -> float:
        return 8.0 * self.nbytes / math.prod(self.shape)


def to_blocks(x, axis, block_size):
    """[..., n (at axis), ...] -> [... (other axes), n/block_size, block_size]."""
    xt = jnp.moveaxis(x, axis, -1)
    return xt.reshape(xt.shape[:-1] + (xt.shape[-1] // block_size, block_size))


def from_blocks(xb, axis):
    """Inverse of to_blocks: [..., nb, bs] -> [..., nb*bs (at axis), ...]."""
    return jnp.moveaxis(xb.reshape(xb.shape[:-2] + (-1,)), -1, axis)


def block_scales_to_axis(s, axis):
    """[..., nb] per-block values -> [..., nb (at axis), ...], the layout QuantizedTensor stores."""
    return jnp.moveaxis(s, -1, axis)


def block_scales_from_axis(s, axis):
    """Inverse of block_scales_to_axis, with a trailing unit axis for broadcasting over a block."""
    return jnp.moveaxis(s, axis, -1)[..., None]


def finite_amax(x, axis=None, keepdims=False):
    """max |x| over finite entries (0 when there are none): a non-finite value must not set the scale."""
    return jnp.max(jnp.where(jnp.isfinite(x), jnp.abs(x), 0.0), axis=axis, keepdims=keepdims)


def block_amax(xb):
    """f32[..., nb, bs] -> f32[..., nb]: max |x| per block, NaN where the block has a non-finite value."""
    return jnp.max(jnp.where(jnp.isfinite(xb), jnp.abs(xb), jnp.nan), axis=-1)
