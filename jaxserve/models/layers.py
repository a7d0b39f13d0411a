"""Building blocks shared by the model family: RMSNorm, rotary embeddings, SwiGLU MLP."""
from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp


class RMSNorm(nn.Module):
    eps: float = 1e-6
    dtype: jnp.dtype = jnp.float32

    @nn.compact
    def __call__(self, x):
        scale = self.param("scale", nn.initializers.ones, (x.shape[-1],), self.dtype)
        # Normalise in float32 and cast back before scaling, as HF Llama/Qwen do.
        xf = x.astype(jnp.float32)
        xf = xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + self.eps)
        return scale * xf.astype(x.dtype)


def rope(x: jax.Array, positions: jax.Array, theta: float) -> jax.Array:
    """Rotary embedding in HF's rotate-half layout: x [..., H, D], positions i32[...]."""
    d = x.shape[-1]
    inv_freq = 1.0 / (theta ** (jnp.arange(0, d, 2, dtype=jnp.float32) / d))
    angles = positions.astype(jnp.float32)[..., None] * inv_freq  # [..., D/2]
    cos = jnp.cos(jnp.concatenate([angles, angles], -1))[..., None, :]
    sin = jnp.sin(jnp.concatenate([angles, angles], -1))[..., None, :]
    xf = x.astype(jnp.float32)
    rotated = jnp.concatenate([-xf[..., d // 2:], xf[..., : d // 2]], -1)
    return (xf * cos + rotated * sin).astype(x.dtype)


class SwiGLU(nn.Module):
    hidden_size: int
    intermediate_size: int
    dtype: jnp.dtype = jnp.float32

    @nn.compact
    def __call__(self, x):
        dense = lambda n, name: nn.Dense(n, use_bias=False, dtype=self.dtype, param_dtype=self.dtype, name=name)
        h = nn.silu(dense(self.intermediate_size, "gate_proj")(x)) * dense(self.intermediate_size, "up_proj")(x)
        return dense(self.hidden_size, "down_proj")(h)
