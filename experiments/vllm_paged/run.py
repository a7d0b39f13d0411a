"""vLLM / PagedAttention (Kwon et al., SOSP 2023) at small scale on jaxserve's engine.

The baselines are the same engine with a contiguous reservation per request (Orca-Max, -Pow2,
-Oracle; ``jaxserve.cache.reservation``) instead of blocks on demand. Sections: ``memory``
(Fig. 2 memory breakdown; Fig. 12/13 latency, throughput and batch vs Poisson request rate),
``sharing`` (Fig. 15: memory saved by parallel sampling and beam search), ``prefix`` (Fig. 16:
shared-prefix throughput), ``block_size`` (Fig. 18) and ``model`` (the real forward pass, wall
time). All but ``model`` replace the device by ``NullRunner``: under ``ignore_eos`` the schedule
does not depend on the tokens, which ``model`` checks by running both and comparing schedules.
"""
import dataclasses

import jax
import numpy as np

from experiments.vllm_paged.null_runner import NullRunner
from experiments.vllm_paged.serving import TimedRequest, serve
from jaxserve.bench.workload import make_workload, poisson_arrivals
from jaxserve.config import EngineConfig
from jaxserve.engine.beam_search import beam_search
from experiments.vllm_paged.kv_accounting import block_sharing
from jaxserve.engine.llm_engine import LLMEngine
from jaxserve.models import get_preset, init_params
from jaxserve.sampling_params import BeamSearchParams
from experiments.vllm_paged import report

PAPER_FIG2 = {"orca_max": 0.204, "orca_pow2": 0.268, "orca_oracle": 0.382, "paged": 0.963}  # token-state share


def run(cfg, out):
    unknown = set(cfg.sections) - set(SECTIONS)
    if unknown:
        raise ValueError(f"unknown sections {sorted(unknown)}; known: {list(SECTIONS)}")
    report.preamble(cfg, out)
    host = _host_model(cfg)
    for name in cfg.sections:
        SECTIONS[name](cfg, out, host)


# ---- engines and workloads ------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Model:
    config: object
    params: dict


def _host_model(cfg) -> Model:
    """The model shapes for the simulated engines (NullRunner replaces the device: no weights)."""
    return Model(get_preset("tiny-llama").replace(max_position_embeddings=cfg.max_model_len), {})


def engine(cfg, model: Model, policy: str, *, block_size=None, prefix_caching=False, device=False,
           on_execute=None, **sizes) -> LLMEngine:
    """An engine over ``cfg``'s memory (``sizes`` override kv_slots / max_* fields); NullRunner unless ``device``."""
    g = {k: sizes.get(k, getattr(cfg, k)) for k in ("kv_slots", "max_model_len", "max_num_seqs",
                                                      "max_num_batched_tokens")}
    bs = block_size or cfg.block_size
    ec = EngineConfig(block_size=bs, num_kv_blocks=g["kv_slots"] // bs, max_num_seqs=g["max_num_seqs"],
                      max_num_batched_tokens=g["max_num_batched_tokens"], max_model_len=g["max_model_len"],
                      enable_prefix_caching=prefix_caching, kv_allocation=policy, seed=cfg.seed)
    eng = LLMEngine(model.config, model.params, None, ec)
    if not device:
        eng.runner = NullRunner(model.config.vocab_size, cfg.seed, model.config.eos_token_id, on_execute)
    return eng


def requests(cfg, dataset, num, rate, vocab, *, n=1, max_model_len=None, length_scale=None, seed=0):
    """The dataset's first ``num`` requests (the same at every rate), arriving as Poisson(``rate``)."""
    w = make_workload(dataset, num, vocab, max_model_len or cfg.max_model_len, cfg.seed + seed,
                      length_scale=length_scale or cfg.length_scale)
    arrivals = poisson_arrivals(rate, num, cfg.seed + seed + 1)
    return [TimedRequest(float(a), r.prompt_token_ids, r.output_len, n) for a, r in zip(arrivals, w)]


def _summary(res, **keys) -> dict:
    s = res.summary()
    kv = s.pop("kv_saturated") or s["kv"]  # the saturated steps; all steps if none was
    s.pop("kv")
    return {**keys, **s, **{f"kv_{k}": v for k, v in kv.items()}}


# ---- sections -------------------------------------------------------------------------------

def memory(cfg, out, host):
    rows = []
    runs = [(ds, p, r) for ds in cfg.datasets for p in cfg.policies for r in _rates(cfg, ds)]
    for ds, policy, rate in out.progress(runs, desc="memory: policy x rate"):
        reqs = requests(cfg, ds, _num(cfg, ds), rate, host.config.vocab_size)
        eng = engine(cfg, host, policy)
        rows.append(_summary(serve(eng, reqs, probe_every=cfg.probe_every), dataset=ds, policy=policy, rate=rate))
    report.memory(cfg, out, rows, PAPER_FIG2)


def sharing(cfg, out, host):
    rows = []
    for ds in out.progress(cfg.datasets, desc="sharing"):
        rate = getattr(cfg, f"sharing_rate_{ds}")
        for n in cfg.sharing_n:
            reqs = requests(cfg, ds, cfg.sharing_requests, rate, host.config.vocab_size, n=n, seed=7)
            # prefix caching on: a sample recomputed after a preemption finds its prompt's blocks again
            res = serve(engine(cfg, host, "paged", prefix_caching=True), reqs, probe_every=cfg.probe_every)
            rows.append({"dataset": ds, "mode": "parallel sampling", "width": n,
                         "saving": res.summary()["sharing_saving"], "preemptions": res.preemptions})
        for width in cfg.beam_widths:
            saving, preemptions = _beam_saving(cfg, host, ds, width)
            rows.append({"dataset": ds, "mode": "beam search", "width": width, "saving": saving,
                         "preemptions": preemptions})
    report.sharing(cfg, out, rows)


