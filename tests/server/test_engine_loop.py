"""The server's engine thread outlives a client whose event loop closed before the engine took its request."""
import asyncio
import threading

from jaxserve.server.engine_loop import EngineLoop


class HeldEngine:
    """The engine calls ``EngineLoop`` makes, with ``add_request`` held until ``release`` is set."""

    def __init__(self):
        self.release = threading.Event()
        self.requests: set[str] = set()
        self.aborted: list[str] = []
        self.finished: dict = {}

    def stats(self) -> dict:
        return {"num_running": len(self.requests)}

    def has_unfinished(self) -> bool:
        return bool(self.requests)

    def add_request(self, ids, sampling_params, request_id):
        self.release.wait(10)
        self.requests.add(request_id)

    def abort(self, request_id):
        self.requests.discard(request_id)
        self.aborted.append(request_id)
        return f"aborted {request_id}"

    def step(self):
        return []

    def forget(self, request_id):
        pass


def test_a_request_whose_client_loop_closed_is_aborted_and_the_thread_serves_on():
    engine = HeldEngine()
    loop = EngineLoop(engine)
    loop.start()
    try:
        async def give_up_early():  # the client stops waiting while the engine thread is inside add_request
            try:
                await asyncio.wait_for(loop.add("gone", [1, 2], None, asyncio.Queue()), 0.05)
            except asyncio.TimeoutError:
                return
        asyncio.run(give_up_early())  # closes that client's loop
        engine.release.set()

        async def add_another():
            sink = asyncio.Queue()
            await loop.add("next", [3], None, sink)
            loop.abort("next")
            return await sink.get()
        assert asyncio.run(asyncio.wait_for(add_another(), 5)) == ("finished", "next", "aborted next")
        assert loop.alive and engine.aborted == ["gone", "next"] and not engine.requests
    finally:
        loop.stop()
