"""A draft restricted to the most frequent tokens: FR-Spec (Zhao et al. 2025, frequency-ranked drafting).

Axis names: B rows, E hidden size, N restricted vocabulary, V vocabulary.

A small draft's LM head is its largest matrix (the zoo draft's: 64 x 4096, 1 MiB in float32 of 2.4 MiB), and
every draft step reads all of it. ``DraftHead`` keeps only the columns of the N most frequent tokens of a
corpus (``jaxserve.speculative.token_counts``): a greedy draft step then multiplies and reads N/V of it, and the
draft proposes only those tokens. Greedy continuations are dominated by frequent tokens (the zoo target's
greedy continuations of the benchmark prompts lie entirely within the 1024 most frequent of 4096), sampled
ones much less so, so the restriction applies to rounds in which every row is greedy: a round with a sampled
row drafts from the whole head, as FR-Spec's restricted sampling cost the zoo pair acceptance at temperature 1
(α 0.83-0.87 -> 0.72-0.78 with 1024 of 4096; `git show f5419a8:benchmarks/RESULTS.md`). The output is exactly
the target's either way: greedy verification never depends on the draft, and a sampled proposal's q is the
distribution it was drawn from.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from jaxserve.config import ModelConfig
from jaxserve.layers import dense_dot, packed_head_logits


@struct.dataclass
class DraftHead:
    token_ids: jax.Array  # i32[N]: the ids the draft may propose, ascending
    kernel: jax.Array  # [E, N]: the draft's LM head columns for those ids


def restrict_head(config: ModelConfig, params: dict, token_ids) -> DraftHead:
    """The draft's LM head cut to ``token_ids`` (distinct ids in [0, V); sorted here)."""
    ids = np.unique(np.asarray(token_ids, np.int64))
    if ids.size != np.asarray(token_ids).size or ids.size == 0 or ids[0] < 0 or ids[-1] >= config.vocab_size:
        raise ValueError(f"draft token ids must be distinct ids in [0, {config.vocab_size}), got {len(ids)} distinct "
                         f"of {np.asarray(token_ids).size} in [{ids.min(initial=0)}, {ids.max(initial=0)}]")
    if config.tie_word_embeddings:
        kernel = jnp.asarray(params["embed"]["embedding"])[ids].T
    else:
        kernel = params["lm_head"]["kernel"]
        if not hasattr(kernel, "shape") or kernel.shape != (config.hidden_size, config.vocab_size):
            raise ValueError(f"the draft's lm_head kernel must be a [{config.hidden_size}, {config.vocab_size}] array "
                             f"to restrict, got {type(kernel).__name__}")
        kernel = jnp.asarray(kernel)[:, ids]
    return DraftHead(token_ids=jnp.asarray(ids, jnp.int32), kernel=kernel)


def check_draft_head(head, config: ModelConfig) -> None:
    """ValueError unless ``head`` is a ``DraftHead`` for a draft of this hidden size and vocabulary."""
    if not isinstance(head, DraftHead):
        raise ValueError(f"draft_head must be a DraftHead (jaxserve.speculative.draft_vocab.restrict_head), got "
                         f"{type(head).__name__}")
    n = head.token_ids.shape[0]
    if head.kernel.shape != (config.hidden_size, n) or n > config.vocab_size:
        raise ValueError(f"draft_head has {n} tokens and a {tuple(head.kernel.shape)} kernel; the draft needs "
                         f"[{config.hidden_size}, N] with N <= its vocabulary {config.vocab_size}")


def head_logits(head: DraftHead, hidden: jax.Array, config: ModelConfig) -> jax.Array:
    """The kept tokens' logits f32[B, N] from the draft's final hidden state [B, E]."""
    return _dot(config)(hidden, head.kernel, (((1,), (0,)), ((), ()))).astype(jnp.float32)


def full_logits(params: dict, config: ModelConfig, hidden: jax.Array) -> jax.Array:
    """The draft's own logits f32[B, V] over the whole vocabulary, from its final hidden state [B, E]."""
    kernel = params["embed"]["embedding"].T if config.tie_word_embeddings else params["lm_head"]["kernel"]
    packed = packed_head_logits(kernel, hidden)  # an untied head a runner packed (jaxserve.kernels.cpu)
    if packed is not None:
        return packed
    return _dot(config)(hidden, kernel, (((1,), (0,)), ((), ()))).astype(jnp.float32)


def _dot(config: ModelConfig):
    """The dot of the model's own head: its Dense layers', or a tied embedding's plain one (flax's ``Embed.attend``)."""
    return jax.lax.dot_general if config.tie_word_embeddings else dense_dot(config.dtype, config.matmul_dtype)
