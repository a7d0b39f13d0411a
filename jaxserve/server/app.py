"""The OpenAI-compatible HTTP app (FastAPI): ``/v1/completions``, ``/v1/chat/completions``, ``/v1/models``,
``/health``, ``/metrics``.

Handlers only tokenize, validate and read streams; the ``EngineLoop`` thread runs the engine, so
concurrent clients share its steps. Every error is OpenAI's ``{"error": {"message", "type", "param",
"code"}}``: 422 for a body that does not match the schema, 400 for a value jaxserve rejects (naming the
field), 401 for a missing or wrong API key, 404 for another model's name, 500 if a step failed; the
server keeps serving after each.
"""
from __future__ import annotations

import contextlib
import dataclasses
import secrets
import time
import uuid

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException

from jaxserve.engine.llm import with_stop_ids
from jaxserve.server import metrics, responses
from jaxserve.server.engine_loop import EngineLoop
from jaxserve.server.generation import Generation
from jaxserve.server.protocol import ApiError, ChatCompletionRequest, CompletionRequest, error_body


@dataclasses.dataclass
class ServerState:
    loop: EngineLoop
    model: str
    api_key: str | None
    created: int
    registry: object

    @property
    def engine(self):
        return self.loop.engine


def build_app(llm, model_name: str, api_key: str | None = None) -> FastAPI:
    """An app serving ``llm`` (an ``LLM`` or an ``LLMEngine``) as ``model_name``; its engine loop runs while
    the app does (lifespan). Nothing else may use the engine meanwhile."""
    loop = EngineLoop(getattr(llm, "engine", llm))

    @contextlib.asynccontextmanager
    async def lifespan(_app):
        loop.start()
        try:
            yield
        finally:
            loop.stop()

    app = FastAPI(title="jaxserve", lifespan=lifespan)
    app.state.server = ServerState(loop, model_name, api_key, int(time.time()), metrics.registry(loop, model_name))
    app.include_router(_public)
    app.include_router(_v1)
    app.add_exception_handler(ApiError, _api_error)
    app.add_exception_handler(RequestValidationError, _schema_error)
    app.add_exception_handler(HTTPException, _http_error)
    return app


def _state(request: Request) -> ServerState:
    return request.app.state.server


async def _check_api_key(request: Request) -> None:
    key = _state(request).api_key
    if key is None:
        return
    given = request.headers.get("authorization", "")
    if not secrets.compare_digest(given.encode(), f"Bearer {key}".encode()):
        raise ApiError(401, "invalid or missing API key (send 'Authorization: Bearer <key>')",
                       type_="authentication_error", code="invalid_api_key")


_public = APIRouter()
_v1 = APIRouter(prefix="/v1", dependencies=[Depends(_check_api_key)])


@_public.get("/health")
async def health(request: Request):
    alive = _state(request).loop.alive
    return JSONResponse({"status": "ok" if alive else "engine loop stopped"}, status_code=200 if alive else 503)


@_public.get("/metrics")
async def get_metrics(request: Request):
    return Response(metrics.render(_state(request).registry), media_type=metrics.CONTENT_TYPE)


@_v1.get("/models")
async def models(request: Request):
    s = _state(request)
    return {"object": "list", "data": [{"id": s.model, "object": "model", "created": s.created,
                                        "owned_by": "jaxserve", "root": s.model,
                                        "max_model_len": s.engine.max_model_len,
                                        "vocab_size": s.engine.config.vocab_size}]}


@_v1.post("/completions")
async def completions(body: CompletionRequest, request: Request):
    s = _state(request)
    _check_common(s, body)
    prompts = [_tokenize(s, p, "prompt") for p in _prompt_list(body.prompt)]
    params = [body.sampling_params(_max_tokens(s, len(ids), body.max_tokens, "prompt"))
              for ids in prompts]
    gen = Generation(s.loop, prompts, params, body.stop_strings(), "cmpl")
    rid, created = f"cmpl-{uuid.uuid4().hex}", int(time.time())
    if body.stream:
        offsets: dict[int, int] = {}
        return await _stream(gen, request, [],
                             lambda d: [responses.completion_chunk(rid, s.model, created, d, s.engine.tokenizer,
                                                                   offsets)],
                             body.include_usage and (lambda: responses.usage_chunk(rid, s.model, created,
                                                                                   "text_completion", gen)))
    choices = await _collect(gen, request)
    return responses.completion(rid, s.model, created, choices, gen, s.engine.tokenizer)


