"""MoE configs in the model family: validation, dense models untouched, paged serving path."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxserve.models.attention_backends import new_kv_pool
from jaxserve.config import ModelConfig
from jaxserve.models import forward, forward_full, get_preset, param_shapes
from jaxserve.models.transformer import init_params
from jaxserve.moe import MoEBlock
from tests.models.test_cached_forward import BLOCK, metadata
from tests.moe.conftest import moe_config


@pytest.mark.parametrize("kw,match", [
    (dict(num_experts_per_tok=9), "num_experts_per_tok=9 must be in"),
    (dict(num_experts=-2), "num_experts must be >= 0"),
    (dict(router="switch"), "router must be one of"),
    (dict(router="deepseek_v3", n_group=3), "n_group=3 must be >= 1 and divide num_experts=8"),
    (dict(router="deepseek_v3", n_group=4, topk_group=5), "topk_group=5 must be in"),
    (dict(router="deepseek_v3", n_group=4, topk_group=1, num_experts_per_tok=3), "exceeds the experts"),
    (dict(n_group=2), "needs router='deepseek_v3'"),
    (dict(moe_layer_freq=0), "moe_layer_freq must be >= 1"),
])
def test_bad_moe_configs_are_value_errors(kw, match):
    with pytest.raises(ValueError, match=match):
        moe_config(**kw)


def test_dense_configs_are_unchanged():
    config = get_preset("tiny-llama")
    assert config.num_experts == 0 and not any(config.is_moe_layer(i) for i in range(config.num_layers))
    mlp = param_shapes(config)["layers_0"]["mlp"]
    assert sorted(mlp) == ["down_proj", "gate_proj", "up_proj"] and "kernel" in mlp["gate_proj"]


def test_moe_layer_selection():
    config = moe_config(num_layers=6, first_k_dense=1, moe_layer_freq=2)
    assert [config.is_moe_layer(i) for i in range(6)] == [False, True, False, True, False, True]
    shapes = param_shapes(config.replace(num_shared_experts=2))
    assert shapes["layers_1"]["mlp"]["gate_proj"].shape == (8, 32, 24)
    assert shapes["layers_1"]["mlp"]["shared_experts"]["gate_proj"]["kernel"].shape == (32, 48)
    assert shapes["layers_0"]["mlp"]["gate_proj"]["kernel"].shape == (32, 48)


def test_block_accepts_packed_and_batched_tokens():
    config = moe_config(router="deepseek_v3", num_shared_experts=1, n_group=2, topk_group=1)
    x = jax.random.normal(jax.random.key(0), (3, 5, 32))
    block = MoEBlock(config)
    params = block.init(jax.random.key(1), x)["params"]
    apply = jax.jit(lambda x: block.apply({"params": params}, x))
    y3, stats = apply(x)
    y2, _ = apply(x.reshape(15, 32))
    np.testing.assert_allclose(y3.reshape(15, 32), y2, atol=1e-6)
    assert float(stats.load.sum()) == 15 * 2 and int(stats.dropped) == 0


def test_paged_forward_equals_full_forward():
    config = moe_config(router="qwen3_moe", num_shared_experts=1, first_k_dense=1)
    params = jax.jit(init_params, static_argnums=0)(config, jax.random.key(0))
    rng = np.random.default_rng(0)
    lengths = [6, 6]  # equal, so one batched forward_full is the oracle for both
    tokens = [rng.integers(0, config.vocab_size, n + 1) for n in lengths]  # prompt, then one decode step
    tables = [[3, 1], [0, 2]]
    pool = new_kv_pool(config, 4, BLOCK, "auto")  # the layout forward's default impl reads
    step = jax.jit(lambda toks, pos, pool, meta: forward(params, config, toks, pos, pool, meta))
    meta = metadata(tables, [0, 0], lengths)
    prefill, pool = step(jnp.array(np.concatenate([t[:n] for t, n in zip(tokens, lengths)]), jnp.int32),
                         jnp.array(np.concatenate([np.arange(n) for n in lengths]), jnp.int32), pool, meta)
    meta = metadata(tables, lengths, [1, 1], decode_only=True)
    decode, _ = step(jnp.array([t[n] for t, n in zip(tokens, lengths)], jnp.int32),
                     jnp.array(lengths, jnp.int32), pool, meta)
    expected_all = np.asarray(jax.jit(forward_full, static_argnums=1)(params, config, jnp.array(np.stack(tokens))))
    for b, n in enumerate(lengths):
        expected = expected_all[b]
        got = np.concatenate([np.split(np.asarray(prefill), [lengths[0]])[b], np.asarray(decode)[b:b + 1]])
        np.testing.assert_allclose(got, expected, atol=1e-5)


def test_model_config_overrides_reach_moe_fields():
    from jaxserve.config import apply_overrides
    config = apply_overrides(ModelConfig(), ["num_experts=4", "num_experts_per_tok=1", "router=qwen3_moe"])
    assert config.is_moe_layer(0) and config.router == "qwen3_moe"
    with pytest.raises(ValueError, match="num_experts_per_tok=5"):
        apply_overrides(ModelConfig(), ["num_experts=4", "num_experts_per_tok=5"])
