"""Moved to ``jaxserve.layers`` (below both models and moe). This re-export keeps
``jaxserve.models.transformer`` importing until the engine refactor points it at ``jaxserve.layers``;
then delete this file (tests/test_architecture.py lists it)."""
from jaxserve.layers import RMSNorm, SwiGLU, dense, dense_dot, dot_via, rope, rope_inv_freq

__all__ = ["RMSNorm", "SwiGLU", "dense", "dense_dot", "dot_via", "rope", "rope_inv_freq"]
