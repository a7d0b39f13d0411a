"""``jaxserve bench throughput``: offline throughput in the style of ``vllm bench throughput``.

Runs N requests (lengths from a named distribution, ``ignore_eos`` so every request produces its
requested number of tokens) through jaxserve or through HF ``transformers.generate`` (batched,
CPU) on the same weights, and reports requests/s, output tokens/s, KV utilisation and
compilations as JSON.
"""
from __future__ import annotations

import argparse
import datetime
import json
import platform
import tempfile
import time

import jax

from jaxserve.bench.workload import make_workload


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="jaxserve bench throughput")
    p.add_argument("--model", default="random:small-llama",
                   help="zoo name, checkpoint dir, HF dir, or random:<preset> (random weights)")
    p.add_argument("--backend", choices=["jaxserve", "hf"], default="jaxserve")
    p.add_argument("--dataset", choices=["random", "sharegpt"], default="random")
    p.add_argument("--num-prompts", type=int, default=64)
    p.add_argument("--input-len", type=int, nargs=2, default=(32, 96), metavar=("LO", "HI"))
    p.add_argument("--output-len", type=int, nargs=2, default=(64, 192), metavar=("LO", "HI"))
    p.add_argument("--max-model-len", type=int, default=1024)
    p.add_argument("--hf-max-batch-size", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--speculative-config", default=None, metavar="JSON",
                   help='speculative decoding, e.g. \'{"method": "draft_model", "draft_model": '
                        '"jaxserve/tiny-code-draft", "num_speculative_tokens": 3}\' (jaxserve backend)')
    p.add_argument("--out", default=None, help="write the JSON result here")
    p.add_argument("overrides", nargs="*", help="engine overrides, e.g. engine.max_num_seqs=64")
    return p


def _load(model: str, seed: int):
    from jaxserve.models import get_preset, init_params
    from jaxserve.models.loading import resolve_model
    if model.startswith("random:"):
        config = get_preset(model.split(":", 1)[1])
        return config, init_params(config, jax.random.key(seed)), None
    return resolve_model(model)  # (config, params, tokenizer): a draft model is checked against the tokenizer


def run_jaxserve(config, params, requests, max_model_len, overrides, speculative=None, tokenizer=None) -> dict:
    from jaxserve.engine.llm import LLM
    from jaxserve.sampling_params import SamplingParams
    from jaxserve.config import engine_kwargs
    engine = {**engine_kwargs(overrides), "max_model_len": max_model_len}
    llm = LLM.from_params(config, params, tokenizer, speculative=speculative, **engine)
    sps = [SamplingParams(max_tokens=r.output_len, temperature=0, ignore_eos=True) for r in requests]
    # Warm-up compiles every shape bucket (a speculative engine: its fill, round and copy programs),
    # so the timed run measures serving, not compilation; compilations after it are reported (should be 0).
    warm_start = time.perf_counter()
    llm.warmup()
    warmup_s = time.perf_counter() - warm_start
    compiles_before = _compilations(llm.stats())
    engine_ = llm.engine
    for r, sp in zip(requests, sps):
        engine_.add_request(r.prompt_token_ids, sp)
    peak_used, steps = 0, 0
    start = time.perf_counter()
    while engine_.has_unfinished():
        engine_.step()
        steps += 1
        peak_used = max(peak_used, engine_.block_manager.num_used)
    elapsed = time.perf_counter() - start
    stats = llm.stats()
    spec = {k: v for k, v in stats.items() if k.startswith("spec_")}
    return {"elapsed_s": elapsed, "warmup_s": warmup_s, "steps": steps, **spec,
            "kv_blocks_total": stats["kv_blocks_total"],
            "kv_peak_utilisation": peak_used / stats["kv_blocks_total"], "preemptions": stats["num_preemptions"],
            "compilations_total": _compilations(stats), "compilations_after_warmup": _compilations(stats) - compiles_before,
            "buckets": stats["buckets"], "engine": {k: v for k, v in engine.items()}}


def _compilations(stats: dict) -> int:
    return stats["compilations"]


def run_hf(config, params, requests, max_batch_size) -> dict:
    import torch
    import transformers
    from jaxserve.models.hf_export import save_hf
    torch.set_num_threads(torch.get_num_threads())
    with tempfile.TemporaryDirectory() as d:
        save_hf(f"{d}/m", config, params)
        model = transformers.AutoModelForCausalLM.from_pretrained(f"{d}/m", dtype=torch.float32).eval()
    order = sorted(range(len(requests)), key=lambda i: len(requests[i].prompt_token_ids))
    start = time.perf_counter()
    for lo in range(0, len(order), max_batch_size):
        batch = [requests[i] for i in order[lo:lo + max_batch_size]]
        width = max(len(r.prompt_token_ids) for r in batch)
        ids = torch.zeros((len(batch), width), dtype=torch.long)
        mask = torch.zeros_like(ids)
        for j, r in enumerate(batch):  # left padding, as decoder-only generation needs
            ids[j, width - len(r.prompt_token_ids):] = torch.tensor(r.prompt_token_ids)
            mask[j, width - len(r.prompt_token_ids):] = 1
        new = max(r.output_len for r in batch)
        with torch.no_grad():
            model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new, min_new_tokens=new,
                           do_sample=False, pad_token_id=0)
    return {"elapsed_s": time.perf_counter() - start, "hf_max_batch_size": max_batch_size,
            "transformers": transformers.__version__, "torch": torch.__version__}


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    speculative = None
    if args.speculative_config is not None:  # checked before the model loads
        from jaxserve.speculative.config import SpeculativeConfig
        if args.backend != "jaxserve":
            raise ValueError("--speculative-config is for the jaxserve backend")
        speculative = SpeculativeConfig.from_json(args.speculative_config)
    config, params, tokenizer = _load(args.model, args.seed)
    requests = make_workload(args.dataset, args.num_prompts, config.vocab_size, args.max_model_len, args.seed,
                             input_len=tuple(args.input_len), output_len=tuple(args.output_len))
    if args.backend == "jaxserve":
        result = run_jaxserve(config, params, requests, args.max_model_len, args.overrides, speculative, tokenizer)
    else:
        result = run_hf(config, params, requests, args.hf_max_batch_size)
    out_tokens = sum(r.output_len for r in requests)
    result.update({
        "backend": args.backend, "model": args.model, "dataset": args.dataset, "num_prompts": len(requests),
        "speculative_config": args.speculative_config,
        "input_tokens": sum(len(r.prompt_token_ids) for r in requests), "output_tokens": out_tokens,
        "requests_per_s": len(requests) / result["elapsed_s"], "output_tokens_per_s": out_tokens / result["elapsed_s"],
        "jax": jax.__version__, "machine": f"{platform.machine()} {jax.default_backend()}",
        "date": datetime.date.today().isoformat(), "argv": argv})
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    return 0
