"""The model runs its quantized params through the chosen matmul, with model code unchanged."""
import flax
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxserve.cache.kv_pool import init_kv_pool
from jaxserve.models import AttentionMetadata, forward, forward_full
from jaxserve.quant import (MatmulSettings, current_settings, dequantize_params, quantize_params, quantized_apply,
                            quantized_matmul, use_quantized_matmul)

_full = jax.jit(forward_full, static_argnums=1)


def _rel(a, b):
    return float(np.max(np.abs(np.asarray(a) - np.asarray(b))) / np.max(np.abs(np.asarray(b))))


@pytest.fixture(scope="module")
def reference_logits(config, nvfp4_params, tokens):
    return jax.jit(quantized_apply(forward_full, "reference"), static_argnums=1)(nvfp4_params, config, tokens)


def test_reference_equals_forward_on_dequantized_params(config, nvfp4_params, tokens, reference_logits):
    want = _full(dequantize_params(nvfp4_params), config, tokens)
    assert _rel(reference_logits, want) < 1e-5


def test_pallas_interpret_equals_reference(config, nvfp4_params, tokens, reference_logits):
    pallas = jax.jit(quantized_apply(forward_full, "pallas", interpret=True), static_argnums=1)
    assert _rel(pallas(nvfp4_params, config, tokens), reference_logits) <= 1e-5


def test_w4a4_changes_the_result(config, nvfp4_params, tokens, reference_logits):
    w4a4 = jax.jit(quantized_apply(forward_full, "reference", w4a4=True), static_argnums=1)
    assert _rel(w4a4(nvfp4_params, config, tokens), reference_logits) > 1e-3


def test_paged_forward_under_jit(config, nvfp4_params, tokens, reference_logits):
    """The engine's entry point: one jitted prefill of a sequence through the paged pool."""
    n = tokens.shape[1]  # two pages of n/2 tokens
    meta = AttentionMetadata(slot_mapping=jnp.arange(n, dtype=jnp.int32), block_tables=jnp.array([[0, 1]], jnp.int32),
                             context_lens=jnp.array([n], jnp.int32), cu_q_lens=jnp.array([0, n], jnp.int32),
                             decode_only=False)
    pool = init_kv_pool(config.num_layers, 2, n // 2, config.num_kv_heads, config.head_dim)
    step = jax.jit(quantized_apply(forward, "reference"), static_argnums=1, static_argnames="attention_impl")
    logits, _ = step(nvfp4_params, config, tokens[0], jnp.arange(n, dtype=jnp.int32), pool, meta,
                     attention_impl="reference")
    assert _rel(logits, reference_logits[0]) < 1e-5


def test_fp8_kernels_take_the_reference_path_under_pallas(config, params, tokens):
    q = quantize_params(params, "fp8", include=("q_proj",), scaling="channel")
    got = jax.jit(quantized_apply(forward_full, "pallas"), static_argnums=1)(q, config, tokens)
    assert _rel(got, _full(dequantize_params(q), config, tokens)) < 1e-5
    with pytest.raises(ValueError, match="w4a4 emulation applies to"):
        quantized_apply(forward_full, "reference", w4a4=True)(q, config, tokens)


def test_quantized_params_outside_the_context_fail_loudly(config, nvfp4_params, tokens):
    with pytest.raises(flax.errors.ScopeParamShapeError):
        forward_full(nvfp4_params, config, tokens)


def test_innermost_context_wins_and_bad_impl_is_rejected():
    assert current_settings() is None
    with use_quantized_matmul("pallas"):
        with use_quantized_matmul("reference", w4a4=True):
            assert current_settings() == MatmulSettings("reference", w4a4=True)
        assert current_settings().impl == "pallas"
    assert current_settings() is None
    with pytest.raises(ValueError, match="'triton'"):
        quantized_apply(forward_full, "triton")


@pytest.mark.parametrize("w4a4", [False, True])
def test_quantized_matmul_flattens_leading_axes(nvfp4_params, w4a4):
    w = nvfp4_params["layers_0"]["mlp"]["up_proj"]["kernel"]
    x = jax.random.normal(jax.random.key(2), (4, 4, 64), jnp.float32)
    got = quantized_matmul(x, w, MatmulSettings("pallas", w4a4=w4a4, interpret=True))
    want = quantized_matmul(x, w, MatmulSettings("reference", w4a4=w4a4))
    assert got.shape == (4, 4, 176) and _rel(got, want) <= 1e-5
