"""What multi-step decoding would save (vLLM's ``num_scheduler_steps``): K decode steps of the plain engine's program
as K jitted calls, each fetched before the next is dispatched (what the engine does), against one jitted call that
runs the same step K times, unrolled, each step's sampled tokens fed to the next on the device.

    python benchmarks/multi_step_decode.py [--model smollm2-135m-instruct] [--dtype bfloat16] [--batches 1,64]
                                           [--steps 4] [--context 128] [--repeats 20]

The rows are B decodes at position ``--context`` (each reading its own ``--context`` cached positions of the pool,
which holds whatever it holds: the timing does not depend on the values) and writing nowhere, greedy, through the
runner's own step program (``step_programs.plain_step``, the runner's params, pool and buckets). Reported: ms per
token step each way (median and fastest of ``--repeats``) and the difference, the dispatch and fetch a fused step
saves. The engine's own host work between steps (scheduling, appending tokens: ~0.3-0.7 ms a step at batch 64)
comes on top of the separate calls' figure and would be saved too.
"""
import argparse
import functools
import statistics
import time

import jax

from jaxserve import LLM
from jaxserve.engine import step_programs as programs
from jaxserve.engine.batching import SampleRow, pack
from jaxserve.engine.runner import fetch
from jaxserve.engine.scheduler import ScheduledSequence


def decode_entries(batch: int, context: int, block_size: int) -> list[ScheduledSequence]:
    """``batch`` one-token decodes at position context - 1, each on its own blocks, writing nowhere (slot -1)."""
    pages = -(-context // block_size)
    return [ScheduledSequence(seq_id=b, request_id=str(b), index=0, token_ids=[0], start_pos=context - 1,
                              block_table=list(range(b * pages, (b + 1) * pages)), slot_mapping=[-1], sample=True,
                              num_samples=1, sampling_params=None) for b in range(batch)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--batches", default="1,64")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--context", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=20)
    a = ap.parse_args()
    llm = LLM(a.model, dtype=a.dtype)
    runner = llm.engine.runner
    for batch in map(int, a.batches.split(",")):
        entries = decode_entries(batch, a.context, runner.block_size)
        step = pack(entries, *runner.buckets.step(entries, batch))
        rows = [SampleRow(i, 0, 0.0, 0, 1.0, 0, a.context) for i in range(batch)]
        args, kwargs = runner._plain_args(step, rows, False, False)

        @functools.partial(jax.jit, static_argnames=tuple(kwargs), donate_argnums=(1,))
        def fused(params, pool, tokens, *rest, **static):  # (the step's own jit is inlined here)
            for _ in range(a.steps):  # unrolled: each step's greedy tokens are the next step's inputs
                results, pool = programs.plain_step(params, pool, tokens, *rest, **static)
                tokens = tokens.at[: results[0].shape[0]].set(results[0][: tokens.shape[0]])
            return results, pool

        def separate():
            for _ in range(a.steps):
                results, runner.pool = programs.plain_step(*args[:1], runner.pool, *args[2:], **kwargs)
                fetch(results)

        def together():
            results, runner.pool = fused(*args[:1], runner.pool, *args[2:], **kwargs)
            fetch(results)
        times = {"separate": [], "fused": []}
        for fn in (separate, together):  # compile and warm
            fn()
        for _ in range(a.repeats):
            for name, fn in (("separate", separate), ("fused", together)):
                start = time.perf_counter()
                fn()
                times[name].append((time.perf_counter() - start) / a.steps * 1e3)
        med = {k: statistics.median(v) for k, v in times.items()}
        print(f"batch {batch}, {a.steps} steps: separate calls {med['separate']:.2f} ms a step "
              f"(fastest {min(times['separate']):.2f}), one fused call {med['fused']:.2f} "
              f"(fastest {min(times['fused']):.2f}): {med['separate'] - med['fused']:.2f} ms a step saved, "
              f"{med['separate'] / med['fused']:.3f}x")


if __name__ == "__main__":
    main()
