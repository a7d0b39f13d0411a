"""LLM(..., quantization=fmt) serves the quantized params: same tokens as the dequantized model."""
import jax
import numpy as np
import pytest

from jaxserve import LLM, SamplingParams
from jaxserve.models import get_preset, init_params
from jaxserve.quant import dequantize_params, quantize_params

CONFIG = get_preset("tiny-llama").replace(max_position_embeddings=128)
PARAMS = init_params(CONFIG, jax.random.key(11))
ENGINE = dict(block_size=8, max_num_seqs=8, max_num_batched_tokens=32, num_kv_blocks=32)
PROMPTS = [[1, 2, 3, 4, 5], [9, 8, 7, 6, 5, 4, 3, 2, 1, 0, 11]]
GREEDY = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True, logprobs=True)


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4", "fp8"])  # int4 needs K % 128 == 0: not this tiny model
def test_quantized_engine_equals_dequantized_model(fmt):
    quantized = LLM.from_params(CONFIG, PARAMS, quantization=fmt, **ENGINE)
    reference = LLM.from_params(CONFIG, dequantize_params(quantize_params(PARAMS, fmt)), **ENGINE)
    unquantized = LLM.from_params(CONFIG, PARAMS, **ENGINE)
    got, expected, full = (llm.generate(PROMPTS, GREEDY, use_tqdm=False) for llm in (quantized, reference, unquantized))
    assert [o.outputs[0].token_ids for o in got] == [o.outputs[0].token_ids for o in expected]
    lp = lambda outs: np.concatenate([o.outputs[0].logprobs for o in outs])  # noqa: E731
    np.testing.assert_allclose(lp(got), lp(expected), atol=2e-5)
    assert np.abs(lp(got) - lp(full)).max() > 1e-4  # the quantization really happened


def test_unknown_quantization():
    with pytest.raises(ValueError, match="quantization must be one of"):
        LLM.from_params(CONFIG, PARAMS, quantization="fp3", **ENGINE)
