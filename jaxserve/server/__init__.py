"""An OpenAI-compatible server over an ``LLM`` (FastAPI + uvicorn): ``jaxserve serve MODEL``.

``build_app(llm, model_name, api_key=None)`` is the ASGI app (``jaxserve.server.app``); ``serve`` runs it.
The engine runs in one background thread (``jaxserve.server.engine_loop``); handlers only enqueue
requests and read their streams.
"""
from __future__ import annotations


def build_app(llm, model_name: str, api_key: str | None = None):
    from jaxserve.server.app import build_app as build
    return build(llm, model_name, api_key)


def serve(llm, model_name: str, host: str = "127.0.0.1", port: int = 8000, api_key: str | None = None,
          log_level: str = "info") -> None:
    """Serves ``llm`` over HTTP until interrupted."""
    import uvicorn
    uvicorn.run(build_app(llm, model_name, api_key), host=host, port=port, log_level=log_level)
