"""Is the Pallas-vs-reference gap of nvfp4 W4A4 perplexity a kernel bug or rounding sensitivity?

    python experiments/fp4_perplexity/w4a4_check.py

On real Dense inputs of jaxserve/tiny-code (first validation window): Pallas (interpret) vs reference
W4A4 on the same input, and reference vs reference on an input nudged by 1e-6 relative noise.
"""
import numpy as np, jax, jax.numpy as jnp, json
from jaxserve.models.loading import resolve_model
from jaxserve.quant import quantize_params, quantized_matmul, MatmulSettings
from jaxserve.quant.evaluate import dense_inputs
from jaxserve.train.data import encode_split, windows
c, p, tok = resolve_model("jaxserve/tiny-code")
val = windows(encode_split(tok, None, "val"), 256)[:1]
ins = dense_inputs(p, c, val[:, :-1])
q = quantize_params(p, "nvfp4")
worst = 0
for path in ["layers_0/attn/q_proj", "layers_0/mlp/down_proj", "layers_3/attn/o_proj", "layers_5/mlp/up_proj"]:
    w = q
    for k in path.split("/"): w = w[k]
    w = w["kernel"]
    x = jnp.asarray(ins[path])
    a = quantized_matmul(x, w, MatmulSettings("pallas", w4a4=True, interpret=True))
    b = quantized_matmul(x, w, MatmulSettings("reference", w4a4=True))
    r = float(jnp.max(jnp.abs(a - b)) / jnp.max(jnp.abs(b)))
    x2 = x * (1 + 1e-6 * jax.random.normal(jax.random.key(0), x.shape))  # a 1e-6 relative nudge of the input
    b2 = quantized_matmul(x2, w, MatmulSettings("reference", w4a4=True))
    r2 = float(jnp.max(jnp.abs(b2 - b)) / jnp.max(jnp.abs(b)))
    print(path, "pallas vs reference, same input: %.2e; reference vs reference on a 1e-6-nudged input: %.2e" % (r, r2))
