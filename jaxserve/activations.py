"""A gated MLP's activations by name: ``jaxserve.layers.SwiGLU.activation``, and the packed GEMM's gated epilogue
(``jaxserve.kernels.cpu.packed``), which tabulates them at every bf16 input. Its own module so that both import it
without importing each other."""
from __future__ import annotations

import jax

ACTIVATIONS = {"silu": jax.nn.silu, "gelu_tanh": lambda x: jax.nn.gelu(x, approximate=True)}
