"""Where a speculative round's time goes, against a target decode step (zoo pair, batch 1, greedy).

    python benchmarks/spec_round_costs.py [--gamma 5] [--reps 30] [--calls 10] [--out costs.json]
                                          [--dtype bfloat16] [--matmul-dtype bfloat16]
                                          [--draft-matmul-dtype float32] [--touch-mib 0.5,2,8]
                                          [--random-target 512,1408,8 | --widen-mlp 4928]

The speculative speedup is (prefill + N decode steps) / (prefill + R rounds), so what matters is
the round's cost in decode steps and the prefill's share. Two views, each timed alternately so
drift in the machine's speed hits all parts alike:

- ``parts``: a ``fori_loop`` of ``--inner`` iterations of one piece each (target decode step,
  γ+1-token verify, γ-token draft proposal, proposal feeding verify, whole ``spec_round``), batch 1,
  100 cached tokens, the 9-page table of the speculative benchmark's sequences; ms per iteration.
- ``--touch-mib``: also the verify followed by a read of N MiB of other memory (a loop-carried buffer,
  so XLA can neither hoist nor skip it), and that read alone: what the two cost together beyond their
  own costs, as each reads its data after the other has pushed some of it out of the caches (the
  draft's ~1.3 MiB a proposal, read back after every target pass, is most of a round's excess).
- ``--random-target H,I,L``: the parts for a target of the zoo target's family with hidden H,
  intermediate I and L layers, random weights (head_dim 32 as the zoo's; its acceptance would mean
  nothing, so no ``program`` view): what a round costs in decode steps when the target's weights do not
  fit in the CPU's caches, as a real model's would not.
- ``--widen-mlp I``: both views for the zoo target with its MLPs widened to I by zero weights: the same
  function (the draft agrees with it as with the zoo target; the script reports whether its greedy
  tokens equal the zoo target's), more bytes and FLOPs a step, as a target past the caches.
- ``program``: whole ``speculative_generate`` / ``target_only_generate`` calls on the speculative
  benchmark's first batch-1 prompts (64 tokens each), at ``max_tokens`` 1 (prefill and setup), 33 and
  64; per round = (call - prefill-only call) / rounds, per step likewise; the marginal round / step
  from 33 to 64 tokens (one compiled program: both lie in the same output bucket), free of what a call
  pays once; ms, summed over prompts of each prompt's fastest call.

Figures: fastest and 25th percentile of ``--reps`` (parts) / ``--calls`` (program) timed calls.
"""
from __future__ import annotations

import argparse
import datetime
import json
import pathlib
import platform

import jax
import jax.numpy as jnp
import numpy as np

from jaxserve.bench.timing import time_alternating

PAGE, PAGES, CACHED = 16, 9, 100
PROMPT_LEN = 64
IMPL = "auto"  # Pallas kernels on a GPU, the XLA path elsewhere (as the generate programs choose)


def _touch(tok, buf):
    """Reads all of ``buf`` in a way that depends on the loop: the traffic of some other piece of work."""
    buf = buf.at[0].add(tok[0].astype(buf.dtype))
    return tok + (jnp.sum(buf) > 3e38).astype(jnp.int32), buf


