"""Float32 SmolLM2-135M-Instruct at batch 1 with this process's CPU kernel setting (``JAXSERVE_CPU_KERNELS``).

    JAXSERVE_CPU_KERNELS={1,0} python benchmarks/cpu_kernels_f32_e2e.py [--calls 5] [--reps 15] [--inner 10] [--gamma 4]

Prints one JSON line:
- ``generate``: a plain ``LLM.generate`` of 1 prompt, 64 -> 64 greedy tokens (EOS ignored); the median of
  ``--calls`` calls, less the median 64 -> 1 call (prefill), over 63 decode steps: ``decode_tok_s``.
- ``parts``: a ``fori_loop`` of ``--inner`` iterations of the target's decode step (1 token) and of a speculative
  verify (``target_verify``: gamma + 1 tokens, all their logits), 100 cached tokens; ms per iteration, fastest and
  25th percentile of ``--reps`` calls alternating the two (``jaxserve.bench.timing.time_alternating``).
The kernel is chosen when a function is traced, so on/off comparisons are separate processes: alternate them.
"""
import argparse
import json
import os
import time

import jax
import jax.numpy as jnp
import numpy as np

from jaxserve import LLM, SamplingParams
from jaxserve.bench.timing import time_alternating

MODEL = "smollm2-135m-instruct"
PAGE, PAGES, CACHED = 16, 16, 100


def generate(model, calls: int) -> dict:
    llm = LLM.from_params(*model)
    prompt = [int(t) for t in np.random.default_rng(0).integers(100, 20000, 64)]
    full, prefill = (SamplingParams(max_tokens=n, temperature=0, ignore_eos=True) for n in (64, 1))
    times = {64: [], 1: []}
    for i in range(calls + 1):  # the first round compiles
        for n, params in ((64, full), (1, prefill)):
            t = time.perf_counter()
            outs = llm.generate([prompt], params, use_tqdm=False)
            if i:
                times[n].append(time.perf_counter() - t)
            if n == 64:
                tokens = outs[0].outputs[0].token_ids
    e2e, pre = float(np.median(times[64])), float(np.median(times[1]))
    return {"e2e_s": e2e, "prefill_s": pre, "decode_tok_s": 63 / (e2e - pre),
            "first_tokens": list(tokens[:8])}


def parts(model, reps: int, inner: int, gamma: int) -> dict:
    from jaxserve.models.attention_backends import new_kv_pool
    from jaxserve.models.transformer import forward
    from jaxserve.sampling import SamplingBatch
    from jaxserve.speculative.round import RoundInputs, multi_token_meta, target_verify

    config, params, _ = model
    zero = jnp.zeros(1, jnp.int32)
    sampling = SamplingBatch(temperature=jnp.zeros(1), top_k=zero, top_p=jnp.ones(1), seed=jnp.zeros(1, jnp.uint32),
                             index=zero, position=zero)
    inputs = RoundInputs(block_tables=jnp.arange(PAGES, dtype=jnp.int32)[None], positions=zero + CACHED,
                         prev_tokens=zero + 7, last_tokens=zero + 9, active=jnp.ones(1, bool), sampling=sampling)

    def decode(pool, tok):
        logits, pool = forward(params, config, tok, inputs.positions, pool,
                               multi_token_meta(inputs, inputs.positions[:, None], PAGE), attention_impl="auto")
        return pool, jnp.argmax(logits, -1).astype(jnp.int32)

    def verify(pool, tok):
        logits, pool = target_verify(params, config, pool, inputs, jnp.broadcast_to(tok[:, None], (1, gamma)), "auto")
        return pool, jnp.argmax(logits[:, -1], -1).astype(jnp.int32)

    fns = {}
    for name, body in (("decode_step", decode), (f"verify_{gamma + 1}_tokens", verify)):
        exe = jax.jit(lambda c, body=body: jax.lax.fori_loop(0, inner, lambda _, c: body(*c), c))
        carry = (new_kv_pool(config, PAGES, PAGE, "auto"), zero + 9)
        fns[name] = lambda exe=exe, carry=carry: exe(carry)
    return time_alternating(fns, reps, per=inner)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calls", type=int, default=5, help="timed generate calls of each length")
    ap.add_argument("--reps", type=int, default=15, help="timed calls of each part")
    ap.add_argument("--inner", type=int, default=10, help="iterations of a part per call")
    ap.add_argument("--gamma", type=int, default=4, help="draft tokens a verify checks (it runs gamma + 1)")
    a = ap.parse_args()
    from jaxserve.models.loading import resolve_model
    t = time.perf_counter()
    model = resolve_model(MODEL, "float32")
    out = {"kernels": os.environ.get("JAXSERVE_CPU_KERNELS", "1"), "load": os.getloadavg(),
           "load_model_s": time.perf_counter() - t, "generate": generate(model, a.calls),
           "parts": parts(model, a.reps, a.inner, a.gamma)}
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
