"""The official ``openai`` client against the server: the same tokens as ``LLM.generate`` / ``LLM.chat``."""
import asyncio

import numpy as np
import pytest

from tests.server.conftest import API_KEY, CONVERSATION, MAX_TOKENS, MODEL, PROMPTS, SAMPLED

pytestmark = pytest.mark.xdist_group("server")


def test_models_lists_the_served_model(client, served):
    models = client.models.list().data
    assert [m.id for m in models] == [MODEL]
    assert models[0].max_model_len == served.llm.engine.max_model_len


def test_completions_match_generate(client, served):
    for prompt in PROMPTS:
        out = client.completions.create(model=MODEL, prompt=prompt, max_tokens=MAX_TOKENS, temperature=0)
        ref = served.greedy[prompt].outputs[0]
        assert out.choices[0].text == ref.text
        assert out.choices[0].finish_reason == ref.finish_reason
        assert out.usage.completion_tokens == len(ref.token_ids)
        assert out.usage.prompt_tokens == len(served.greedy[prompt].prompt_token_ids)


def test_streamed_completions_match_generate(client, served):
    for prompt in PROMPTS[:2]:
        stream = client.completions.create(model=MODEL, prompt=prompt, max_tokens=MAX_TOKENS, temperature=0,
                                           stream=True, stream_options={"include_usage": True})
        chunks = list(stream)
        ref = served.greedy[prompt].outputs[0]
        assert "".join(c.choices[0].text for c in chunks if c.choices) == ref.text
        assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == ref.finish_reason
        assert chunks[-1].usage.completion_tokens == len(ref.token_ids)


def test_token_id_prompts_and_a_batch_of_prompts(client, served):
    """A list of prompts is one choice each, in order; a token-id prompt is the same as its text."""
    ids = served.greedy[PROMPTS[2]].prompt_token_ids
    out = client.completions.create(model=MODEL, prompt=[PROMPTS[0], PROMPTS[1]], max_tokens=MAX_TOKENS,
                                    temperature=0)
    assert [c.text for c in out.choices] == [served.greedy[p].outputs[0].text for p in PROMPTS[:2]]
    assert [c.index for c in out.choices] == [0, 1]
    out = client.completions.create(model=MODEL, prompt=ids, max_tokens=MAX_TOKENS, temperature=0)
    assert out.choices[0].text == served.greedy[PROMPTS[2]].outputs[0].text


def test_n_seed_top_k_top_p_match_generate(client, served):
    out = client.completions.create(model=MODEL, prompt=PROMPTS[0], max_tokens=MAX_TOKENS,
                                    extra_body={"top_k": SAMPLED["top_k"]},
                                    **{k: v for k, v in SAMPLED.items() if k != "top_k"})
    assert [c.text for c in out.choices] == [o.text for o in served.sampled.outputs]
    assert len({c.text for c in out.choices}) == 2  # two different samples, each reproduced


def test_logprobs_match_generate(client, served):
    out = client.completions.create(model=MODEL, prompt=PROMPTS[1], max_tokens=MAX_TOKENS, temperature=0,
                                    logprobs=0)
    ref = served.logprobs.outputs[0]
    lp = out.choices[0].logprobs
    np.testing.assert_allclose(lp.token_logprobs, ref.logprobs, rtol=1e-5, atol=1e-6)
    assert "".join(lp.tokens) == served.llm.tokenizer.decode(ref.token_ids, skip_special_tokens=False)


def test_stop_strings_and_stop_token_ids(client, served):
    ref = served.greedy[PROMPTS[0]].outputs[0]
    stop = ref.text[4:6]  # two characters, maybe inside one token: the text ends just before them
    cut = ref.text.find(stop)
    assert 0 < cut < len(ref.text) - len(stop)
    for stream in (False, True):
        out = client.completions.create(model=MODEL, prompt=PROMPTS[0], max_tokens=MAX_TOKENS, temperature=0,
                                        stop=[stop, "\x00never"], stream=stream)
        chunks = list(out) if stream else [out]
        assert "".join(c.choices[0].text for c in chunks) == ref.text[:cut]
        assert chunks[-1].choices[0].finish_reason == "stop"
    stop_id = ref.token_ids[3]
    out = client.completions.create(model=MODEL, prompt=PROMPTS[0], max_tokens=MAX_TOKENS, temperature=0,
                                    extra_body={"stop_token_ids": [stop_id]})
    first = ref.token_ids.index(stop_id)
    assert out.choices[0].finish_reason == "stop"
    assert out.usage.completion_tokens == first + 1
    assert out.choices[0].text == served.llm.tokenizer.decode(ref.token_ids[:first + 1])


def test_chat_matches_llm_chat(client, served):
    out = client.chat.completions.create(model=MODEL, messages=CONVERSATION, max_tokens=MAX_TOKENS, temperature=0)
    ref = served.chat.outputs[0]
    assert out.choices[0].message.role == "assistant"
    assert out.choices[0].message.content == ref.text
    assert out.usage.prompt_tokens == len(served.chat.prompt_token_ids)
    stream = client.chat.completions.create(model=MODEL, messages=CONVERSATION, max_tokens=MAX_TOKENS,
                                            temperature=0, stream=True)
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == ref.text
    assert chunks[-1].choices[0].finish_reason == ref.finish_reason


def test_64_concurrent_streaming_clients(served):
    """64 clients at once (8 engine seats): each gets its prompt's reference text, and they were batched."""
    import openai

    async def one(client, prompt):
        stream = await client.completions.create(model=MODEL, prompt=prompt, max_tokens=MAX_TOKENS,
                                                 temperature=0, stream=True)
        return "".join([c.choices[0].text async for c in stream])

    async def main():
        async with openai.AsyncOpenAI(base_url=served.v1, api_key=API_KEY, max_retries=0, timeout=120) as client:
            return await asyncio.gather(*[one(client, PROMPTS[i % len(PROMPTS)]) for i in range(64)])

    before = served.loop.stats()
    texts = asyncio.run(main())
    assert texts == [served.greedy[PROMPTS[i % len(PROMPTS)]].outputs[0].text for i in range(64)]
    after = served.wait_idle()
    assert after["requests_finished_total"] - before["requests_finished_total"] == 64
    assert after["peak_running"] > 1  # clients shared engine steps
    assert after["kv_blocks_free"] == after["kv_blocks_total"]
