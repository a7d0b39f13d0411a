"""End to end: the engine's greedy outputs are identical with the Pallas kernels (interpret mode
on CPU) and with the XLA reference, on a tiny random model with chunked prefill and decode."""
import jax
import numpy as np

from jaxserve import LLM, SamplingParams
from jaxserve.models import get_preset, init_params


def test_greedy_tokens_identical_pallas_vs_reference():
    config = get_preset("tiny-llama").replace(vocab_size=97, max_position_embeddings=128,
                                              eos_token_id=96)
    params = init_params(config, jax.random.key(3))
    rng = np.random.default_rng(3)
    # Few distinct step shapes (each compiles once, and interpret-mode kernels compile slowly):
    # one packed prefill of both prompts across page boundaries, then batched decode steps.
    prompts = [rng.integers(0, 96, int(n)).tolist() for n in (6, 9)]
    greedy = SamplingParams(max_tokens=4, temperature=0, ignore_eos=True)
    engine = dict(block_size=4, max_num_seqs=2, max_num_batched_tokens=16, num_kv_blocks=16)

    def run(impl):
        llm = LLM.from_params(config, params, attention_impl=impl, **engine)
        return [o.outputs[0].token_ids for o in llm.generate(prompts, greedy, use_tqdm=False)]

    assert run("pallas") == run("reference")
