"""One completion choice's text as its tokens arrive, cut at the first stop string (host only).

The engine stops on tokens; OpenAI's ``stop`` is strings, which may span tokens. ``ChoiceText`` decodes
incrementally (``IncrementalDetokenizer``) and holds back the last ``len(longest stop) - 1`` characters,
which might be the start of a stop string, so streamed text never shows a stop string or part of one
(as vLLM's detokenizer does). The stop string itself is not part of the text.

``release()`` says which tokens a chunk carries (their log-probabilities): a token goes out with the
chunk holding the end of the text decoded through it, so a token whose text is held back waits with
it; once the choice ended (a stop string, or ``close``) every pushed token goes, the stop string's too
(as the non-streamed response lists them).
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
        self._ends: list[int] = []  # per token: the decoded text's length once it was pushed
        self._released = 0  # tokens already handed out by release()
        self.text = ""  # everything emitted so far
        self.stopped = False  # a stop string was found: later tokens are ignored
        self._closed = False

    def push(self, token_id: int) -> str:
        if self.stopped:
            return ""
        self.token_ids.append(int(token_id))
        self._detok.push(token_id)
        self._ends.append(len(self._detok.text))
        return self._emit(self._detok.text, final=False)

    def close(self) -> str:
        """The rest of the text (the whole output decoded at once, as ``LLM.generate`` decodes it)."""
        if self.stopped:
            return ""
        text = self._emit(self._tokenizer.decode(self.token_ids), final=True)
        self._closed = True
        return text

    def release(self) -> range:
        """Positions (in ``token_ids``) of the tokens whose text has now gone out, since the last call."""
        done = self.stopped or self._closed
        end = len(self.token_ids) if done else self._released
        while end < len(self.token_ids) and self._ends[end] <= self._emitted:
            end += 1
        out, self._released = range(self._released, end), end
        return out

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
