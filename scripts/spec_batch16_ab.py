"""Whether any proposer is slower than the target alone at batch 16 once speculation switches off: SmolLM2 bf16, 16
repetitive chat prompts in one call, greedy, every speculative engine with ``disable_by_batch_size`` (rounds only
when fewer sequences run), against the plain engine; calls alternate in a rotating order, outputs checked identical.

    PYTHONPATH=. python scripts/spec_batch16_ab.py [--methods eagle,draft_model,ngram,suffix] [--calls 5]
        [--disable-by-batch 4] [--gamma 4]

Reports each engine's fastest and median call and the plain engine's time over each (> 1: the proposer is faster).
"""
import argparse
import statistics
import time

from experiments.spec_decoding.prompt_sets import chat_prompts
from jaxserve import LLM, SamplingParams, SpeculativeConfig

DRAFTS = {"eagle": "jaxserve/smollm2-135m-instruct-eagle", "draft_model": "jaxserve/smollm2-135m-instruct-draft"}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--methods", default="eagle,draft_model,ngram,suffix")
    ap.add_argument("--calls", type=int, default=5)
    ap.add_argument("--disable-by-batch", type=int, default=4)
    ap.add_argument("--gamma", type=int, default=4)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=160)
    args = ap.parse_args()
    engines = {"plain": LLM("smollm2-135m-instruct", dtype="bfloat16")}
    for method in args.methods.split(","):
        # suffix decoding without its global tree: each call repeats the prompts and would draft from the last
        spec = SpeculativeConfig(method=method, draft_model=DRAFTS.get(method), num_speculative_tokens=args.gamma,
                                 disable_by_batch_size=args.disable_by_batch, suffix_max_cached_requests=0)
        engines[method] = LLM("smollm2-135m-instruct", dtype="bfloat16", speculative=spec)
    prompts = chat_prompts(engines["plain"].tokenizer, "chat_repetitive", args.batch, 160, 0)
    params = SamplingParams(max_tokens=args.max_tokens, temperature=0.0)

    def run(llm):  # the batch in one call
        return [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
    for llm in engines.values():
        llm.warmup()
    outputs = {name: run(llm) for name, llm in engines.items()}
    for name, out in outputs.items():
        assert out == outputs["plain"], f"{name}: outputs differ from the plain engine's"
    times = {name: [] for name in engines}
    names = list(engines)
    for call in range(args.calls):
        for name in names[call % len(names):] + names[: call % len(names)]:
            start = time.perf_counter()
            run(engines[name])
            times[name].append(time.perf_counter() - start)
    tokens = sum(map(len, outputs["plain"]))
    for name, ts in times.items():
        ratio = "" if name == "plain" else (f"; plain / {name}: {min(times['plain']) / min(ts):.3f}x fastest, "
                                            f"{statistics.median(times['plain']) / statistics.median(ts):.3f}x median")
        stats = engines[name].stats()
        steps = {k: stats[k] for k in ("spec_plain_steps", "spec_speculative_steps", "spec_draft_catch_up_tokens")
                 if k in stats}
        print(f"{name}: fastest {min(ts):.3f} s ({tokens / min(ts):.0f} tok/s), median {statistics.median(ts):.3f} s, "
              f"calls {[round(t, 3) for t in ts]}{ratio} {steps}")


if __name__ == "__main__":
    main()
