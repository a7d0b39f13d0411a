"""One HTTP request's generation: its prompts queued on the ``EngineLoop``, its choices as they grow.

A completions request may carry several prompts, each asking ``n`` samples: choice ``p * n + j`` is sample
``j`` of prompt ``p`` (OpenAI's numbering). ``Generation.deltas()`` yields ``Delta``s (new text of one
choice, and its finish reason once it ended) for streaming; ``result()`` collects them into ``Choice``s.
A choice that hits a stop string ends there; when every choice of a prompt has, its engine request is
aborted (its blocks freed). If the client disconnects (``watch`` sees ``http.disconnect``) or the
handler ends early (``close``), every engine request still running is aborted.
"""
from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import AsyncIterator, Sequence

from jaxserve.server.choice_text import ChoiceText
from jaxserve.server.engine_loop import EngineLoop
from jaxserve.server.protocol import ApiError


@dataclass
class Delta:
    """New text of choice ``index``; with log-probs asked for, the tokens that text completes (``token_ids``,
    starting at ``token_start`` in the choice), their ``logprobs`` and (with top_logprobs) each one's ``top``
    most likely (token id, log-prob)."""
    index: int
    text: str
    finish_reason: str | None = None
    token_start: int = 0
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] | None = None
    top: list | None = None


@dataclass
class Choice:
    index: int
    text: str
    token_ids: list[int]
    finish_reason: str
    logprobs: list[float] | None  # of each chosen token, when asked for
    top_logprobs: list | None = None  # per token, the most likely (token id, log-prob), when asked for


class Generation:
    """``prompts[i]`` (token ids) sampled with ``params[i]``; ``stop``: stop strings for every choice."""

    def __init__(self, loop: EngineLoop, prompts: Sequence[list[int]], params: Sequence, stop: Sequence[str],
                 prefix: str = "req"):
        tokenizer = loop.engine.tokenizer
        self._loop, self.prompts, self._params = loop, list(prompts), list(params)
        self._rids = [loop.new_request_id(prefix) for _ in self.prompts]
        self._base = {rid: sum(p.n for p in self._params[:i]) for i, rid in enumerate(self._rids)}
        self._n = {rid: p.n for rid, p in zip(self._rids, self._params)}
        self.choices = [ChoiceText(tokenizer, stop) for p in self._params for _ in range(p.n)]
        self.finish: list[str | None] = [None] * len(self.choices)
        self.logprobs: list[list[float] | None] = [None] * len(self.choices)
        self._wants = [p.logprobs for p in self._params for _ in range(p.n)]
        self.top: list[list | None] = [None] * len(self.choices)
        self._wants_top = [p.top_logprobs > 0 for p in self._params for _ in range(p.n)]
        self._streamed = [[] for _ in self.choices]  # per choice: each pushed token's (log-prob, top candidates)
        self._sink: asyncio.Queue = asyncio.Queue()
        self._running: set[str] = set()
        self._closed = False
        self._watcher: asyncio.Future | None = None

    @property
    def prompt_tokens(self) -> int:
        return sum(len(p) for p in self.prompts)

    @property
    def completion_tokens(self) -> int:
        return sum(len(c.token_ids) for c in self.choices)

    async def start(self) -> None:
        """Queues every prompt; the engine's rejection of one is a 400 and aborts the others."""
        for rid, ids, sp in zip(self._rids, self.prompts, self._params):
            if self._closed:
                return
            self._running.add(rid)
            try:
                await self._loop.add(rid, ids, sp, self._sink)
            except (ValueError, TypeError) as e:
                self._running.discard(rid)
                self.close()
                raise ApiError(400, str(e)) from None
            except BaseException:
                self.close()  # cancelled while queuing: the abort follows the add in the loop's queue
                raise

    def watch(self, receive) -> None:
        """Aborts everything when ``receive`` (the ASGI channel) reports the client gone (in a task that
        outlives the handler: a stream the client left before its first chunk is cleaned up too)."""
        self._watcher = asyncio.ensure_future(self._watch(receive))

    def close(self) -> None:
        """Aborts every engine request still running; nothing more is queued."""
        self._closed = True
        for rid in self._running:
            self._loop.abort(rid)
        self._running.clear()
        if self._watcher is not None and self._watcher is not asyncio.current_task():
            self._watcher.cancel()

    async def _watch(self, receive) -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        self.close()
        self._sink.put_nowait(("disconnected", None, None))

    async def deltas(self) -> AsyncIterator[Delta]:
        waiting = set(self._rids)
        while waiting:
            kind, rid, payload = await self._sink.get()
            if kind == "disconnected":
                return
            if kind == "failed":
                self._running.discard(rid)
                raise ApiError(500, payload)
            if kind == "tokens":
                for d in self._push(rid, payload):
                    yield d
            elif kind == "finished":
                waiting.discard(rid)
                self._running.discard(rid)
                for d in self._close(rid, payload):
                    yield d

    async def result(self) -> list[Choice]:
        async for _ in self.deltas():
            pass
        if any(f is None for f in self.finish):
            raise ApiError(499, "the client closed the connection")
        return [Choice(i, c.text, c.token_ids, self.finish[i], self.logprobs[i], self.top[i])
                for i, c in enumerate(self.choices)]

    def _push(self, rid: str, tokens) -> list[Delta]:
        out = []
        for t in tokens:
            i = self._base[rid] + t.index
            if self.choices[i].stopped:
                continue
            d = self._grow(i, t.token_id, t.logprob, t.top_logprobs)
            if d is not None:
                out.append(d)
        base = self._base[rid]
        if rid in self._running and all(c.stopped for c in self.choices[base:base + self._n[rid]]):
            self._loop.abort(rid)  # every choice hit a stop string: free the blocks now
            self._running.discard(rid)
        return out

    def _grow(self, i: int, token_id: int, logprob: float | None, top) -> Delta | None:
        """Choice ``i`` takes a token: the delta to stream, if any (text, a stop, or tokens with log-probs)."""
        choice = self.choices[i]
        text = choice.push(token_id)
        self._streamed[i].append((logprob, top))
        if choice.stopped:
            self.finish[i] = "stop"
        d = self._delta(i, text)
        return d if text or choice.stopped or d.token_ids else None

    def _delta(self, i: int, text: str) -> Delta:
        """A delta of choice ``i``'s ``text`` carrying the tokens it released (when log-probs are asked for)."""
        choice, released = self.choices[i], self.choices[i].release()
        if not self._wants[i]:
            return Delta(i, text, self.finish[i])
        streamed = [self._streamed[i][k] for k in released]
        return Delta(i, text, self.finish[i], released.start, [choice.token_ids[k] for k in released],
                     [lp for lp, _ in streamed], [top for _, top in streamed] if self._wants_top[i] else None)

    def _close(self, rid: str, output) -> list[Delta]:
        out = []
        for o in output.outputs:
            i = self._base[rid] + o.index
            choice = self.choices[i]
            lps, tops = o.logprobs, o.top_logprobs
            if self.finish[i] is None:  # ended in the engine (EOS, a stop token, max_tokens, an abort)
                for k in range(len(choice.token_ids), len(o.token_ids)):  # tokens not streamed yet (none normally)
                    choice.push(o.token_ids[k])
                    self._streamed[i].append((None if lps is None else lps[k], None if tops is None else tops[k]))
                text = choice.close()
                self.finish[i] = "stop" if choice.stopped else o.finish_reason
                out.append(self._delta(i, text))
            self.logprobs[i] = None if lps is None else list(lps[:len(choice.token_ids)])
            self.top[i] = None if tops is None else list(tops[:len(choice.token_ids)])
        return out