@_v1.post("/chat/completions")
async def chat_completions(body: ChatCompletionRequest, request: Request):
    s = _state(request)
    _check_common(s, body)
    tokenizer = s.engine.tokenizer
    if tokenizer is None or tokenizer.chat_template is None:
        raise ApiError(400, f"model {s.model!r} has no chat template: use /v1/completions", "messages")
    if not body.messages:
        raise ApiError(400, "messages must hold at least one message", "messages")
    try:  # the template's own errors (raise_exception) are the client's
        ids = tokenizer.encode_chat([m.model_dump() for m in body.messages])
    except ValueError as e:
        raise ApiError(400, str(e), "messages") from None
    ids = _tokenize(s, ids, "messages")
    max_tokens = _max_tokens(s, len(ids), body.requested_max_tokens, "messages")
    sp = with_stop_ids(body.sampling_params(max_tokens), tokenizer.end_of_turn_ids)
    gen = Generation(s.loop, [ids], [sp], body.stop_strings(), "chatcmpl")
    rid, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())
    if body.stream:
        head = [responses.chat_chunk(rid, s.model, created, i, {"role": "assistant", "content": ""})
                for i in range(sp.n)]
        return await _stream(gen, request, head, lambda d: responses.chat_delta_chunks(rid, s.model, created, d,
                                                                                        tokenizer),
                             body.include_usage and (lambda: responses.usage_chunk(rid, s.model, created,
                                                                                   "chat.completion.chunk", gen)))
    choices = await _collect(gen, request)
    return responses.chat_completion(rid, s.model, created, choices, gen, tokenizer)


# ---- shared by the two generation endpoints ----------------------------------------------------------

def _check_common(s: ServerState, body) -> None:
    if body.model is not None and body.model != s.model:
        raise ApiError(404, f"the model {body.model!r} does not exist; this server serves {s.model!r}", "model",
                       code="model_not_found")
    body.check_unsupported()
    if body.n > s.engine.engine_config.max_num_seqs:
        raise ApiError(400, f"n={body.n} exceeds the server's max_num_seqs={s.engine.engine_config.max_num_seqs}",
                       "n")


def _prompt_list(prompt) -> list:
    """OpenAI's prompt forms: a str, a list of str, a list of token ids, a list of token-id lists."""
    if isinstance(prompt, str):
        return [prompt]
    if not prompt:
        raise ApiError(400, "prompt must not be empty", "prompt")
    return [prompt] if isinstance(prompt[0], int) else list(prompt)


def _tokenize(s: ServerState, prompt, field: str) -> list[int]:
    try:  # the tokenizer and vocabulary only: no engine state is read
        return s.engine.tokenize(prompt, field)
    except (TypeError, ValueError) as e:
        raise ApiError(400, str(e), field) from None


def _max_tokens(s: ServerState, prompt_len: int, requested: int | None, field: str) -> int:
    """``requested`` checked against the context left after the prompt (None: all of it), as vLLM does."""
    limit = s.engine.max_model_len
    if prompt_len == 0:
        raise ApiError(400, f"{field} is empty", field)
    if prompt_len >= limit:
        raise ApiError(400, f"{field} has {prompt_len} tokens; this model's maximum context length is {limit} "
                            "tokens, which leaves no room for the completion", field)
    if requested is None:
        return limit - prompt_len
    if requested < 1:
        raise ApiError(400, f"max_tokens must be >= 1, got {requested}", "max_tokens")
    if prompt_len + requested > limit:
        raise ApiError(400, f"this model's maximum context length is {limit} tokens, but {prompt_len} in the "
                            f"{field} + max_tokens={requested} asks for {prompt_len + requested}", "max_tokens")
    return requested


async def _collect(gen: Generation, request: Request):
    gen.watch(request.receive)
    try:
        await gen.start()
        return await gen.result()
    finally:
        gen.close()


async def _stream(gen: Generation, request: Request, head: list[dict], chunks_of, usage_chunk):
    """Queues ``gen`` (a rejection is still a plain 400) and streams ``head``, then ``chunks_of(delta)`` for
    each delta, then ``usage_chunk()`` (unless it is falsy), as server-sent events."""
    gen.watch(request.receive)
    await gen.start()

    async def events():
        try:
            for chunk in head:
                yield responses.sse(chunk)
            async for d in gen.deltas():
                for chunk in chunks_of(d):
                    yield responses.sse(chunk)
            if usage_chunk:
                yield responses.sse(usage_chunk())
        except ApiError as e:  # the status line is gone: the error is the stream's last event
            yield responses.sse(e.body())
        finally:
            gen.close()
        yield responses.sse("[DONE]")

    return StreamingResponse(events(), media_type="text/event-stream")


# ---- errors -------------------------------------------------------------------------------------------

async def _api_error(_request: Request, e: ApiError):
    return JSONResponse(e.body(), status_code=e.status)


async def _schema_error(_request: Request, e: RequestValidationError):
    errors = e.errors()
    where = [".".join(str(p) for p in err.get("loc", ()) if p != "body") for err in errors]
    message = "; ".join(f"{w or 'body'}: {err.get('msg')}" for w, err in zip(where, errors))
    return JSONResponse(error_body(message, "invalid_request_error", where[0] if where else None), status_code=422)


async def _http_error(_request: Request, e: HTTPException):
    return JSONResponse(error_body(str(e.detail), "invalid_request_error"), status_code=e.status_code)
