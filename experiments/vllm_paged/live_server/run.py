"""vLLM / PagedAttention (Kwon et al., SOSP 2023) against a live server: sustained request rate at a latency target.

For each KV policy (paged, and the Orca baselines' contiguous reservations), a ``jaxserve serve`` process
serves the model over HTTP; ``jaxserve bench serve`` sends ShareGPT-like requests at each Poisson rate
(``jaxserve.bench.rate_sweep``), measuring throughput, TTFT, TPOT and the normalized latency (end-to-end
latency / output tokens, the paper's Figure 12 axis) in wall-clock time, client and server in separate
processes. The sustained rate is the highest whose normalized latency stays under the target.
"""
from jaxserve.bench.rate_sweep import served_model, sweep
from jaxserve.bench.server_process import ServerProcess
from jaxserve.bench.workload import make_workload
from experiments.vllm_paged.live_server import report

def run(cfg, out):
    report.preamble(cfg, out)
    rows, requests = [], None
    for policy in out.progress(cfg.policies, desc="policies"):
        with ServerProcess(cfg.model, _overrides(cfg, policy), [] if cfg.warmup else ["--no-warmup"]) as url:
            if requests is None:  # token-id prompts below the served model's vocabulary, the same for every policy
                requests = make_workload(cfg.dataset, cfg.num_requests, served_model(url)["vocab_size"],
                                         cfg.max_model_len, cfg.seed, length_scale=cfg.length_scale)
            rows += [{"policy": policy, **r} for r in sweep(url, requests, cfg.rates, stop_factor=cfg.stop_factor,
                                                            warm=cfg.warm_requests, seed=cfg.seed)]
    report.points(cfg, out, rows)
    report.sustained(cfg, out, rows)


def _overrides(cfg, policy: str) -> list[str]:
    return [f"engine.kv_allocation={policy}", f"engine.num_kv_blocks={cfg.kv_slots // cfg.block_size}",
            f"engine.block_size={cfg.block_size}", f"engine.max_model_len={cfg.max_model_len}",
            f"engine.max_num_seqs={cfg.max_num_seqs}", f"engine.max_num_batched_tokens={cfg.max_num_batched_tokens}",
            "engine.enable_prefix_caching=false", f"engine.seed={cfg.seed}"]

