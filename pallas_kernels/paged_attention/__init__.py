"""Paged attention: decode and ragged multi-query Pallas kernels, with plain-jnp references
and a plain-XLA path that reads only the live pages (the fast path without Pallas)."""
from pallas_kernels.paged_attention.decode import paged_attention
from pallas_kernels.paged_attention.online import (
    paged_attention_online,
    ragged_paged_attention_online,
    tokens_minor,
    uniform_paged_attention_online,
)
from pallas_kernels.paged_attention.mosaic import paged_attention_mosaic  # experimental, see mosaic.py
from pallas_kernels.paged_attention.ragged import ragged_paged_attention
from pallas_kernels.paged_attention.reference import (
    paged_attention_reference,
    ragged_paged_attention_reference,
    uniform_paged_attention_reference,
)

__all__ = [
    "paged_attention",
    "paged_attention_mosaic",
    "paged_attention_online",
    "paged_attention_reference",
    "ragged_paged_attention",
    "ragged_paged_attention_online",
    "ragged_paged_attention_reference",
    "tokens_minor",
    "uniform_paged_attention_online",
    "uniform_paged_attention_reference",
]
