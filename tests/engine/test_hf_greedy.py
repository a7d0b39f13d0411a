"""Greedy LLM.generate equals HF transformers generate token for token."""
import numpy as np
import pytest

try:  # the peers extra; without it these tests skip by their marker (tests/conftest.py)
    import torch
    import transformers
except ImportError:
    torch = transformers = None

from jaxserve import LLM, SamplingParams

pytestmark = pytest.mark.peers


def hf_greedy(model, prompt, max_tokens):
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=max_tokens, do_sample=False,
                             output_logits=True, return_dict_in_generate=True, pad_token_id=0)
    tokens = out.sequences[0, len(prompt):].tolist()
    margins = [float(torch.topk(l[0], 2).values.diff().abs()) for l in out.logits]
    return tokens, margins


@pytest.mark.parametrize("kind", ["llama", "qwen3"])
def test_greedy_matches_transformers(hf_dirs, kind):
    path, model = hf_dirs[kind]
    llm = LLM(path, block_size=8, max_num_seqs=8, max_num_batched_tokens=64, num_kv_blocks=64)
    rng = np.random.default_rng(0)
    prompts = [rng.integers(1, 100, n).tolist() for n in (5, 17, 33, 8, 24, 1)]
    outs = llm.generate(prompts, SamplingParams(max_tokens=20, temperature=0, ignore_eos=True), use_tqdm=False)
    for prompt, out in zip(prompts, outs):
        expected, margins = hf_greedy(model, prompt, 20)
        got = out.outputs[0].token_ids
        assert out.prompt_token_ids == prompt and len(got) == 20
        first_diff = next((i for i, (a, b) in enumerate(zip(got, expected)) if a != b), None)
        # a divergence is acceptable only right after HF's top two logits (near-)tie
        assert first_diff is None or margins[first_diff] < 1e-4, (first_diff, got, expected)
    assert llm.stats()["kv_blocks_used"] == 0
