"""Speculative-decoding counters, accumulated on device inside the generation loop.

Axis names: B sequences, G draft tokens per round (γ).

Counts are per sequence so a caller can drop padding rows before summarising. Acceptance counts
are the sampler's (before EOS / max_tokens truncation), as vLLM counts them; generated tokens
are what the caller receives.

Two acceptance figures: ``acceptance_rate`` = accepted / drafted (vLLM's), which counts the
drafts after a round's first rejection as rejected; and ``token_acceptance_prob`` = accepted /
reached, the chance that a draft token is accepted given that every earlier one in its round was
(Leviathan et al.'s α, the quantity the (1 - α^(γ+1)) / (1 - α) formula takes).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct


@struct.dataclass
class SpecMetrics:
    rounds: jax.Array  # i32[B]: verification rounds the sequence took part in
    drafted: jax.Array  # i32[B]: draft tokens proposed (G per round)
    accepted: jax.Array  # i32[B]: draft tokens accepted by the sampler
    accepted_at: jax.Array  # i32[B, G]: rounds in which draft position j was accepted
    target_calls: jax.Array  # i32[B]: target forward passes (prefill + one per round or decode step)
    generated: jax.Array  # i32[B]: tokens returned to the caller
    # i32[B]: draft positions reached (proposed, every earlier draft of the round accepted): min(accepted + 1,
    # drafted) per round; the denominator of α, right when rounds propose fewer than γ (suffix decoding)
    reached: jax.Array

    @classmethod
    def zeros(cls, batch: int, gamma: int) -> "SpecMetrics":
        z = jnp.zeros(batch, jnp.int32)
        return cls(z, z, z, jnp.zeros((batch, gamma), jnp.int32), z, z, z)

    def record_round(self, active: jax.Array, num_accepted: jax.Array, emitted: jax.Array,
                     drafted: jax.Array | None = None) -> "SpecMetrics":
        """One speculative round: active bool[B], num_accepted i32[B], emitted i32[B] (after truncation);
        drafted i32[B]: the tokens each row proposed (None: γ, every proposer but suffix decoding's)."""
        a = active.astype(jnp.int32)
        gamma = self.accepted_at.shape[1]
        hit = (jnp.arange(gamma)[None, :] < num_accepted[:, None]).astype(jnp.int32)
        drafted = gamma if drafted is None else drafted
        reached = jnp.minimum(num_accepted + 1, drafted)
        return self.replace(rounds=self.rounds + a, drafted=self.drafted + drafted * a,
                            reached=self.reached + reached * a,
                            accepted=self.accepted + num_accepted * a, accepted_at=self.accepted_at + hit * a[:, None],
                            target_calls=self.target_calls + a, generated=self.generated + emitted * a)


def summarize(metrics: SpecMetrics, rows: int | None = None) -> dict:
    """Host-side summary over the first ``rows`` sequences (all by default), as plain floats."""
    m = jax.tree.map(lambda x: np.asarray(x)[:rows], metrics)
    rounds, drafted, accepted = int(m.rounds.sum()), int(m.drafted.sum()), int(m.accepted.sum())
    generated, calls = int(m.generated.sum()), int(m.target_calls.sum())
    at = m.accepted_at.sum(0)
    reached = int(m.reached.sum())
    return {
        "acceptance_rate": accepted / drafted if drafted else float("nan"),
        "token_acceptance_prob": accepted / reached if reached else float("nan"),
        "mean_acceptance_length": 1 + accepted / rounds if rounds else float("nan"),
        "per_position_acceptance": (at / rounds).tolist() if rounds else [],
        "target_calls_per_token": calls / generated if generated else float("nan"),
        "rounds": rounds, "drafted": drafted, "accepted": accepted,
        "generated": generated, "target_calls": calls,
    }


def expected_acceptance_length(alpha: float, gamma: int) -> float:
    """Leviathan et al.'s tokens per round, (1 - α^(γ+1)) / (1 - α), for i.i.d. acceptance α."""
    if alpha >= 1.0:
        return gamma + 1.0
    return (1 - alpha ** (gamma + 1)) / (1 - alpha)
