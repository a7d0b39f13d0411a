"""Log-probabilities over a stream (``stream=true`` with ``logprobs``): each chunk carries its text's tokens;
joined, they are the non-streamed response's and ``LLM.generate``'s (top alternatives included), also when a
stop string holds text back."""
import numpy as np
import pytest

from tests.server.conftest import CONVERSATION, MAX_TOKENS, MODEL, PROMPTS, TOP

pytestmark = pytest.mark.xdist_group("server")


def _completion(client, stream, **kw):
    out = client.completions.create(model=MODEL, prompt=PROMPTS[1], max_tokens=MAX_TOKENS, temperature=0,
                                    logprobs=TOP, stream=stream, **kw)
    return list(out) if stream else [out]


def _joined(chunks):
    """(text, tokens, token_logprobs, text_offset, top_logprobs) of a completion's chunks, and the text/tokens
    after each."""
    text, tokens, lps, offsets, tops, steps = "", [], [], [], [], []
    for c in chunks:
        ch = c.choices[0]
        text += ch.text
        if ch.logprobs is not None:
            tokens += ch.logprobs.tokens
            lps += ch.logprobs.token_logprobs
            offsets += ch.logprobs.text_offset
            tops += ch.logprobs.top_logprobs
        steps.append((text, "".join(tokens), ch.finish_reason))
    return text, tokens, lps, offsets, tops, steps


def _top_strings(served, pos):
    """A reference position's top alternatives as OpenAI's {token string: log-prob}."""
    return {served.llm.tokenizer.decode([t], skip_special_tokens=False): lp for t, lp in pos}


def test_streamed_completion_logprobs_match_generate_and_the_plain_response(client, served):
    ref = served.logprobs.outputs[0]
    text, tokens, lps, offsets, tops, steps = _joined(_completion(client, True))
    plain = _completion(client, False)[0].choices[0].logprobs
    np.testing.assert_allclose(lps, ref.logprobs, rtol=1e-5, atol=1e-6)
    assert lps == plain.token_logprobs and tokens == plain.tokens and offsets == plain.text_offset
    assert tops == plain.top_logprobs and len(tops) == len(tokens)
    for got, pos in zip(tops, ref.top_logprobs):  # the top alternatives LLM.generate found, by token string
        want = _top_strings(served, pos)
        assert len(pos) == TOP and got.keys() == want.keys()
        np.testing.assert_allclose([got[t] for t in want], list(want.values()), rtol=1e-5, atol=1e-6)
    assert text == ref.text and len(tokens) == len(ref.token_ids) == MAX_TOKENS
    assert offsets == list(np.cumsum([0] + [len(t) for t in tokens[:-1]]))
    assert sum(1 for c in steps if c[1]) > 2  # log-probs came in several chunks, not all at the end


def test_streamed_logprobs_with_a_stop_string_stay_with_their_text(client, served):
    ref = served.logprobs.outputs[0]
    stop = ref.text[5:7]
    cut = ref.text.find(stop)
    assert 0 < cut < len(ref.text) - len(stop)
    streamed = _completion(client, True, stop=[stop])
    text, tokens, lps, offsets, tops, steps = _joined(streamed)
    plain = _completion(client, False, stop=[stop])[0].choices[0]
    assert text == plain.text == ref.text[:cut] and plain.finish_reason == steps[-1][2] == "stop"
    # every token up to the one completing the stop string, as the plain response lists them
    assert tokens == plain.logprobs.tokens and lps == plain.logprobs.token_logprobs
    assert offsets == plain.logprobs.text_offset and tops == plain.logprobs.top_logprobs
    n = len(tokens)
    assert "".join(tokens).find(stop) >= 0 and stop not in "".join(tokens[:n - 1])
    np.testing.assert_allclose(lps, ref.logprobs[:n], rtol=1e-5, atol=1e-6)
    for shown, token_text, finish in steps[:-1]:  # before the end, no token runs ahead of the text shown
        assert finish is None and shown.startswith(token_text)


def test_streamed_chat_logprobs_match_chat_and_the_plain_response(client, served):
    ref = served.chat_logprobs.outputs[0]
    kw = dict(model=MODEL, messages=CONVERSATION, max_tokens=MAX_TOKENS, temperature=0, logprobs=True, top_logprobs=TOP)
    chunks = list(client.chat.completions.create(stream=True, **kw))
    streamed = [x for c in chunks if c.choices and c.choices[0].logprobs for x in c.choices[0].logprobs.content]
    plain = client.chat.completions.create(**kw).choices[0].logprobs.content
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == ref.text
    def flat(items):
        return [(x.token, x.logprob, [(a.token, a.logprob) for a in x.top_logprobs]) for x in items]
    assert flat(streamed) == flat(plain)
    assert len(streamed) == len(ref.token_ids)
    np.testing.assert_allclose([x.logprob for x in streamed], ref.logprobs, rtol=1e-5, atol=1e-6)
    for x, pos in zip(streamed, ref.top_logprobs):
        assert [a.token for a in x.top_logprobs] == list(_top_strings(served, pos))
        np.testing.assert_allclose([a.logprob for a in x.top_logprobs], [lp for _, lp in pos], rtol=1e-5, atol=1e-6)
    assert sum(1 for c in chunks if c.choices and c.choices[0].logprobs) > 2
