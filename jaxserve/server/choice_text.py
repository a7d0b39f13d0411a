"""One completion choice's text as its tokens arrive, cut at the first stop string (host only).

The engine stops on tokens; OpenAI's ``stop`` is strings, which may span tokens. ``ChoiceText`` decodes
incrementally (``IncrementalDetokenizer``) and holds back the last ``len(longest stop) - 1`` characters,
which might be the start of a stop string, so streamed text never shows a stop string or part of one
(as vLLM's detokenizer does). The stop string itself is not part of the text.
"""
from __future__ import annotations

from typing import Sequence

from jaxserve.engine.streaming import IncrementalDetokenizer


class ChoiceText:
    """``push(token_id) -> text to emit now``; ``close() -> the held-back rest`` once the engine finished it."""

    def __init__(self, tokenizer, stop: Sequence[str] = ()):
        self._tokenizer = tokenizer
        self._detok = IncrementalDetokenizer(tokenizer)
        self._stop = tuple(stop)
        self._hold = max((len(s) for s in self._stop), default=1) - 1
        self._emitted = 0  # characters of the text already returned
        self.token_ids: list[int] = []
        self.text = ""  # everything emitted so far
        self.stopped = False  # a stop string was found: later tokens are ignored

    def push(self, token_id: int) -> str:
        if self.stopped:
            return ""
        self.token_ids.append(int(token_id))
        self._detok.push(token_id)
        return self._emit(self._detok.text, final=False)

    def close(self) -> str:
        """The rest of the text (the whole output decoded at once, as ``LLM.generate`` decodes it)."""
        if self.stopped:
            return ""
        return self._emit(self._tokenizer.decode(self.token_ids), final=True)

    def _emit(self, full: str, final: bool) -> str:
        cut = self._find_stop(full)
        if cut is not None:
            self.stopped = True
            end = cut
        else:
            end = len(full) if final else len(full) - self._hold
        if end <= self._emitted:
            return ""
        new, self._emitted = full[self._emitted:end], end
        self.text += new
        return new

    def _find_stop(self, full: str) -> int | None:
        start = max(0, self._emitted - self._hold)
        hits = [i for i in (full.find(s, start) for s in self._stop) if i >= 0]
        return min(hits) if hits else None