def _beam_saving(cfg, host, dataset, width) -> tuple[float, int]:
    """Memory saved by sharing during beam search over the dataset's prompts (one at a time), preemptions."""
    samples = []
    eng = engine(cfg, host, "paged", on_execute=lambda _: samples.append(block_sharing(eng.scheduler)))
    for r in make_workload(dataset, cfg.beam_prompts, host.config.vocab_size, cfg.max_model_len, cfg.seed + 11,
                           length_scale=cfg.length_scale):
        beam_search(eng, [r.prompt_token_ids], BeamSearchParams(beam_width=width, max_tokens=r.output_len))
    return 1.0 - sum(p for p, _ in samples) / sum(u for _, u in samples), eng.scheduler.num_preemptions


def prefix(cfg, out, host):
    rows = []
    rng = np.random.default_rng(cfg.seed + 21)
    variants = [("paged", True), ("paged", False), ("orca_oracle", False)]
    for plen in out.progress(cfg.prefix_lens, desc="shared prefix"):
        shared = rng.integers(1, host.config.vocab_size, plen).tolist()
        reqs = _prefixed(cfg, shared, host.config.vocab_size, rng)
        for policy, caching in variants:
            res = serve(engine(cfg, host, policy, prefix_caching=caching), reqs, probe_every=cfg.probe_every)
            rows.append(_summary(res, prefix_len=plen, policy=policy, prefix_caching=caching))
    report.prefix(cfg, out, rows)


def _prefixed(cfg, shared, vocab, rng):
    """Requests = the shared few-shot prefix + a log-normal sentence; log-normal outputs (sigma 0.5)."""
    def lengths(mean):
        return np.maximum(2, rng.lognormal(np.log(mean) - 0.125, 0.5, cfg.prefix_requests)).astype(int)
    arrivals = poisson_arrivals(cfg.prefix_rate, cfg.prefix_requests, cfg.seed + 22)
    return [TimedRequest(float(a), shared + rng.integers(1, vocab, int(i)).tolist(), int(o))
            for a, i, o in zip(arrivals, lengths(cfg.prefix_input_mean), lengths(cfg.prefix_output_mean))]


def block_size(cfg, out, host):
    rows = []
    runs = [(ds, bs, r) for ds in cfg.datasets for bs in cfg.block_sizes for r in getattr(cfg, f"block_rates_{ds}")]
    for ds, bs, rate in out.progress(runs, desc="block size"):
        reqs = requests(cfg, ds, _num(cfg, ds), rate, host.config.vocab_size)
        res = serve(engine(cfg, host, "paged", block_size=bs), reqs, probe_every=cfg.probe_every)
        rows.append(_summary(res, dataset=ds, block_size=bs, rate=rate))
    report.block_size(cfg, out, rows)


def model(cfg, out, host):
    """The real forward pass on the scaled-down setting: wall time, and the schedule NullRunner gives."""
    m = _load(cfg)
    sizes = dict(kv_slots=cfg.model_kv_slots, max_model_len=cfg.model_max_model_len,
                 max_num_seqs=cfg.model_max_num_seqs, max_num_batched_tokens=cfg.model_max_num_batched_tokens)
    reqs = requests(cfg, cfg.model_dataset, cfg.model_requests, cfg.model_rate, m.config.vocab_size,
                    max_model_len=cfg.model_max_model_len, length_scale=cfg.model_length_scale)
    rows = []
    for policy in out.progress(cfg.model_policies, desc="model forward"):
        if cfg.model_warmup:
            serve(engine(cfg, m, policy, device=True, **sizes), reqs)  # compiles the buckets it hits
        eng = engine(cfg, m, policy, device=True, **sizes)
        res = serve(eng, reqs)
        sim = serve(engine(cfg, m, policy, **sizes), reqs)
        rows.append({**_summary(res, policy=policy), "compilations_timed_run": eng.runner.num_compilations,
                     "same_schedule_as_null_runner": sim.finish == res.finish and sim.batch == res.batch})
    report.model(cfg, out, rows, m.config)


SECTIONS = {"memory": memory, "sharing": sharing, "prefix": prefix, "block_size": block_size, "model": model}


def _load(cfg) -> Model:
    if cfg.model.startswith("random:"):
        config = get_preset(cfg.model.split(":", 1)[1])
        config = config.replace(max_position_embeddings=max(config.max_position_embeddings, cfg.model_max_model_len))
        # jitted: one program, where op-by-op initialisation compiled ~60 small ones (~7 s of a smoke run)
        return Model(config, jax.jit(init_params, static_argnums=0)(config, jax.random.key(cfg.seed)))
    from jaxserve.models.loading import resolve_model
    config, params, _ = resolve_model(cfg.model)
    return Model(config, params)


def _rates(cfg, dataset):
    return getattr(cfg, f"{dataset}_rates")


def _num(cfg, dataset):
    return getattr(cfg, f"{dataset}_requests")
