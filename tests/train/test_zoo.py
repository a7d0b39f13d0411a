import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxserve import LLM, SamplingParams
from jaxserve.models.checkpoint import load_model
from jaxserve.moe.router_state_file import load_router_state
from jaxserve.models import get_preset
from jaxserve.tokenizer import load_tokenizer
from jaxserve.train.zoo import card_figure, measure_perplexity
from jaxserve.zoo import available_models, zoo_path
from tests.reference_forward import reference_logits

ZOO = ["tiny-code", "tiny-code-draft", "tiny-code-moe"]


def test_unknown_zoo_name_lists_available():
    with pytest.raises(ValueError, match=r"unknown zoo model 'jaxserve/nope'; available: \[.*'tiny-code'"):
        zoo_path("jaxserve/nope")


@pytest.mark.parametrize("name", ZOO)
def test_zoo_model_loads_by_name(name):
    assert name in available_models()
    assert zoo_path(f"jaxserve/{name}") == zoo_path(name)
    config, params = load_model(zoo_path(name))
    assert config == get_preset(name)
    tok = load_tokenizer(zoo_path(name))
    assert tok.vocab_size == config.vocab_size and tok.eos_token_id == config.eos_token_id == 0
    assert tok.decode(tok.encode("def f(x):\n    return x\n")) == "def f(x):\n    return x\n"


@pytest.mark.parametrize("name", ZOO)
def test_zoo_slice_perplexity_matches_model_card(name):
    card = (zoo_path(name) / "MODEL_CARD.md").read_text()
    stated = card_figure(card, "val_slice_ppl")
    measured = measure_perplexity(name)["val_ppl"]
    assert abs(measured - stated) <= 0.02 * stated, (measured, stated)
    assert measured < 0.2 * get_preset(name).vocab_size  # far better than uniform over the vocabulary


def test_moe_zoo_model_carries_its_balancing_biases_and_generates_through_llm():
    config = load_model(zoo_path("tiny-code-moe"))[0]
    assert config.num_experts == 8 and config.num_experts_per_tok == 2 and config.num_shared_experts == 1
    biases = load_router_state(zoo_path("tiny-code-moe"))
    assert sorted(biases) == [f"layers_{i}" for i in range(config.num_layers)]
    assert all(layer["mlp"]["bias"].shape == (8,) and layer["mlp"]["bias"].any() for layer in biases.values())
    llm = LLM(model="jaxserve/tiny-code-moe", block_size=8, max_num_seqs=2, max_num_batched_tokens=32,
              num_kv_blocks=16)
    out = llm.generate(["def add(a, b):"], SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True,
                                                          logprobs=True))[0]
    assert len(out.outputs[0].token_ids) == 4
    # The engine routes with the biases: its log-probs are the uncached forward's with them, not without.
    _, params = load_model(zoo_path("tiny-code-moe"))
    tokens = jnp.asarray([out.prompt_token_ids + out.outputs[0].token_ids[:-1]])
    first = len(out.prompt_token_ids) - 1
    chosen = jnp.asarray(out.outputs[0].token_ids)

    def logprobs(router_state):
        logits = reference_logits(params, config, tokens, router_state=router_state)[0, first:]
        return np.asarray(jnp.take_along_axis(jax.nn.log_softmax(logits, -1), chosen[:, None], -1)[:, 0])
    engine = np.asarray(out.outputs[0].logprobs)
    np.testing.assert_allclose(engine, logprobs(biases), atol=2e-4)
    assert np.abs(engine - logprobs(None)).max() > 1e-3
