"""ModelConfig.matmul_dtype: Dense dots on operands rounded to bf16 with float32 sums, kernels declared
(and loaded) in bf16, everything else as the model's dtype."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxserve.config import ModelConfig
from jaxserve.models import get_preset, init_params, param_shapes
from jaxserve.layers import dense
from jaxserve.models.loading import resolve_model, with_matmul_dtype
from tests.reference_forward import reference_logits

CONFIG = get_preset("tiny-llama").replace(qkv_bias=True)  # a bias, to check it is not rounded


def _bf16(x):
    return np.asarray(jnp.asarray(x).astype(jnp.bfloat16).astype(jnp.float32))


@pytest.mark.parametrize("rows", [3, 1])  # one row takes the padded path (YNNPACK's bf16 kernels on CPU)
def test_dense_rounds_both_operands_and_sums_in_float32(rows):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((rows, 40)).astype(np.float32)
    w = rng.standard_normal((40, 24)).astype(np.float32)
    b = rng.standard_normal(24).astype(np.float32)
    layer = dense(24, jnp.float32, "proj", matmul_dtype=jnp.bfloat16, bias=True)
    variables = {"params": {"kernel": jnp.asarray(w), "bias": jnp.asarray(b)}}
    got = np.asarray(layer.apply(variables, jnp.asarray(x)))
    assert got.dtype == np.float32 and got.shape == (rows, 24)
    expected = _bf16(x).astype(np.float64) @ _bf16(w).astype(np.float64) + b
    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-5)
    exact = x.astype(np.float64) @ w.astype(np.float64) + b
    assert np.abs(got - exact).max() > 1e-3  # the rounding really happened (bf16 has 8 bits of mantissa)


def test_bfloat16_model_dots_sum_in_float32():
    """A bf16 model's Dense rounds once, after float32 sums (as PyTorch's bf16 Linear does)."""
    rng = np.random.default_rng(1)
    x = jnp.asarray(rng.standard_normal((2, 512)), jnp.bfloat16)
    w = jnp.asarray(rng.standard_normal((512, 8)), jnp.bfloat16)
    got = dense(8, jnp.bfloat16, "proj").apply({"params": {"kernel": w}}, x)
    assert got.dtype == jnp.bfloat16
    expected = (np.asarray(x, np.float64) @ np.asarray(w, np.float64)).astype(np.float32)
    np.testing.assert_array_equal(np.asarray(got, np.float32), _bf16(expected))


def test_kernels_are_declared_in_bfloat16_and_nothing_else_is():
    shapes = param_shapes(CONFIG.replace(matmul_dtype="bfloat16"))
    flat = {jax.tree_util.keystr(p): s.dtype for p, s in jax.tree_util.tree_leaves_with_path(shapes)}
    kernels = {k for k in flat if k.endswith("['kernel']")}
    assert len(kernels) == CONFIG.num_layers * 7 + 1  # q k v o gate up down per layer, lm_head
    assert {flat[k] for k in kernels} == {jnp.dtype(jnp.bfloat16)}
    assert {v for k, v in flat.items() if k not in kernels} == {jnp.dtype(jnp.float32)}  # biases, norms, embedding
    assert any(k.endswith("['bias']") for k in flat)


def test_with_matmul_dtype_stores_kernels_rounded_and_computes_the_same():
    config = CONFIG.replace(matmul_dtype="bfloat16")
    params = init_params(CONFIG, jax.random.key(0))
    _, stored = with_matmul_dtype(CONFIG, params, "bfloat16")
    kernel = stored["layers_0"]["mlp"]["gate_proj"]["kernel"]
    assert kernel.dtype == jnp.bfloat16
    assert stored["layers_0"]["attn"]["q_proj"]["bias"].dtype == jnp.float32
    tokens = jnp.arange(1, 13)[None]
    from_f32 = reference_logits(params, config, tokens)  # rounded inside each dot
    from_bf16 = reference_logits(stored, config, tokens)  # rounded once, when loaded
    np.testing.assert_allclose(from_bf16, from_f32, rtol=1e-6, atol=1e-6)
    full = reference_logits(params, CONFIG, tokens)
    assert 1e-5 < np.abs(full - from_f32).max() < 5e-2  # close to float32, not equal to it


def test_resolve_model_sets_matmul_dtype():
    config, params, _ = resolve_model("jaxserve/tiny-code-draft", matmul_dtype="bfloat16")
    assert config.matmul_dtype == "bfloat16" and config.dtype == "float32"
    assert params["lm_head"]["kernel"].dtype == jnp.bfloat16
    assert params["embed"]["embedding"].dtype == jnp.float32


def test_bad_matmul_dtype_is_named():
    with pytest.raises(ValueError, match="matmul_dtype.*'int8'"):
        ModelConfig(matmul_dtype="int8")
