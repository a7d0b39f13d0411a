"""Paged attention: decode and ragged multi-query variants, with plain-jnp references."""
from pallas_kernels.paged_attention.reference import (
    paged_attention_reference,
    ragged_paged_attention_reference,
)

__all__ = ["paged_attention_reference", "ragged_paged_attention_reference"]
