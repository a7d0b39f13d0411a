"""A mixed-length workload compiles at most one program per bucket, and nothing after warm-up."""
import jax
import numpy as np
import pytest

from jaxserve import LLM, SamplingParams
from jaxserve.models import get_preset, init_params

CONFIG = get_preset("tiny-llama").replace(max_position_embeddings=256)


def run_workload(num_requests, seed=0):
    llm = LLM.from_params(CONFIG, init_params(CONFIG, jax.random.key(0)), block_size=16, max_num_seqs=8,
                          max_num_batched_tokens=64, num_kv_blocks=48)
    warm = llm.warmup()
    assert warm == llm.stats()["compilations"] <= llm.stats()["buckets"]
    rng = np.random.default_rng(seed)
    prompts = [rng.integers(0, CONFIG.vocab_size, int(n)).tolist() for n in rng.integers(1, 120, num_requests)]
    params = [SamplingParams(max_tokens=int(m), temperature=0.7, seed=i, ignore_eos=True)
              for i, m in enumerate(rng.integers(1, 100, num_requests))]
    outs = llm.generate(prompts, params, use_tqdm=False)
    assert [len(o.outputs[0].token_ids) for o in outs] == [p.max_tokens for p in params]
    stats = llm.stats()
    assert stats["compilations"] == warm  # nothing compiled after warm-up
    assert stats["kv_blocks_used"] == 0
    return stats


def test_compilations_bounded_by_buckets():
    stats = run_workload(60)
    assert stats["num_preemptions"] > 0  # the workload did exercise preemption and chunked prefill


@pytest.mark.slow
def test_thousand_requests_compile_nothing_after_warmup():
    run_workload(1000, seed=1)
