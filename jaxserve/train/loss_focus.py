"""What a draft's training loss looks at: the target's answers only, over its most frequent tokens only.

Axis names: W windows, L window length (seq_len + 1), B sequences, E hidden size, V vocabulary,
N tokens of the restricted head.

A draft is accepted where it agrees with the target on the target's *own* tokens, so in on-policy data
(``scripts/onpolicy_chat.py``: prompt + the target's answer) the prompt's tokens, written by people, are
not what it must predict: ``loss_on="answers"`` counts only the tokens of assistant turns (their closing
EOS included). And a narrow draft's LM head is most of its cost, in training as in serving: with
``head_vocab_size=N`` the softmax runs over the N tokens most frequent among the counted targets (FR-Spec,
Zhao et al. 2025), the targets outside them left out of the loss, and the counts are exported as
``token_counts.json`` so that ``SpeculativeConfig(draft_vocab_size=N)`` serves the draft on the same N.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from jaxserve.config import ModelConfig
from jaxserve.models.transformer import forward_hidden
from jaxserve.speculative.token_counts import most_frequent

def answer_mask(windows: np.ndarray, marker: list[int], eos: int) -> np.ndarray:
    """bool[W, L]: True where a token of ``windows`` i32[W, L] lies in an assistant answer (after ``marker``,
    the chat template's start of an assistant turn, up to and including the next ``eos``).

    Windows cut consecutively from one stream (``jaxserve.train.data.windows``: each starts with the previous
    one's last token) are read as that stream, so an answer that crosses a window boundary is followed across
    it; any others (``packed_windows``: each starts at a prompt) each on their own, starting outside an answer."""
    w = np.asarray(windows)
    if len(w) > 1 and not np.array_equal(w[1:, 0], w[:-1, -1]):
        return np.stack([_stream_mask(row, marker, eos) for row in w])
    seq_len = w.shape[1] - 1
    inside = _stream_mask(np.concatenate([w[:, :-1].ravel(), w[-1, -1:]]), marker, eos)
    return inside[np.arange(len(w))[:, None] * seq_len + np.arange(seq_len + 1)[None, :]]


def _stream_mask(stream: np.ndarray, marker: list[int], eos: int) -> np.ndarray:
    m = len(marker)
    idx = np.arange(len(stream))
    ends = np.ones(len(stream), bool)  # marker ends at i: stream[i - m + 1 .. i] == marker
    for k, tok in enumerate(marker):
        ends[m - 1:] &= stream[k:len(stream) - m + 1 + k] == tok
    ends[:m - 1] = False
    # the last marker end and the last EOS strictly before each position
    last_marker = np.maximum.accumulate(np.where(ends, idx, -1))
    last_eos = np.maximum.accumulate(np.where(stream == eos, idx, -1))
    before = lambda a: np.concatenate([[-1], a[:-1]])
    return before(last_marker) > before(last_eos)  # (no marker yet: -1 > -1 is False)


def assistant_marker(tokenizer) -> list[int]:
    """The token ids that open an assistant turn in ``tokenizer``'s chat template (ValueError if it has none)."""
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError("train.loss_on='answers' needs a tokenizer with a chat template (data.tokenizer's "
                         "tokenizer_config.json)")
    bare = tokenizer.encode_chat([{"role": "user", "content": "x"}], add_generation_prompt=False)
    full = tokenizer.encode_chat([{"role": "user", "content": "x"}], add_generation_prompt=True)
    if full[:len(bare)] != bare or len(full) == len(bare):
        raise ValueError("the tokenizer's chat template does not open an assistant turn after the prompt")
    return full[len(bare):]


@struct.dataclass
class HeadVocab:
    token_ids: jax.Array  # i32[N], ascending: the tokens the loss's softmax runs over
    index: jax.Array  # i32[V]: each token's column in token_ids, -1 outside them


def head_vocab(counts: np.ndarray, n: int) -> HeadVocab:
    ids = most_frequent(counts, n)
    index = np.full(len(counts), -1, np.int32)
    index[ids] = np.arange(n, dtype=np.int32)
    return HeadVocab(token_ids=jnp.asarray(ids), index=jnp.asarray(index))


def target_counts(windows: np.ndarray, mask: np.ndarray | None, vocab_size: int) -> np.ndarray:
    """i64[V]: how often each token is a (counted) next-token target of ``windows`` i32[W, L]."""
    targets = np.asarray(windows)[:, 1:]
    if mask is not None:
        targets = targets[np.asarray(mask)[:, 1:]]
    return np.bincount(targets.ravel(), minlength=vocab_size).astype(np.int64)


def focused_nll(params: dict, config: ModelConfig, w: jax.Array, mask: jax.Array | None,
                head: HeadVocab | None) -> jax.Array:
    """Mean next-token NLL of windows i32[B, L] over the counted targets: where ``mask`` bool[B, L] holds
    (None: all) and, with ``head``, the target is one of its tokens (the softmax then over those only)."""
    hidden = forward_hidden(params, config, w[:, :-1])  # f32[B, L-1, E]
    targets, keep = w[:, 1:], jnp.ones(w[:, 1:].shape, bool) if mask is None else mask[:, 1:]
    if config.tie_word_embeddings:
        table = params["embed"]["embedding"]  # [V, E]
        kernel = table if head is None else table[head.token_ids]  # [N, E]
    else:
        kernel = params["lm_head"]["kernel"].T if head is None else params["lm_head"]["kernel"][:, head.token_ids].T
    logits = jnp.einsum("ble,ne->bln", hidden, kernel.astype(jnp.float32))
    if config.final_logit_softcap is not None:
        logits = config.final_logit_softcap * jnp.tanh(logits / config.final_logit_softcap)
    if head is not None:
        column = head.index[targets]
        keep, targets = keep & (column >= 0), jnp.maximum(column, 0)
    logp = jax.nn.log_softmax(logits)
    nll = -jnp.take_along_axis(logp, targets[..., None], axis=-1)[..., 0]
    return jnp.sum(jnp.where(keep, nll, 0.0)) / jnp.maximum(jnp.sum(keep), 1)
