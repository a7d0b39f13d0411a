"""Run by test_smollm2.py in a subprocess with the users' XLA flags: two bf16 SmolLM2 chats decoded together, then
each alone; prints where the tokens or log-probs first differ, or "same bits alone and in a batch"."""
from jaxserve import LLM, SamplingParams

CHATS = [[{"role": "user", "content": "Rewrite this code with snake_case names: def getValue(x): return "
                                      "x.itemValue + x.otherValue"}],
         [{"role": "user", "content": "Write a haiku about the sea."}]]


def main():
    llm = LLM("smollm2-135m-instruct", dtype="bfloat16")
    params = SamplingParams(max_tokens=60, temperature=0.0, logprobs=True)
    together = [o.outputs[0] for o in llm.chat(CHATS, params, use_tqdm=False)]
    for i, (chat, both) in enumerate(zip(CHATS, together)):
        alone = llm.chat([chat], params, use_tqdm=False)[0].outputs[0]
        diff = [j for j, (a, b) in enumerate(zip(alone.logprobs, both.logprobs)) if a != b]
        if alone.token_ids != both.token_ids or diff:
            print(f"chat {i}: tokens equal {alone.token_ids == both.token_ids}, log-probs differ from {diff[:1]}")
            raise SystemExit(1)
    print("same bits alone and in a batch")


if __name__ == "__main__":
    main()