def parts(target, draft, gamma: int, reps: int, inner: int, touch_mib: tuple[float, ...] = (), head=None) -> dict:
    from jaxserve.models.transformer import forward
    from jaxserve.sampling import SamplingBatch
    from jaxserve.models.attention_backends import new_kv_pool
    from jaxserve.speculative.round import RoundInputs, multi_token_meta, draft_propose, spec_round, target_verify

    (tcfg, tp), (dcfg, dp) = target, draft
    tables = jnp.arange(PAGES, dtype=jnp.int32)[None]
    zero = jnp.zeros(1, jnp.int32)
    sampling = SamplingBatch(temperature=jnp.zeros(1), top_k=zero, top_p=jnp.ones(1), seed=jnp.zeros(1, jnp.uint32),
                             index=zero, position=zero)
    inputs = RoundInputs(block_tables=tables, positions=zero + CACHED, prev_tokens=zero + 7, last_tokens=zero + 9,
                         active=jnp.ones(1, bool), sampling=sampling)
    uniforms = jnp.zeros((1, gamma, tcfg.vocab_size))

    # each body carries (target pool, draft pool, a token) so that nothing it computes is dead code
    def decode(tpool, dpool, tok):
        logits, tpool = forward(tp, tcfg, tok, inputs.positions, tpool,
                                multi_token_meta(inputs, inputs.positions[:, None], PAGE), attention_impl=IMPL)
        return tpool, dpool, jnp.argmax(logits, -1).astype(jnp.int32)

    def verify(tpool, dpool, tok):
        logits, tpool = target_verify(tp, tcfg, tpool, inputs, jnp.broadcast_to(tok[:, None], (1, gamma)), IMPL)
        return tpool, dpool, jnp.argmax(logits[:, -1], -1).astype(jnp.int32)

    def propose(tpool, dpool, tok):
        x, _, dpool = draft_propose(dp, dcfg, dpool, inputs.replace(last_tokens=tok), uniforms, IMPL, head)
        return tpool, dpool, x[:, -1]

    def propose_verify(tpool, dpool, tok):  # the round without acceptance: what is left of it is accept + bookkeeping
        x, _, dpool = draft_propose(dp, dcfg, dpool, inputs.replace(last_tokens=tok), uniforms, IMPL, head)
        logits, tpool = target_verify(tp, tcfg, tpool, inputs.replace(last_tokens=tok), x, IMPL)
        return tpool, dpool, jnp.argmax(logits[:, -1], -1).astype(jnp.int32)

    def round_(tpool, dpool, tok):
        out = spec_round(tp, dp, tpool, dpool, inputs.replace(last_tokens=tok), target_config=tcfg, draft_config=dcfg,
                         gamma=gamma, attention_impl=IMPL, draft_head=head)
        return out.target_pool, out.draft_pool, out.next.last_tokens

    pools = (new_kv_pool(tcfg, PAGES, PAGE, IMPL), new_kv_pool(dcfg, PAGES, PAGE, IMPL), zero + 9)
    bodies = {name: (body, 0) for name, body in (
        ("decode_step", decode), (f"verify_{gamma + 1}_tokens", verify), (f"draft_propose_gamma{gamma}", propose),
        ("propose_then_verify", propose_verify), (f"spec_round_gamma{gamma}", round_))}
    for mib in touch_mib:
        bodies[f"touch_{mib:g}_mib"] = (lambda tp_, dp_, tok: (tp_, dp_, tok)), mib
        bodies[f"verify_then_touch_{mib:g}_mib"] = verify, mib
    fns = {}
    for name, (body, mib) in bodies.items():
        def step(tpool, dpool, tok, buf, body=body, mib=mib):
            tpool, dpool, tok = body(tpool, dpool, tok)
            return (tpool, dpool, *_touch(tok, buf)) if mib else (tpool, dpool, tok, buf)
        exe = jax.jit(lambda c, step=step: jax.lax.fori_loop(0, inner, lambda _, c: step(*c), c))
        carry = (*pools, jnp.zeros(max(1, int(mib * 2**18)), jnp.float32))
        fns[name] = lambda exe=exe, carry=carry: exe(carry)
    return time_alternating(fns, reps, per=inner)


