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
                         "logprobs": _completion_logprobs(c, tokenizer)} for c in choices],
            "usage": usage(gen)}


def completion_chunk(rid: str, model: str, created: int, d: Delta) -> dict:
    return {"id": rid, "object": "text_completion", "created": created, "model": model,
            "choices": [{"index": d.index, "text": d.text, "finish_reason": d.finish_reason, "logprobs": None}]}


def chat_completion(rid: str, model: str, created: int, choices: list[Choice], gen: Generation, tokenizer) -> dict:
    return {"id": rid, "object": "chat.completion", "created": created, "model": model,
            "choices": [{"index": c.index, "message": {"role": "assistant", "content": c.text},
                         "finish_reason": c.finish_reason, "logprobs": _chat_logprobs(c, tokenizer)}
                        for c in choices],
            "usage": usage(gen)}


def chat_chunk(rid: str, model: str, created: int, index: int, delta: dict, finish_reason: str | None = None) -> dict:
    return {"id": rid, "object": "chat.completion.chunk", "created": created, "model": model,
            "choices": [{"index": index, "delta": delta, "finish_reason": finish_reason, "logprobs": None}]}


def usage_chunk(rid: str, model: str, created: int, obj: str, gen: Generation) -> dict:
    return {"id": rid, "object": obj, "created": created, "model": model, "choices": [], "usage": usage(gen)}


def _token_strings(c: Choice, tokenizer) -> list[str]:
    return [tokenizer.decode([t], skip_special_tokens=False) for t in c.token_ids[:len(c.logprobs)]]


def _completion_logprobs(c: Choice, tokenizer) -> dict | None:
    if c.logprobs is None:
        return None
    tokens = _token_strings(c, tokenizer)
    offsets, at = [], 0
    for t in tokens:
        offsets.append(at)
        at += len(t)
    return {"tokens": tokens, "token_logprobs": c.logprobs, "top_logprobs": None, "text_offset": offsets}


def _chat_logprobs(c: Choice, tokenizer) -> dict | None:
    if c.logprobs is None:
        return None
    return {"content": [{"token": t, "logprob": lp, "bytes": list(t.encode()), "top_logprobs": []}
                        for t, lp in zip(_token_strings(c, tokenizer), c.logprobs)]}
