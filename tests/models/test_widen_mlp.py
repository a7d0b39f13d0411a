"""widen_mlp: a dense model's MLPs widened by zero weights compute the same function (the stand-in for a
target past the caches in the speculative-decoding measurements)."""
import jax
import numpy as np
import pytest

from jaxserve.models import get_preset, init_params
from jaxserve.models.loading import widen_mlp, with_matmul_dtype
from jaxserve.speculative.generate import target_only_generate
from tests.reference_forward import reference_logits

CONFIG = get_preset("tiny-llama")


@pytest.fixture(scope="module")
def params():
    return init_params(CONFIG, jax.random.key(0))


def test_widened_weights_are_the_old_ones_padded_with_zeros(params):
    wide_cfg, wide = widen_mlp(CONFIG, params, 240)
    assert wide_cfg.intermediate_size == 240 and CONFIG.intermediate_size == 176
    mlp, old = wide["layers_1"]["mlp"], params["layers_1"]["mlp"]
    assert mlp["gate_proj"]["kernel"].shape == (64, 240) and mlp["down_proj"]["kernel"].shape == (240, 64)
    np.testing.assert_array_equal(mlp["up_proj"]["kernel"][:, :176], old["up_proj"]["kernel"])
    np.testing.assert_array_equal(mlp["down_proj"]["kernel"][:176], old["down_proj"]["kernel"])
    assert not np.any(mlp["gate_proj"]["kernel"][:, 176:]) and not np.any(mlp["down_proj"]["kernel"][176:])
    q_proj = lambda p: p["layers_1"]["attn"]["q_proj"]["kernel"]  # noqa: E731
    np.testing.assert_array_equal(q_proj(wide), q_proj(params))


@pytest.mark.parametrize("matmul_dtype", [None, "bfloat16"])
def test_widened_model_computes_the_same_logits_and_greedy_tokens(params, matmul_dtype):
    cfg, p = with_matmul_dtype(CONFIG, params, matmul_dtype)
    wide_cfg, wide = widen_mlp(cfg, p, 512)
    tokens = np.random.default_rng(0).integers(0, CONFIG.vocab_size, (2, 12))
    # only the order of a float32 sum over more (zero) terms can differ
    np.testing.assert_allclose(reference_logits(wide, wide_cfg, tokens), reference_logits(p, cfg, tokens),
                               rtol=0, atol=2e-5)
    prompt = tokens[:1]
    base = target_only_generate(p, cfg, prompt, [12], max_tokens=16)[0]
    np.testing.assert_array_equal(target_only_generate(wide, wide_cfg, prompt, [12], max_tokens=16)[0], base)


def test_bad_widths_and_moe_models_are_refused(params):
    with pytest.raises(ValueError, match="intermediate 100 is below the model's intermediate_size 176"):
        widen_mlp(CONFIG, params, 100)
    with pytest.raises(ValueError, match="num_experts=8"):
        widen_mlp(get_preset("tiny-code-moe"), params, 512)
