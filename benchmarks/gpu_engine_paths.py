"""The engine's GPU paths side by side: attention_impl (pallas | mosaic | reference) and, with
nvfp4 weights, quant_impl (pallas | mosaic | reference), on one random bf16 model and one greedy workload.
(On a Hopper GPU quant_impl="pallas" runs the Mosaic FP4 kernel for this bf16 model, as "mosaic" does:
jaxserve.quant.kernel_for; benchmarks/fp4_matmul.py times it beside the Triton kernel.)

    python benchmarks/gpu_engine_paths.py --out engine_paths.json [--smoke]

Per path: decode tok/s (second run, compiled), greedy tokens equal to the reference path's, and the
max |log-prob difference|. On CPU (or with --smoke) a tiny model in interpret mode: checks that the
script runs, NOT a speed measurement.
"""
import argparse
import datetime
import json
import time

import jax
import numpy as np

from jaxserve import LLM, SamplingParams
from jaxserve.models import get_preset, init_params

# (label, LLM keyword arguments); the first of each group is what the others are compared with
PATHS = [
    ("attn=reference", dict(attention_impl="reference")),
    ("attn=pallas", dict(attention_impl="pallas")),
    ("attn=mosaic", dict(attention_impl="mosaic")),
    ("nvfp4 quant=reference", dict(quantization="nvfp4", quant_impl="reference")),
    ("nvfp4 quant=pallas", dict(quantization="nvfp4", quant_impl="pallas")),
    ("nvfp4 quant=mosaic", dict(quantization="nvfp4", quant_impl="mosaic")),
    ("mxfp4 quant=reference", dict(quantization="mxfp4", quant_impl="reference")),
    ("mxfp4 quant=pallas", dict(quantization="mxfp4", quant_impl="pallas")),
]


def _workload(smoke):
    # head_dim 64, bf16 and 16-token pages: what the Mosaic GPU decode kernel takes
    if smoke:
        config = get_preset("tiny-llama").replace(head_dim=64, dtype="bfloat16")
        return config, dict(block_size=16, max_num_seqs=2, max_num_batched_tokens=32, num_kv_blocks=16), 2, 8, 3
    config = get_preset("small-llama").replace(head_dim=64, dtype="bfloat16")
    return config, dict(block_size=16, max_num_seqs=32, max_num_batched_tokens=2048), 32, 64, 64


def _run(config, params, engine, prompts, max_tokens, kwargs):
    llm = LLM.from_params(config, params, **engine, **kwargs)
    sp = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True, logprobs=True)
    llm.generate(prompts, sp, use_tqdm=False)  # compile
    t0 = time.perf_counter()
    outs = llm.generate(prompts, sp, use_tqdm=False)
    secs = time.perf_counter() - t0
    tokens = [o.outputs[0].token_ids for o in outs]
    return tokens, np.concatenate([o.outputs[0].logprobs for o in outs]), secs


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out")
    parser.add_argument("--smoke", action="store_true", help="tiny model (default on CPU)")
    parser.add_argument("--only", help="comma-separated labels to run (default: all)")
    args = parser.parse_args()
    smoke = args.smoke or jax.default_backend() == "cpu"
    config, engine, batch, prompt_len, max_tokens = _workload(smoke)
    params = init_params(config, jax.random.key(0))
    rng = np.random.default_rng(0)
    prompts = [rng.integers(0, config.vocab_size, prompt_len).tolist() for _ in range(batch)]
    meta = {"date": datetime.date.today().isoformat(), "jax": jax.__version__,
            "device": str(jax.devices()[0].device_kind), "smoke": smoke, "batch": batch,
            "prompt_len": prompt_len, "max_tokens": max_tokens}
    rows, base = [], None
    for label, kwargs in PATHS:
        if args.only and label not in args.only.split(","):
            continue
        if label.endswith("reference"):
            base = None
        row = {"path": label, **kwargs}
        try:
            tokens, logprobs, secs = _run(config, params, engine, prompts, max_tokens, kwargs)
            row.update(seconds=secs, tok_per_s=batch * max_tokens / secs)
            if base is None:
                base = (tokens, logprobs)
            else:
                row.update(tokens_equal=tokens == base[0],
                           max_abs_logprob_diff=float(np.abs(logprobs - base[1]).max()))
        except Exception as e:  # noqa: BLE001 -- report and go on to the next path
            row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"
        rows.append(row)
        print(json.dumps(row), flush=True)
        if args.out:  # after every row: a timeout keeps what was measured
            with open(args.out, "w") as f:
                json.dump({"meta": meta, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
