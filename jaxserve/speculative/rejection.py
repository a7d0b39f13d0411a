"""The exact speculative-sampling acceptance rule (Leviathan et al. 2023; Chen et al. 2023).

Axis names: B sequences, G draft tokens per round (γ), V vocabulary.

Given draft tokens x_1..x_G drawn from the draft's distributions q_1..q_G and the target's
distributions p_1..p_{G+1} at the same positions, token i is accepted with probability
min(1, p_i(x_i) / q_i(x_i)); at the first rejection the replacement is drawn from
normalize(max(0, p_i - q_i)); if all G are accepted a bonus token is drawn from p_{G+1}. Every
emitted token is then distributed exactly as the target's own sample. Greedy rows accept while
the draft token equals the target's argmax, and the correction (or bonus) is that argmax.

``probs_from_logits`` turns logits into the distribution that ``jaxserve.sampling.sample`` draws
from (temperature, then top-k/top-p via ``filter_logits``), so p and q are filtered identically.
Greedy rows get the one-hot of the argmax of the raw logits, which is also what ``sample`` picks.

When every row is greedy (``all_greedy``, a traced bool) no randomness is drawn at all: the
uniforms are zeros and each draw is an argmax. At batch 1 on CPU the threefry calls and the
Gumbel logs were ~45% of a small model's decode step, for nothing (greedy rows ignore them).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxserve.sampling import SamplingBatch, argmax_first, filter_logits, row_keys

PAD_TOKEN = -1  # output slots past a sequence's emitted tokens


def probs_from_logits(logits: jax.Array, temperature: jax.Array, top_k: jax.Array,
                      top_p: jax.Array) -> jax.Array:
    """logits f32[R, V] -> the sampling distribution f32[R, V] (one-hot argmax where temperature <= 0).

    The vocabulary sort behind top-k/top-p runs only when some row asks for it.
    """
    logits = logits.astype(jnp.float32)
    greedy = temperature <= 0
    onehot = jax.nn.one_hot(argmax_first(logits), logits.shape[-1], dtype=jnp.float32)

    def mixed():
        scaled = logits / jnp.where(greedy, 1.0, temperature)[:, None]
        filtering = jnp.any((top_k > 0) | (top_p < 1))
        scaled = jax.lax.cond(filtering, lambda x: filter_logits(x, top_k, top_p), lambda x: x, scaled)
        return jnp.where(greedy[:, None], onehot, jax.nn.softmax(scaled, axis=-1))

    return jax.lax.cond(jnp.all(greedy), lambda: onehot, mixed)


def round_uniforms(seed: jax.Array, index: jax.Array, position: jax.Array, gamma: int, vocab: int,
                   all_greedy: jax.Array) -> jax.Array:
    """All the randomness of one round, one draw per row keyed by ``row_keys(seed, index, position)``:
    f32[B, G+1, V+1] in (0, 1) (zeros when ``all_greedy``: nothing reads them then).

    ``[:, j, :V]`` drives draft draw j (j < G) and ``[:, G, :V]`` the correction / bonus draw;
    ``[:, :G, V]`` are the acceptance uniforms. One PRNG call per round keeps the compiled
    program small (each threefry call is costly to compile on CPU). The keys are derived inside
    the random branch: on XLA:CPU each ``fold_in`` is a small threefry while-loop, and greedy rounds
    ran two per round for nothing (about 1% of a batch-1 greedy call).
    """
    tiny = jnp.finfo(jnp.float32).tiny
    shape = (seed.shape[0], gamma + 1, vocab + 1)

    def random():
        keys = row_keys(seed, index, position)
        return jax.vmap(lambda k: jax.random.uniform(k, shape[1:], minval=tiny))(keys)
    return jax.lax.cond(all_greedy, lambda: jnp.zeros(shape, jnp.float32), random)


def given_draft_uniforms(seed: jax.Array, index: jax.Array, position: jax.Array, width: int, max_gamma: int,
                         vocab: int, all_greedy: jax.Array) -> jax.Array:
    """``round_uniforms``' layout f32[B, W+1, V+1] for a round over given (deterministic) drafts W <= max_gamma
    wide, filled only where ``rejection_sample`` reads with given drafts: acceptance ``[:, :W, V]`` and the
    final draw ``[:, W, :V]``.

    The values do not depend on W: one draw of max_gamma + V per row key, acceptance uniform j is its j-th
    value and the final draw its last V. A row with a draft of length L emits the same tokens in a round of
    any width W >= L, so a program narrowed to the batch's longest draft leaves every row's sample as it
    was (the engine picks the width from the whole batch). It also draws max_gamma + V values per row where
    ``round_uniforms`` draws (γ + 1)(V + 1).
    """
    tiny = jnp.finfo(jnp.float32).tiny
    shape = (seed.shape[0], width + 1, vocab + 1)

    def random():
        keys = row_keys(seed, index, position)
        r = jax.vmap(lambda k: jax.random.uniform(k, (max_gamma + vocab,), minval=tiny))(keys)  # f32[B, γ + V]
        u = jnp.zeros(shape, jnp.float32).at[:, :width, vocab].set(r[:, :width])
        return u.at[:, width, :vocab].set(r[:, max_gamma:])
    return jax.lax.cond(all_greedy, lambda: jnp.zeros(shape, jnp.float32), random)


def draw(probs: jax.Array, uniforms: jax.Array, all_greedy: jax.Array) -> jax.Array:
    """Gumbel-max draw from probs f32[..., V] driven by uniforms f32[..., V]; i32[...].

    A one-hot row draws its hot index either way; ``all_greedy`` (every row one-hot) skips the logs.
    """
    def gumbel_max():
        return argmax_first(jnp.log(probs) - jnp.log(-jnp.log(uniforms)))
    return jax.lax.cond(all_greedy, lambda: argmax_first(probs), gumbel_max)


def sample_tokens(logits: jax.Array, sampling: SamplingBatch) -> jax.Array:
    """One token per row i32[R] from logits f32[R, V], keyed by ``row_keys(seed, index, position)``.

    The same distribution as ``jaxserve.sampling.sample``, drawn the way speculative rounds draw.
    """
    s = sampling

    def random_draw():
        u = jax.vmap(lambda k: jax.random.uniform(k, logits.shape[-1:], minval=jnp.finfo(jnp.float32).tiny))(
            row_keys(s.seed, s.index, s.position))
        return draw(probs_from_logits(logits, s.temperature, s.top_k, s.top_p), u, jnp.bool_(False))
    return jax.lax.cond(jnp.all(s.temperature <= 0), lambda: argmax_first(logits), random_draw)


def greedy_accept(draft_tokens: jax.Array, target_logits: jax.Array) -> tuple[jax.Array, jax.Array]:
    """``rejection_sample`` when every row is greedy, straight from the target's logits f32[B, G+1, V]:
    accept while the draft token is the target's argmax, then emit that argmax. Same outputs; no
    distributions, residuals or draws (one argmax over the logits instead of ~10 passes over them)."""
    g = draft_tokens.shape[1]
    target_argmax = argmax_first(target_logits)  # i32[B, G+1]
    num_accepted = jnp.sum(jnp.cumprod((draft_tokens == target_argmax[:, :g]).astype(jnp.int32), axis=1), axis=1)
    slots = jnp.arange(g + 1)[None, :]
    tokens = jnp.where(slots <= num_accepted[:, None], target_argmax, PAD_TOKEN)  # accepted drafts equal the argmax
    return tokens.astype(jnp.int32), num_accepted.astype(jnp.int32)


def rejection_sample(draft_tokens: jax.Array, draft_probs: jax.Array, target_probs: jax.Array,
                     uniforms: jax.Array, greedy: jax.Array, valid: jax.Array | None = None
                     ) -> tuple[jax.Array, jax.Array]:
    """Accepts a prefix of each row's draft and appends one target token.

    draft_tokens i32[B, G]; draft_probs f32[B, G, V] (the q each draft token was drawn from);
    target_probs f32[B, G+1, V]; uniforms f32[B, G+1, V+1] laid out as by ``round_uniforms`` (only
    ``[:, :G, V]`` and ``[:, G, :V]`` are read here); greedy bool[B].
    Returns ``(tokens i32[B, G+1], num_accepted i32[B])``: row b emits
    ``tokens[b, :num_accepted[b] + 1]`` (accepted drafts, then the correction or bonus token);
    later slots hold ``PAD_TOKEN``. ``valid`` bool[B, G] (None: all): a row's drafts past its own
    length; they are never accepted, and their draft_probs must be zeros, so the draw at the first of
    them is from p itself (the plain decode draw), as if the row had proposed no more.
    """
    b, g = draft_tokens.shape
    accept_u = uniforms[:, :g, -1]  # f32[B, G]
    p_x = jnp.take_along_axis(target_probs[:, :g], draft_tokens[..., None], axis=-1)[..., 0]
    q_x = jnp.take_along_axis(draft_probs, draft_tokens[..., None], axis=-1)[..., 0]
    target_argmax = argmax_first(target_probs)  # i32[B, G+1]
    # u < p/q without dividing: x was drawn from q, so q(x) > 0 whenever it matters
    accept = jnp.where(greedy[:, None], draft_tokens == target_argmax[:, :g], accept_u * q_x < p_x)
    if valid is not None:
        accept &= valid
    num_accepted = jnp.sum(jnp.cumprod(accept.astype(jnp.int32), axis=1), axis=1)  # i32[B]

    # Residual at the first rejection; at position G (all accepted) q is zero, so it is p itself.
    q_padded = jnp.pad(draft_probs, ((0, 0), (0, 1), (0, 0)))
    at = num_accepted[:, None, None]
    p_n = jnp.take_along_axis(target_probs, at, axis=1)[:, 0]
    q_n = jnp.take_along_axis(q_padded, at, axis=1)[:, 0]
    residual = jnp.maximum(p_n - q_n, 0.0)
    mass = jnp.sum(residual, axis=-1, keepdims=True)
    residual = jnp.where(mass > 0, residual / jnp.where(mass > 0, mass, 1.0), p_n)  # p == q: rejection had prob 0
    sampled = draw(residual, uniforms[:, g, :-1], jnp.all(greedy))
    extra = jnp.where(greedy, jnp.take_along_axis(target_argmax, num_accepted[:, None], axis=1)[:, 0], sampled)

    slots = jnp.arange(g + 1)[None, :]
    padded_draft = jnp.pad(draft_tokens, ((0, 0), (0, 1)))
    tokens = jnp.where(slots < num_accepted[:, None], padded_draft,
                       jnp.where(slots == num_accepted[:, None], extra[:, None], PAD_TOKEN))
    return tokens.astype(jnp.int32), num_accepted.astype(jnp.int32)
