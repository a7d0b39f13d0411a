"""OpenAI response bodies (completions, chat completions, their stream chunks) as plain dicts (host only)."""
from __future__ import annotations

import json

from jaxserve.server.generation import Choice, Delta, Generation


def sse(payload: dict | str) -> str:
    """One server-sent event: ``data: <json>`` and a blank line (``[DONE]`` as it is)."""
    return f"data: {payload if isinstance(payload, str) else json.dumps(payload)}\n\n"


def usage(gen: Generation) -> dict:
    prompt, completion = gen.prompt_tokens, gen.completion_tokens
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def completion(rid: str, model: str, created: int, choices: list[Choice], gen: Generation, tokenizer) -> dict:
    return {"id": rid, "object": "text_completion", "created": created, "model": model,
            "choices": [{"index": c.index, "text": c.text, "finish_reason": c.finish_reason,
                         "logprobs": _choice_logprobs(c, tokenizer, _completion_logprobs)} for c in choices],
            "usage": usage(gen)}


def completion_chunk(rid: str, model: str, created: int, d: Delta, tokenizer, offsets: dict[int, int]) -> dict:
    """A stream chunk; ``offsets`` (choice -> characters of its tokens so far) carries ``text_offset`` across
    chunks, so a stream's offsets are the non-streamed response's."""
    logprobs = None
    if d.logprobs is not None:
        logprobs = _completion_logprobs(token_strings(d.token_ids, tokenizer), d.logprobs, d.top, tokenizer,
                                        offsets.get(d.index, 0))
        offsets[d.index] = offsets.get(d.index, 0) + sum(len(t) for t in logprobs["tokens"])
    return {"id": rid, "object": "text_completion", "created": created, "model": model,
            "choices": [{"index": d.index, "text": d.text, "finish_reason": d.finish_reason, "logprobs": logprobs}]}


def chat_completion(rid: str, model: str, created: int, choices: list[Choice], gen: Generation, tokenizer) -> dict:
    return {"id": rid, "object": "chat.completion", "created": created, "model": model,
            "choices": [{"index": c.index, "message": {"role": "assistant", "content": c.text},
                         "finish_reason": c.finish_reason, "logprobs": _choice_logprobs(c, tokenizer, _chat_logprobs)}
                        for c in choices],
            "usage": usage(gen)}


def chat_chunk(rid: str, model: str, created: int, index: int, delta: dict, finish_reason: str | None = None,
               logprobs: dict | None = None) -> dict:
    return {"id": rid, "object": "chat.completion.chunk", "created": created, "model": model,
            "choices": [{"index": index, "delta": delta, "finish_reason": finish_reason, "logprobs": logprobs}]}


def chat_delta_chunks(rid: str, model: str, created: int, d: Delta, tokenizer) -> list[dict]:
    """A delta's chunks: its content (with its tokens' ``logprobs.content``), then its finish reason."""
    out = []
    if d.text or d.token_ids:
        logprobs = None if d.logprobs is None else _chat_logprobs(token_strings(d.token_ids, tokenizer), d.logprobs,
                                                                  d.top, tokenizer)
        out.append(chat_chunk(rid, model, created, d.index, {"content": d.text}, logprobs=logprobs))
    if d.finish_reason is not None:
        out.append(chat_chunk(rid, model, created, d.index, {}, d.finish_reason))
    return out


def usage_chunk(rid: str, model: str, created: int, obj: str, gen: Generation) -> dict:
    return {"id": rid, "object": obj, "created": created, "model": model, "choices": [], "usage": usage(gen)}


def token_strings(token_ids, tokenizer) -> list[str]:
    """Each token decoded on its own (special tokens shown), as OpenAI's ``logprobs.tokens`` lists them."""
    return [tokenizer.decode([t], skip_special_tokens=False) for t in token_ids]


def _completion_logprobs(tokens: list[str], logprobs: list[float], top: list | None, tokenizer,
                         offset: int = 0) -> dict:
    offsets = []
    for t in tokens:
        offsets.append(offset)
        offset += len(t)
    tops = None if top is None else [dict(zip(token_strings([t for t, _ in pos], tokenizer), [lp for _, lp in pos]))
                                     for pos in top]
    return {"tokens": tokens, "token_logprobs": list(logprobs), "top_logprobs": tops, "text_offset": offsets}


def _chat_logprobs(tokens: list[str], logprobs: list[float], top: list | None, tokenizer) -> dict:
    def entry(token: str, lp: float) -> dict:
        return {"token": token, "logprob": lp, "bytes": list(token.encode())}
    tops = [[] for _ in tokens] if top is None else [
        [entry(t, lp) for t, (_, lp) in zip(token_strings([t for t, _ in pos], tokenizer), pos)] for pos in top]
    return {"content": [{**entry(t, lp), "top_logprobs": alts} for t, lp, alts in zip(tokens, logprobs, tops)]}


def _choice_logprobs(c: Choice, tokenizer, shape) -> dict | None:
    if c.logprobs is None:
        return None
    return shape(token_strings(c.token_ids[:len(c.logprobs)], tokenizer), c.logprobs, c.top_logprobs, tokenizer)
