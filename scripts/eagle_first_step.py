"""What folding the next round's first draft step into the fix-up pass saves: SmolLM2 bf16 at batch 1, greedy, with
the bundled EAGLE draft, against the same engine forced to run every round's first draft step (as rounds did before
47a0926) and a plain engine, calls alternating, outputs checked identical.

    PYTHONPATH=. python scripts/eagle_first_step.py [--gamma 3] [--calls 5]
"""
import argparse
import statistics
import time

from experiments.spec_decoding.prompt_sets import chat_prompts
from jaxserve import LLM, SamplingParams, SpeculativeConfig
from jaxserve.engine.runner import ModelRunner


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gamma", type=int, default=3)
    ap.add_argument("--calls", type=int, default=5)
    args = ap.parse_args()
    spec = SpeculativeConfig(method="eagle", draft_model="jaxserve/smollm2-135m-instruct-eagle",
                             num_speculative_tokens=args.gamma)
    engines = {name: LLM("smollm2-135m-instruct", dtype="bfloat16", speculative=spec) for name in ("skip", "always")}
    runner = engines["always"].engine.runner  # every round runs the first step (drafted rows' writes masked)
    runner._run_round = lambda inputs, extra, logprobs, first_step=True: ModelRunner._run_round(
        runner, inputs, extra, logprobs, True)
    engines["plain"] = LLM("smollm2-135m-instruct", dtype="bfloat16")
    prompts = chat_prompts(engines["plain"].tokenizer, "chat_repetitive", 4, 160, 0)
    params = SamplingParams(max_tokens=160, temperature=0.0)

    def run(llm):  # one request at a time: batch 1
        return [llm.generate([p], params, use_tqdm=False)[0].outputs[0].token_ids for p in prompts]
    outputs = {name: run(llm) for name, llm in engines.items()}  # (also compiles)
    assert outputs["skip"] == outputs["always"] == outputs["plain"], "outputs differ"
    times = {name: [] for name in engines}
    for call in range(args.calls):
        order = list(engines.items())
        for name, llm in order if call % 2 == 0 else order[::-1]:
            start = time.perf_counter()
            run(llm)
            times[name].append(time.perf_counter() - start)
    tokens = sum(map(len, outputs["plain"]))
    for name, ts in times.items():
        print(f"{name}: fastest {min(ts):.3f} s ({tokens / min(ts):.1f} tok/s), median {statistics.median(ts):.3f} s,"
              f" calls {[round(t, 3) for t in ts]}")
    print(f"skip / always: {min(times['always']) / min(times['skip']):.3f}x fastest, "
          f"{statistics.median(times['always']) / statistics.median(times['skip']):.3f}x median; over plain: "
          + ", ".join(f"{n} {min(times['plain']) / min(times[n]):.3f}x" for n in ("skip", "always")))


if __name__ == "__main__":
    main()
