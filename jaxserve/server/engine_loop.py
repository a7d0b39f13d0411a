"""The one thread that drives an ``LLMEngine`` for the server: requests in, tokens out (host).

``LLMEngine`` is not thread-safe, so only this thread touches it. HTTP handlers (on the asyncio event
loop) call ``add`` (awaits the engine's acceptance, or raises its ``ValueError``/``TypeError``) and
``abort``; both only enqueue commands. Between commands the thread runs ``engine.step()`` while
anything is unfinished, so every live request is batched into the same steps, and posts to each
request's asyncio queue (``sink``), in order, ``("tokens", rid, [StepToken, ...])`` and finally
``("finished", rid, RequestOutput)`` (also after an abort) or ``("failed", rid, message)`` if a step
raised. ``stats()`` is a snapshot taken by the thread (engine stats plus token counters), safe to read
from any thread.
"""
from __future__ import annotations

import asyncio
import collections
import itertools
import logging
import queue
import threading
import time

log = logging.getLogger(__name__)


class EngineLoop:
    """Owns ``engine`` from ``start()`` to ``stop()``; ``window_s``: the span ``tokens_per_s`` averages over."""

    def __init__(self, engine, window_s: float = 10.0):
        self.engine = engine
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        self._live: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Queue]] = {}
        self._ids = itertools.count()
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()
        self._window_s = window_s
        self._recent: collections.deque[tuple[float, int]] = collections.deque()  # (time, tokens) per step
        self._counters = {"prompt_tokens_total": 0, "generation_tokens_total": 0, "requests_finished_total": 0,
                          "requests_aborted_total": 0, "steps_total": 0, "peak_running": 0}
        self._stats = {**engine.stats(), **self._counters, "tokens_per_s": 0.0, "num_live": 0}

    # ---- any thread ---------------------------------------------------------------------------

    def start(self) -> None:
        if self._thread is not None:
            raise RuntimeError("EngineLoop already started")
        self._thread = threading.Thread(target=self._run, name="jaxserve-engine", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 30.0) -> None:
        self._stopping.set()
        self._commands.put(("wake",))
        if self._thread is not None:
            self._thread.join(timeout)

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and not self._stopping.is_set()

    def new_request_id(self, prefix: str = "req") -> str:
        return f"{prefix}-{next(self._ids)}"

    async def add(self, request_id: str, prompt_token_ids: list[int], sampling_params, sink: asyncio.Queue) -> None:
        """Queues a request; returns once the engine accepted it, raises what ``add_request`` raised."""
        if not self.alive:
            raise RuntimeError("the engine loop is not running")
        aloop = asyncio.get_running_loop()
        accepted = aloop.create_future()
        self._commands.put(("add", request_id, list(prompt_token_ids), sampling_params, aloop, sink, accepted))
        await accepted

    def abort(self, request_id: str) -> None:
        """Stops a request (a no-op for one that already finished); its ``finished`` item still comes."""
        self._commands.put(("abort", request_id))

    def stats(self) -> dict:
        return dict(self._stats)

    # ---- the engine thread ----------------------------------------------------------------------

    def _run(self) -> None:
        while not self._stopping.is_set():
            self._drain(block=not self.engine.has_unfinished())
            if self.engine.has_unfinished() and not self._stopping.is_set():
                self._step()
            self._snapshot()
        for rid in list(self._live):  # shutting down: nothing may be left in the engine
            self._abort(rid)

    def _drain(self, block: bool) -> None:
        try:
            command = self._commands.get(timeout=0.5) if block else self._commands.get_nowait()
        except queue.Empty:
            return
        while True:
            self._execute(command)
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                return

    def _execute(self, command: tuple) -> None:
        if command[0] == "add":
            _, rid, ids, sp, aloop, sink, accepted = command
            try:
                self.engine.add_request(ids, sp, request_id=rid)
            except Exception as e:  # a rejected request: the engine's state is unchanged
                _call_soon(aloop, _settle, accepted, e)
                return
            self._live[rid] = (aloop, sink)
            self._counters["prompt_tokens_total"] += len(ids)
            if not _call_soon(aloop, _settle, accepted, None):  # its client's loop is gone: nobody will read it
                self._abort(rid)
        elif command[0] == "abort" and command[1] in self._live:
            self._abort(command[1])

    def _abort(self, rid: str) -> None:
        self._counters["requests_aborted_total"] += 1
        self._post(rid, "finished", self.engine.abort(rid))
        self._release(rid)

    def _step(self) -> None:
        try:
            tokens = self.engine.step()
        except Exception as e:  # keep serving: fail what was running, leave the engine empty
            log.exception("engine step failed")
            for rid in list(self._live):
                self._post(rid, "failed", f"engine step failed: {type(e).__name__}: {e}")
                try:
                    self.engine.abort(rid)
                except Exception:  # noqa: BLE001 -- already gone from the scheduler
                    pass
                self._release(rid)
            return
        self._counters["steps_total"] += 1
        self._counters["generation_tokens_total"] += len(tokens)
        self._recent.append((time.monotonic(), len(tokens)))
        by_request: dict[str, list] = {}
        for t in tokens:
            by_request.setdefault(t.request_id, []).append(t)
        for rid, toks in by_request.items():
            self._post(rid, "tokens", toks)
        for rid in [r for r in self.engine.finished if r in self._live]:
            self._counters["requests_finished_total"] += 1
            self._post(rid, "finished", self.engine.finished.pop(rid))
            self._release(rid)

    def _post(self, rid: str, kind: str, payload) -> None:
        aloop, sink = self._live[rid]
        _call_soon(aloop, sink.put_nowait, (kind, rid, payload))

    def _release(self, rid: str) -> None:
        del self._live[rid]
        self.engine.forget(rid)

    def _snapshot(self) -> None:
        now = time.monotonic()
        while self._recent and self._recent[0][0] < now - self._window_s:
            self._recent.popleft()
        stats = self.engine.stats()
        self._counters["peak_running"] = max(self._counters["peak_running"], stats["num_running"])
        span = now - self._recent[0][0] if len(self._recent) > 1 else 0.0
        rate = sum(n for _, n in list(self._recent)[1:]) / span if span > 0 else 0.0
        self._stats = {**stats, **self._counters, "tokens_per_s": rate, "num_live": len(self._live)}


def _call_soon(aloop: asyncio.AbstractEventLoop, fn, *args) -> bool:
    """Runs ``fn(*args)`` on ``aloop`` from the engine thread; False if that loop is already closed (its client
    has gone), which must not stop the thread every other request is served by."""
    try:
        aloop.call_soon_threadsafe(fn, *args)
    except RuntimeError:  # "Event loop is closed"
        return False
    return True


def _settle(future: asyncio.Future, error: BaseException | None) -> None:
    if not future.done():  # the handler may have been cancelled meanwhile
        future.set_result(None) if error is None else future.set_exception(error)
