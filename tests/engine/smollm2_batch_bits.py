"""Run by test_smollm2.py in a subprocess with the users' XLA flags, on bf16 SmolLM2 chats.

``alone``: two chats decoded together, then each alone. ``suffix``: four chats by the plain engine and by
greedy suffix speculation (verify passes of up to 9 rows per chat). ``multi_step``: the four chats, greedy and
sampled, by the plain engine and by one running 4 decode steps a program (``num_scheduler_steps``). Prints where the tokens or log-probs
first differ, or "same bits"."""
import sys

from jaxserve import LLM, SamplingParams, SpeculativeConfig

CHATS = [[{"role": "user", "content": "Rewrite this code with snake_case names: def getValue(x): return "
                                      "x.itemValue + x.otherValue"}],
         [{"role": "user", "content": "Write a haiku about the sea."}],
         [{"role": "user", "content": "Summarize, quoting the key sentence: The cat sat on the mat. The mat was "
                                      "red. The cat liked the red mat."}],
         [{"role": "user", "content": "What is 17 times 23?"}]]
PARAMS = SamplingParams(max_tokens=60, temperature=0.0, logprobs=True)


def first_difference(a, b) -> str | None:
    diff = [j for j, (x, y) in enumerate(zip(a.logprobs, b.logprobs)) if x != y]
    if a.token_ids != b.token_ids or diff:
        return f"tokens equal {a.token_ids == b.token_ids}, log-probs differ from {diff[:1]}"
    return None


def alone_and_together():
    llm = LLM("smollm2-135m-instruct", dtype="bfloat16")
    together = [o.outputs[0] for o in llm.chat(CHATS[:2], PARAMS, use_tqdm=False)]
    return [(llm.chat([chat], PARAMS, use_tqdm=False)[0].outputs[0], both) for chat, both in zip(CHATS[:2], together)]


def plain_and_suffix():
    def run(**kw):
        return [o.outputs[0] for o in LLM("smollm2-135m-instruct", dtype="bfloat16", **kw).chat(
            CHATS, PARAMS, use_tqdm=False)]
    return list(zip(run(), run(speculative=SpeculativeConfig(method="suffix", num_speculative_tokens=8))))


def plain_and_multi_step():
    sampled = SamplingParams(max_tokens=45, temperature=0.8, top_p=0.95, seed=3, logprobs=True)

    def run(**kw):
        llm = LLM("smollm2-135m-instruct", dtype="bfloat16", **kw)
        return [o.outputs[0] for p in (PARAMS, sampled) for o in llm.chat(CHATS, p, use_tqdm=False)]
    return list(zip(run(), run(num_scheduler_steps=4)))


def main(mode: str):
    pairs = {"alone": alone_and_together, "suffix": plain_and_suffix, "multi_step": plain_and_multi_step}[mode]()
    for i, (a, b) in enumerate(pairs):
        if (where := first_difference(a, b)) is not None:
            print(f"chat {i}: {where}")
            raise SystemExit(1)
    print("same bits")


if __name__ == "__main__":
    main(sys.argv[1])
