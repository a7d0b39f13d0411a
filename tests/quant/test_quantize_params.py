"""quantize_params: which leaves change, what they cost in bytes, and how the pytree travels."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxserve.config import ModelConfig
from jaxserve.models import param_shapes
from jaxserve.quant import (dequantize_params, is_quantized, kernel_plan, quantization_report, quantize_params,
                            weight_bytes)
from pallas_kernels.fp4 import QuantizedTensor, dequantize


def _leaves(tree):
    return {jax.tree_util.keystr(p): x for p, x in jax.tree_util.tree_leaves_with_path(tree, is_leaf=is_quantized)}


def test_only_selected_dense_kernels_are_replaced(params, nvfp4_params):
    before, after = _leaves(params), _leaves(nvfp4_params)
    assert before.keys() == after.keys()
    for k, x in after.items():
        is_kernel = k.endswith("['kernel']") and "lm_head" not in k
        assert is_quantized(x) == is_kernel, k
        if is_kernel:
            assert (x.fmt, x.axis, x.shape) == ("nvfp4", 0, before[k].shape)
        else:  # embed, lm_head, norms, biases: the very same arrays
            assert x is before[k], k


def test_nvfp4_bytes_shrink_to_about_4_5_bits(params, nvfp4_params):
    r = quantization_report(params, nvfp4_params)
    assert r.num_quantized == 14 and r.quantized_elements == 2 * (2 * 64 * 64 + 2 * 64 * 32 + 3 * 64 * 176)
    assert 4.5 <= r.bits_per_quantized_weight < 4.51  # 4 bits + one E4M3 byte per 16 + f32 tensor scales
    assert r.bytes_after == r.bytes_before - 4 * r.quantized_elements + r.quantized_bytes  # f32 model
    assert weight_bytes(nvfp4_params) == r.bytes_after < r.bytes_before


def test_dequantize_params_inverts_the_container(params, nvfp4_params):
    deq, source = _leaves(dequantize_params(nvfp4_params)), _leaves(params)
    for k, x in _leaves(nvfp4_params).items():
        assert not is_quantized(deq[k]) and deq[k].dtype == source[k].dtype
        np.testing.assert_array_equal(deq[k], dequantize(x) if is_quantized(x) else x)


def test_quantized_pytree_passes_through_jit_and_tree_map(nvfp4_params):
    out = jax.jit(lambda p: jax.tree.map(lambda x: x, p))(nvfp4_params)
    assert jax.tree.structure(out) == jax.tree.structure(nvfp4_params)
    mapped = jax.tree.map(lambda x: x, nvfp4_params)
    qt = mapped["layers_0"]["attn"]["q_proj"]["kernel"]
    assert isinstance(qt, QuantizedTensor) and qt.data.dtype == jnp.uint8 and qt.data.shape == (32, 64)
    for a, b in zip(jax.tree.leaves(out), jax.tree.leaves(nvfp4_params)):
        np.testing.assert_array_equal(np.asarray(a).view(np.uint8) if a.dtype.itemsize == 1 else a,
                                      np.asarray(b).view(np.uint8) if b.dtype.itemsize == 1 else b)


def test_selection_patterns_and_reasons(params):
    plan = kernel_plan(params, "mxfp4", include=("mlp", "layers_0/attn/*"), exclude=("lm_head", "gate_proj"))
    assert plan["layers_0/attn/q_proj/kernel"] == "quantize"
    assert plan["layers_1/attn/q_proj/kernel"] == "not included"
    assert plan["layers_1/mlp/gate_proj/kernel"] == "excluded"
    assert plan["layers_1/mlp/up_proj/kernel"] == "quantize"
    assert "176" in plan["layers_0/mlp/down_proj/kernel"]  # K=176 is not a multiple of 32
    assert "embed/embedding" not in plan  # embeddings are not Dense kernels
    small = kernel_plan(params, "nvfp4", min_size=64 * 100)
    assert small["layers_0/attn/q_proj/kernel"].startswith("smaller") and small["layers_0/mlp/up_proj/kernel"] == "quantize"


def test_moe_expert_banks_and_router_are_not_kernels():
    moe = ModelConfig(vocab_size=61, hidden_size=32, intermediate_size=48, num_layers=2, num_heads=2, num_kv_heads=1,
                      head_dim=16, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=24,
                      num_shared_experts=1)
    plan = kernel_plan(param_shapes(moe), "nvfp4")
    assert "layers_0/mlp/shared_experts/up_proj/kernel" in plan
    assert not any(k.endswith(("router", "mlp/gate_proj", "mlp/up_proj", "mlp/down_proj")) for k in plan)


@pytest.mark.parametrize("fmt, opts, match", [("fp6", {}, "unknown quantization format 'fp6'"),
                                              ("mxfp4", {"group_size": 32}, "takes options"),
                                              ("fp8", {"scaling": "block"}, "scaling")])
def test_bad_format_or_option_is_a_value_error(params, fmt, opts, match):
    with pytest.raises(ValueError, match=match):
        quantize_params(params, fmt, **opts)


def test_lm_head_quantizes_an_untied_head_kernel_or_else_the_tied_embedding_along_e(params):
    paths = lambda qp: {jax.tree_util.keystr(p): leaf for p, leaf in  # noqa: E731
                        jax.tree_util.tree_leaves_with_path(qp, is_leaf=is_quantized)}
    untied = paths(quantize_params(params, "nvfp4", lm_head=True))
    head = [leaf for p, leaf in untied.items() if "lm_head" in p]
    assert head and all(is_quantized(leaf) and leaf.axis == 0 for leaf in head)
    assert not any(is_quantized(leaf) for p, leaf in untied.items() if "embedding" in p)
    tied = _drop_lm_head(params)
    quantized = paths(quantize_params(tied, "mxfp4", lm_head=True))
    (table,) = [leaf for p, leaf in quantized.items() if "embedding" in p]
    assert is_quantized(table) and table.axis == 1 and table.fmt == "mxfp4"
    assert not any(is_quantized(leaf) for p, leaf in paths(quantize_params(tied, "mxfp4")).items()
                   if "embedding" in p)
    with pytest.raises(TypeError, match="lm_head must be a bool"):
        quantize_params(tied, "nvfp4", lm_head="yes")


def _drop_lm_head(tree):
    """params as a tied model holds them: no lm_head."""
    if isinstance(tree, dict):
        return {k: _drop_lm_head(v) for k, v in tree.items() if k != "lm_head"}
    return tree