def program(target, draft, tokenizer, gamma: int, calls: int, num_prompts: int, reference=None, head=None) -> dict:
    from jaxserve.speculative.generate import speculative_generate, target_only_generate
    from jaxserve.train.data import prompt_windows

    (tcfg, tp), (dcfg, dp) = target, draft
    # The spec_decoding experiment's batch-1 prompts: 64-token val windows, seed = its seed 0 + batch 1.
    prompts = prompt_windows(tokenizer, tcfg.vocab_size, num_prompts, PROMPT_LEN, seed=1)[:, None]  # [N, 1, L]
    lens = np.full(1, prompts.shape[-1])
    kw = dict(temperature=0.0, seeds=np.zeros(1, int), eos_token_id=None)
    rounds = {}

    def spec(p, i, max_tokens):
        out = speculative_generate(tp, tcfg, dp, dcfg, p, lens, gamma=gamma, max_tokens=max_tokens, draft_head=head,
                                   **kw)
        rounds[i, max_tokens] = out[2].rounds
        return out[0]

    def base(p, max_tokens):
        return target_only_generate(tp, tcfg, p, lens, max_tokens=max_tokens, **kw)[0]

    from jaxserve.buckets import bucket, powers_of_two

    lengths = (1, 33, 64)
    assert bucket(33, powers_of_two(8, 33)) == bucket(64, powers_of_two(8, 64)), "33 and 64: one compiled program"
    fns = {}
    for i, p in enumerate(prompts):
        for max_tokens in lengths:
            fns[("spec", max_tokens, i)] = lambda p=p, i=i, m=max_tokens: spec(p, i, m)
            fns[("base", max_tokens, i)] = lambda p=p, m=max_tokens: base(p, m)
    res = time_alternating(fns, calls)
    total = {(side, m): sum(res[side, m, i]["min_ms"] for i in range(len(prompts))) for side in ("spec", "base")
             for m in lengths}
    num_rounds = {m: sum(int(np.asarray(rounds[i, m]).sum()) for i in range(len(prompts))) for m in (33, 64)}
    n = len(prompts)
    outputs = {side: [np.asarray(f(p, 64) if side == "base" else spec(p, i, 64)) for i, p in enumerate(prompts)]
               for side, f in (("base", base), ("spec", None))}
    checks = {"spec_tokens_equal_base": sum(np.array_equal(a, b) for a, b in zip(*outputs.values()))}
    if reference is not None:  # the widened target must generate what the zoo target does
        rcfg, rp = reference
        ref = [np.asarray(target_only_generate(rp, rcfg, p, lens, max_tokens=64, **kw)[0]) for p in prompts]
        checks["base_tokens_equal_reference"] = sum(np.array_equal(a, b) for a, b in zip(outputs["base"], ref))
    return {"prompts": n, **checks, "rounds": num_rounds[64], "rounds_at_33": num_rounds[33],
            **{f"{side}_max_tokens_{m}_ms": t for (side, m), t in total.items()},
            "per_round_ms": (total["spec", 64] - total["spec", 1]) / num_rounds[64],
            "per_decode_step_ms": (total["base", 64] - total["base", 1]) / (63 * n),
            "marginal_round_ms": (total["spec", 64] - total["spec", 33]) / (num_rounds[64] - num_rounds[33]),
            "marginal_decode_step_ms": (total["base", 64] - total["base", 33]) / (31 * n),
            "speedup": total["base", 64] / total["spec", 64]}


