"""The cache-free forward the tests check the engine against, compiled once per padded width.

``forward_full`` called outside ``jit`` runs op by op, and JAX compiles every primitive for every new shape:
a reference beam search over prompts growing through 12 lengths took 106 s that way (8 s a new length) on the
2-core VM under load, where one compiled forward per width takes about a second. ``reference_logits`` compiles the
whole forward (the config static) and pads the tokens to a multiple of ``pad_to``, so references over prompts of
different lengths share a few programs. The model is causal: padding after position L - 1 changes no earlier
logit beyond float32 summation order (the padded keys are masked out).
"""
import jax
import numpy as np

from jaxserve.models import forward_full

_forward = jax.jit(forward_full, static_argnums=1)


def reference_logits(params, config, tokens, router_state=None, *, pad_to: int = 16) -> np.ndarray:
    """``forward_full(params, config, tokens)`` for tokens i32[B, L] (or a list of L ids: B = 1) -> f32[B, L, V]."""
    tokens = np.asarray(tokens, np.int32)
    if tokens.ndim == 1:
        tokens = tokens[None]
    batch, length = tokens.shape
    width = max(length, min(-(-length // pad_to) * pad_to, config.max_position_embeddings))
    padded = np.zeros((batch, width), np.int32)
    padded[:, :length] = tokens
    return np.asarray(_forward(params, config, padded, router_state=router_state))[:, :length]
