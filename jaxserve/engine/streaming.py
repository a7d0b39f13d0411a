"""Streaming text as tokens are generated (host only): incremental detokenization over ``LLMEngine.step``.

Byte-level BPE tokens are not characters: one token may end in the middle of a UTF-8 character, and a
space may belong to the next word. ``IncrementalDetokenizer`` decodes the whole output each time and emits
the new suffix, holding text back while it ends in a partial character (U+FFFD), as vLLM's detokenizer does.
"""
from __future__ import annotations

from typing import Iterator, Sequence as Seq


class IncrementalDetokenizer:
    """``push(token_id) -> new text`` (possibly ""); ``text`` is everything emitted so far."""

    def __init__(self, tokenizer, skip_special_tokens: bool = True):
        self._tokenizer, self._skip = tokenizer, skip_special_tokens
        self.token_ids: list[int] = []
        self.text = ""

    def push(self, token_id: int) -> str:
        self.token_ids.append(int(token_id))
        decoded = self._tokenizer.decode(self.token_ids, skip_special_tokens=self._skip)
        if decoded.endswith("\ufffd") or not decoded.startswith(self.text):
            return ""  # a partial character (or a re-spelling of what was shown): wait for more tokens
        new, self.text = decoded[len(self.text):], decoded
        return new


def stream_request(engine, prompt_token_ids: Seq[int], sampling_params) -> Iterator[str]:
    """Queues one request (``n == 1``) and yields its text as it is generated; aborts it if the consumer stops
    early (``GeneratorExit``) or an error escapes, so no request is left in the engine."""
    if sampling_params.n != 1:
        raise ValueError(f"streaming yields one completion: SamplingParams.n must be 1, got {sampling_params.n}")
    request_id = engine.add_request(list(prompt_token_ids), sampling_params)
    detok = IncrementalDetokenizer(engine.tokenizer)
    done = False
    try:
        while not done:
            for token in engine.step():
                if token.request_id == request_id:
                    done = done or token.finished
                    piece = detok.push(token.token_id)
                    if piece:
                        yield piece
    finally:
        if not done and request_id in engine.scheduler.requests:
            engine.abort(request_id)
        engine.forget(request_id)
