"""SmolLM2-135M-Instruct decode speed, jaxserve beside transformers on the same GGUF weights, one process.

Workloads: batch-1 decode (one request, ``--input-len`` random prompt tokens, ``--output-len`` greedy tokens,
``ignore_eos``) and a batch of ``--batch`` such requests; each in float32 and bfloat16. Rounds alternate the
backends so that drift on a shared machine hits both; the first jaxserve run of each shape is a warm-up
(compilation) and is not timed. Reports output tokens/s (median and range over rounds) as JSON and a table.

    python benchmarks/smollm2_speed.py --rounds 3 --out results/smollm2_speed/results.json
"""
from __future__ import annotations

import argparse
import datetime
import json
import pathlib
import platform
import statistics
import subprocess
import time

import jax
import numpy as np


def _args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--input-len", type=int, default=64)
    p.add_argument("--output-len", type=int, default=64)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--out", default=None)
    return p.parse_args(argv)


def _jaxserve_runner(config, params, tokenizer, dtype, batch):
    import jax.numpy as jnp
    from jaxserve import LLM, SamplingParams
    cast = jax.tree.map(lambda x: x.astype(jnp.dtype(dtype)), params)
    llm = LLM.from_params(config.replace(dtype=dtype), cast, tokenizer, max_num_seqs=batch,
                          max_num_batched_tokens=max(512, batch))

    def run(prompts, new):
        sp = SamplingParams(max_tokens=new, temperature=0, ignore_eos=True)
        start = time.perf_counter()
        outs = llm.generate(prompts, sp, use_tqdm=False)
        elapsed = time.perf_counter() - start
        assert all(len(o.outputs[0].token_ids) == new for o in outs)
        return elapsed
    return run


def _hf_runner(path, dtype):
    import torch
    import transformers
    model = transformers.AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name,
                                                              dtype=getattr(torch, dtype)).eval()

    def run(prompts, new):
        ids = torch.tensor(prompts)  # equal lengths: no padding
        start = time.perf_counter()
        with torch.no_grad():
            out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=new,
                                 min_new_tokens=new, do_sample=False, pad_token_id=2)
        elapsed = time.perf_counter() - start
        assert out.shape[1] == ids.shape[1] + new
        return elapsed
    return run


def main(argv=None) -> int:
    import torch
    import transformers
    from jaxserve.models.loading import load_gguf_model
    from jaxserve.zoo import packaged_path
    args = _args(argv)
    path = packaged_path("smollm2-135m-instruct")
    config, params, tokenizer = load_gguf_model(path)
    rng = np.random.default_rng(0)
    workloads = {"batch1": rng.integers(100, config.vocab_size, (1, args.input_len)).tolist(),
                 f"batch{args.batch}": rng.integers(100, config.vocab_size, (args.batch, args.input_len)).tolist()}
    times: dict[str, list[float]] = {}
    for dtype in args.dtypes:
        runners = {"jaxserve": {w: _jaxserve_runner(config, params, tokenizer, dtype, len(p))
                                for w, p in workloads.items()}, "hf": _hf_runner(path, dtype)}
        for w, prompts in workloads.items():
            runners["jaxserve"][w](prompts, args.output_len)  # warm-up: compiles this shape's programs
        for r in range(args.rounds):
            order = ["jaxserve", "hf"] if r % 2 == 0 else ["hf", "jaxserve"]
            for w, prompts in workloads.items():
                for backend in order:
                    run = runners[backend][w] if backend == "jaxserve" else runners[backend]
                    times.setdefault(f"{backend}/{dtype}/{w}", []).append(run(prompts, args.output_len))
    rows = {}
    for key, ts in times.items():
        n = len(workloads[key.split("/")[2]]) * args.output_len
        rates = [n / t for t in ts]
        rows[key] = {"tok_s_median": statistics.median(rates), "tok_s_min": min(rates), "tok_s_max": max(rates),
                     "seconds": ts}
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    result = {"model": "smollm2-135m-instruct (Q4_1 GGUF, dequantized)", "input_len": args.input_len,
              "output_len": args.output_len, "rounds": args.rounds, "rows": rows, "date": datetime.date.today().isoformat(),
              "commit": commit, "machine": f"{platform.machine()} {platform.processor()} ({jax.default_backend()})",
              "jax": jax.__version__, "torch": torch.__version__, "transformers": transformers.__version__,
              "torch_threads": torch.get_num_threads()}
    print("| backend / dtype / workload | output tok/s (median) | range |\n|---|---|---|")
    for key, row in rows.items():
        print(f"| {key} | {row['tok_s_median']:.1f} | {row['tok_s_min']:.1f}-{row['tok_s_max']:.1f} |")
    if args.out:
        pathlib.Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        pathlib.Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
