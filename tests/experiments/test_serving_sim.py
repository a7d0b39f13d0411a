"""Online serving on LLMEngine with the device replaced (NullRunner), the KV allocation policies,
and the synthetic workloads (no step program is compiled here)."""
import numpy as np
import pytest

from experiments.vllm_paged.null_runner import NullRunner
from experiments.vllm_paged.serving import TimedRequest, serve
from jaxserve.bench.workload import make_workload, poisson_arrivals
from jaxserve.config import EngineConfig
from jaxserve.engine.llm_engine import LLMEngine
from jaxserve.engine.scheduler import AdmitAll
from jaxserve.models import get_preset

CONFIG = get_preset("tiny-llama")


@pytest.fixture(scope="module")
def params():
    return {}  # NullRunner replaces the device: the weights are never read


def sim_engine(params, policy, num_kv_blocks=16, **kw):
    ec = EngineConfig(block_size=8, num_kv_blocks=num_kv_blocks, max_num_seqs=8, max_num_batched_tokens=64,
                      max_model_len=128, enable_prefix_caching=False, kv_allocation=policy, **kw)
    eng = LLMEngine(CONFIG, params, None, ec)
    eng.runner = NullRunner(CONFIG.vocab_size)
    return eng


def test_kv_allocation_is_validated():
    with pytest.raises(ValueError, match="kv_allocation must be one of .* got 'contiguous'"):
        EngineConfig(kv_allocation="contiguous")


def test_contiguous_policy_reserves_over_the_same_memory_with_spare_blocks(params):
    eng = sim_engine(params, "orca_oracle")
    assert eng.scheduler.admission.space.capacity == 16 * 8
    assert eng.block_manager.num_blocks == 16 + 8  # one spare block per seat for partial last blocks
    assert isinstance(sim_engine(params, "paged").scheduler.admission, AdmitAll)


@pytest.mark.parametrize("policy", ["paged", "orca_oracle", "orca_max"])
def test_serve_latencies_in_steps(params, policy):
    rng = np.random.default_rng(1)
    reqs = [TimedRequest(float(a), rng.integers(1, 500, int(p)).tolist(), int(o))
            for a, p, o in zip([0, 500, 501, 502, 503], [5, 20, 9, 30, 12], [7, 40, 25, 3, 60])]
    res = serve(sim_engine(params, policy), reqs)
    lat = np.array(res.finish) - np.array(res.arrival)
    assert lat[0] == 7  # alone: the prefill step gives the first token, then one token per step
    assert (lat >= np.array(res.output_len)).all()
    s = res.summary()
    assert s["requests"] == 5 and s["max_batch"] <= 4 and s["preemptions"] == 0
    assert s["kv"]["token_states"] > 0
    if policy == "orca_max":  # 128 slots of memory, 128 reserved per request: one at a time
        assert s["max_batch"] == 1 and lat[4] > 3 + 25 + 40


def test_workload_means_and_arrivals():
    for name, (mean_in, mean_out) in {"sharegpt": (161, 338), "alpaca": (19, 58)}.items():
        w = make_workload(name, 4000, 100, 100_000, seed=0)
        ins = np.mean([len(r.prompt_token_ids) for r in w])
        outs = np.mean([r.output_len for r in w])
        assert ins == pytest.approx(mean_in, rel=0.08) and outs == pytest.approx(mean_out, rel=0.08), name
    half = make_workload("sharegpt", 4000, 100, 100_000, seed=0, length_scale=0.5)
    assert np.mean([r.output_len for r in half]) == pytest.approx(338 / 2, rel=0.08)
    gaps = np.diff(poisson_arrivals(0.25, 4000, seed=0))
    assert gaps.mean() == pytest.approx(4.0, rel=0.06) and (gaps >= 0).all()
    with pytest.raises(ValueError, match="rate must be > 0, got 0"):
        poisson_arrivals(0, 3)
    with pytest.raises(ValueError, match="unknown workload 'lmsys'"):
        make_workload("lmsys", 3, 100, 64)