def random_target(zoo_config, hidden: int, intermediate: int, layers: int):
    """(config, params): the zoo target's family at another size, random weights, its matmul dtype kept."""
    from jaxserve.models.loading import with_matmul_dtype
    from jaxserve.models.transformer import init_params

    heads = hidden // zoo_config.head_dim
    config = zoo_config.replace(hidden_size=hidden, intermediate_size=intermediate, num_layers=layers,
                                num_heads=heads, num_kv_heads=max(1, heads // 2), matmul_dtype=None)
    params = init_params(config, jax.random.key(0))
    return with_matmul_dtype(config, params, zoo_config.matmul_dtype)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gamma", type=int, default=5)
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--inner", type=int, default=40)
    ap.add_argument("--calls", type=int, default=10)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--dtype", default=None, help="both models' dtype (default: the zoo's, float32)")
    ap.add_argument("--matmul-dtype", default=None, help="both models' Dense dot operands (ModelConfig.matmul_dtype)")
    ap.add_argument("--draft-matmul-dtype", default=None,
                    help="the draft's Dense dot operands, when not --matmul-dtype's (the draft's precision never "
                         "changes the output, only its acceptance)")
    ap.add_argument("--touch-mib", default="", help="comma-separated sizes N: also time the verify followed by a "
                                                     "read of N MiB of other memory, and that read alone")
    ap.add_argument("--random-target", default=None, metavar="H,I,L",
                    help="parts only, for a random-weight target with hidden H, intermediate I, L layers")
    ap.add_argument("--widen-mlp", type=int, default=None, metavar="I",
                    help="the zoo target with its MLPs widened to I by zero weights (same function, more bytes)")
    ap.add_argument("--draft-vocab", type=int, default=None, metavar="N",
                    help="the draft proposes only its N most frequent tokens (SpeculativeConfig.draft_vocab_size)")
    ap.add_argument("--skip-program", action="store_true")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    from jaxserve.models.loading import model_path, resolve_model, widen_mlp
    from jaxserve.speculative.draft_vocab import restrict_head
    from jaxserve.speculative.token_counts import load_counts, most_frequent

    tcfg, tparams, tokenizer = resolve_model("jaxserve/tiny-code", args.dtype, args.matmul_dtype)
    draft_mm = args.draft_matmul_dtype or args.matmul_dtype
    target, draft = (tcfg, tparams), tuple(resolve_model("jaxserve/tiny-code-draft", args.dtype, draft_mm)[:2])
    if args.random_target:
        target = random_target(tcfg, *map(int, args.random_target.split(",")))
    elif args.widen_mlp:
        target = widen_mlp(tcfg, tparams, args.widen_mlp)
    result = dict(date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="minutes"),
                  machine=platform.processor() or platform.machine(), jax=jax.__version__, gamma=args.gamma,
                  dtype=tcfg.dtype, matmul_dtype=tcfg.matmul_dtype, draft_matmul_dtype=draft[0].matmul_dtype,
                  target_params_mib=sum(x.nbytes for x in jax.tree.leaves(target[1])) / 2**20,
                  random_target=args.random_target, widen_mlp=args.widen_mlp, draft_vocab=args.draft_vocab)
    head = None
    if args.draft_vocab:
        counts = load_counts(model_path("jaxserve/tiny-code-draft"), draft[0].vocab_size)
        head = restrict_head(*draft, most_frequent(counts, args.draft_vocab))
    touch = tuple(float(x) for x in args.touch_mib.split(",") if x)
    result["parts"] = parts(target, draft, args.gamma, args.reps, args.inner, touch, head)
    for k, v in result["parts"].items():
        print(f"{k:26s} min {v['min_ms']:.3f} ms  p25 {v['p25_ms']:.3f} ms", flush=True)
    res, verify = result["parts"], result["parts"][f"verify_{args.gamma + 1}_tokens"]["min_ms"]
    excess = {"propose_then_verify": res[f"draft_propose_gamma{args.gamma}"]["min_ms"]}
    excess.update({f"verify_then_touch_{m:g}_mib": res[f"touch_{m:g}_mib"]["min_ms"] for m in touch})
    for k, other in excess.items():
        print(f"{k:26s} exceeds verify + its other part by {res[k]['min_ms'] - verify - other:+.3f} ms", flush=True)
    step = res["decode_step"]["min_ms"]
    print(f"target params {result['target_params_mib']:.1f} MiB; in decode steps: verify {verify / step:.2f}, "
          f"round {res[f'spec_round_gamma{args.gamma}']['min_ms'] / step:.2f}", flush=True)
    if not (args.skip_program or args.random_target):
        result["program"] = program(target, draft, tokenizer, args.gamma, args.calls, args.prompts,
                                    reference=(tcfg, tparams) if args.widen_mlp else None, head=head)
        print(json.dumps(result["program"], indent=1), flush=True)
    if args.out:
        pathlib.Path(args.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
