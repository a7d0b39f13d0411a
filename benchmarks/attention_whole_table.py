"""Multi-query paged attention on the XLA path: the page loop vs one whole-table step, alone and in the model.

    python benchmarks/attention_whole_table.py [--reps 30] [--out results/attention_whole_table/results.json]

The committed figures are in ``results/attention_whole_table/results.json`` (``meta``: command, date,
machine, git commit), rendered into ``benchmarks/RESULTS.md`` by ``scripts/results_tables.py``.

``uniform_paged_attention_online`` (γ+1 verify queries per sequence, the draft's two-token catch-up
step) attends narrow block tables (<= ``WHOLE_TABLE_TOKENS``) in one step instead of a
``fori_loop`` over page chunks. This times both forms side by side, each compiled once and called
alternately so drift in the machine's speed hits both alike:

- ``op``: six chained calls (one per layer of the zoo target: 8 query heads, 4 KV heads, head dim
  32, 16-token pages) for batch x table width x live tokens x queries per sequence;
- ``model``: the zoo target's 5-token verify pass and a whole γ 4 speculative round with the zoo
  draft, batch 1, 100 cached tokens, the 9-page table of the speculative benchmark's sequences.

Figures are per call, in ms: the fastest and the 25th percentile of ``--reps`` timed calls of a
``fori_loop`` of ``--inner`` iterations.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shlex
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np

from pallas_kernels.paged_attention import online
from jaxserve.bench.timing import time_alternating

HEADS, KV_HEADS, DIM, PAGE = 8, 4, 32, 16
LOOP_STEP = online.TOKENS_PER_STEP // PAGE  # an explicit pages_per_step forces the loop, at its default step


def _compiled(fn, *args, whole_table_tokens: int):
    """fn jitted and compiled with ``online.WHOLE_TABLE_TOKENS`` set as given (it is read while tracing)."""
    saved = online.WHOLE_TABLE_TOKENS
    online.WHOLE_TABLE_TOKENS = whole_table_tokens
    try:
        return jax.jit(fn).lower(*args).compile()
    finally:
        online.WHOLE_TABLE_TOKENS = saved


def op_grid(reps: int, inner: int) -> list[dict]:
    rows = []
    for batch in (1, 4, 16):
        for pages in (9, 16):
            for live in (40, 100):
                for q_len in (2, 5):
                    rng = np.random.default_rng(0)
                    num_pages = batch * pages
                    q = jnp.asarray(rng.normal(size=(batch * q_len, HEADS, DIM)), jnp.float32)
                    k = online.tokens_minor(jnp.asarray(rng.normal(size=(num_pages, PAGE, KV_HEADS, DIM)), jnp.float32))
                    v = jnp.asarray(rng.normal(size=(num_pages, PAGE, KV_HEADS, DIM)), jnp.float32)
                    tables = jnp.arange(num_pages, dtype=jnp.int32).reshape(batch, pages)
                    lens = jnp.full(batch, live, jnp.int32)

                    def chained(step, whole_table_tokens):
                        def layers(_, x):
                            for _ in range(6):
                                x = 0.9 * online.uniform_paged_attention_online(x, k, v, tables, lens, q_len,
                                                                               pages_per_step=step)
                            return x
                        exe = _compiled(lambda x: jax.lax.fori_loop(0, inner, layers, x), q,
                                        whole_table_tokens=whole_table_tokens)
                        return lambda: exe(q)

                    width = pages * PAGE  # the whole-table form is timed past the threshold too, to show why it stops there
                    fns = {"loop": chained(LOOP_STEP, 0), "whole_table": chained(None, width)}
                    res = time_alternating(fns, reps, per=inner)
                    row = dict(batch=batch, table_tokens=width, live=live, q_len=q_len, **res)
                    rows.append(row)
                    print(json.dumps(row), flush=True)
    return rows


def model_ab(reps: int, inner: int) -> dict:
    """Verify pass and speculative round of the zoo pair, compiled with the loop and with the whole-table step."""
    from jaxserve.models.loading import resolve_model
    from jaxserve.sampling import SamplingBatch
    from jaxserve.models.attention_backends import new_kv_pool
    from jaxserve.speculative.round import RoundInputs, spec_round, target_verify

    tcfg, tp, _ = resolve_model("jaxserve/tiny-code")
    dcfg, dp, _ = resolve_model("jaxserve/tiny-code-draft")
    tp, dp = jax.device_put(tp), jax.device_put(dp)
    gamma, pages, batch = 4, 9, 1
    tables = jnp.arange(batch * pages, dtype=jnp.int32).reshape(batch, pages)
    tpool, dpool = new_kv_pool(tcfg, batch * pages, PAGE, "xla"), new_kv_pool(dcfg, batch * pages, PAGE, "xla")
    zeros = jnp.zeros(batch, jnp.int32)
    sampling = SamplingBatch(temperature=jnp.zeros(batch), top_k=zeros, top_p=jnp.ones(batch),
                             seed=jnp.zeros(batch, jnp.uint32), index=zeros, position=zeros)
    inputs = RoundInputs(block_tables=tables, positions=jnp.full(batch, 100, jnp.int32), prev_tokens=zeros + 7,
                         last_tokens=zeros + 9, active=jnp.ones(batch, bool), sampling=sampling)
    drafts = jnp.full((batch, gamma), 11, jnp.int32)

    def verify(c):
        logits, pool = target_verify(tp, tcfg, c[0], inputs, c[1], "xla")
        return pool, jnp.argmax(logits[:, 1:], -1).astype(jnp.int32)

    def round_(c):  # the emitted tokens are carried so that nothing of the round is dead code
        out = spec_round(tp, dp, c[0], c[1], inputs.replace(last_tokens=c[2][:, 0]), target_config=tcfg,
                         draft_config=dcfg, gamma=gamma, attention_impl="xla")
        return out.target_pool, out.draft_pool, jnp.maximum(out.tokens, 0)

    fns = {}
    for form, width in (("loop", 0), ("whole_table", online.WHOLE_TABLE_TOKENS)):
        for name, body, carry in (("verify_5_tokens", verify, (tpool, drafts)),
                                  ("spec_round_gamma4", round_, (tpool, dpool, jnp.zeros((batch, gamma + 1), jnp.int32)))):
            exe = _compiled(lambda c, body=body: jax.lax.fori_loop(0, inner, lambda _, c: body(c), c), carry,
                            whole_table_tokens=width)
            fns[f"{name}/{form}"] = lambda exe=exe, carry=carry: exe(carry)
    res = time_alternating(fns, reps, per=inner)
    for k, v in res.items():
        print(k, json.dumps(v), flush=True)
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--inner", type=int, default=40)
    ap.add_argument("--skip-op", action="store_true")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    meta = dict(benchmark="attention_whole_table", command=shlex.join(["python", *sys.argv]),
                date=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
                machine=f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs",
                jax_version=jax.__version__, backend=jax.default_backend(), git_commit=commit)
    result = dict(meta=meta, whole_table_tokens=online.WHOLE_TABLE_TOKENS)
    if not args.skip_op:
        result["op"] = op_grid(args.reps, args.inner)
    result["model"] = model_ab(args.reps, args.inner)
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
