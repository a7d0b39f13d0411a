"""Medusa heads: initialisation from the LM head, the hidden-state capture, save/load, and the greedy
while-loop path (slow: one more program to compile)."""
import jax
import numpy as np
import pytest

from jaxserve.models import get_preset, init_params
from jaxserve.speculative.generate import medusa_generate, target_only_generate
from jaxserve.speculative.hidden import full_hidden
from jaxserve.speculative.medusa import MedusaConfig, init_medusa_params, load_heads, medusa_logits, save_heads

CONFIG = get_preset("tiny-llama").replace(vocab_size=16)


@pytest.fixture(scope="module")
def target():
    return init_params(CONFIG, jax.random.key(0))


def test_fresh_heads_reproduce_the_lm_head_from_the_captured_hidden_state(target):
    tokens = np.random.default_rng(0).integers(0, 16, (2, 9))
    logits, hidden = full_hidden(target, CONFIG, tokens)  # the logits are forward_full's (same module apply)
    heads_config = MedusaConfig(CONFIG.hidden_size, CONFIG.vocab_size, num_heads=3)
    heads = medusa_logits(init_medusa_params(heads_config, target, CONFIG), heads_config, hidden)
    assert heads.shape == (2, 9, 3, 16)
    for k in range(3):  # zero residual blocks and copied LM heads: every head starts as the LM head
        np.testing.assert_allclose(heads[:, :, k], logits, rtol=1e-5, atol=1e-5)


def test_heads_round_trip_through_disk(target, tmp_path):
    heads_config = MedusaConfig(CONFIG.hidden_size, CONFIG.vocab_size, num_heads=2)
    params = jax.tree.map(lambda x: x + 1.0, init_medusa_params(heads_config, target, CONFIG))
    save_heads(tmp_path, heads_config, params, info={"steps": 3})
    loaded_config, loaded = load_heads(tmp_path)
    assert loaded_config == heads_config
    jax.tree.map(np.testing.assert_array_equal, loaded, params)
    with pytest.raises(ValueError, match="no medusa heads at"):
        load_heads(tmp_path / "missing")


@pytest.mark.slow
def test_medusa_generate_greedy_equals_target_only(target):
    heads_config = MedusaConfig(CONFIG.hidden_size, CONFIG.vocab_size, num_heads=3)
    heads = init_medusa_params(heads_config, target, CONFIG)
    heads = jax.tree.map(lambda x: x + 0.05 * jax.random.normal(jax.random.key(1), x.shape), heads)
    prompts, lens = np.random.default_rng(0).integers(0, 16, (4, 16)), np.array([11, 3, 7, 16])
    reference, _, _ = target_only_generate(target, CONFIG, prompts, lens, max_tokens=16)
    tokens, n, _ = medusa_generate(target, CONFIG, heads, heads_config, prompts, lens, gamma=3, max_tokens=16)
    np.testing.assert_array_equal(np.asarray(tokens), np.asarray(reference))
    np.testing.assert_array_equal(np.asarray(n), 16)
    with pytest.raises(ValueError, match="num_speculative_tokens 4 exceeds the 3 medusa heads"):
        medusa_generate(target, CONFIG, heads, heads_config, prompts, lens, gamma=4)
