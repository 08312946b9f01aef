"""The FastAPI application: `/v1/completions`, `/v1/chat/completions` (streamed or whole), `/v1/models`,
`/health`, `/metrics`. A handler checks the key, parses and checks the body (every problem a 400 before anything
is queued), submits the choices to the engine (`state.loop`, an EngineClient; 503 beyond the queue bound) and
answers from their deltas; a client that leaves, or a handler cancelled at the end of a shutdown's grace period,
aborts its requests, so nothing a client does can leave pages held. Nothing here touches the engine but through
that client, whichever process the engine runs in."""

from __future__ import annotations

import asyncio
import hmac
import json
import os
import time
import traceback
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel, ValidationError

from xrt.config import SamplingArgs, ServeArgs, XrtConfig
from xrt.engine.admission import Admission
from xrt.engine.outputs import RequestOutput
from xrt.engine.tokenizer import Tokenizer
from xrt.log import get_logger
from xrt.serve.arrival import ARRIVAL
from xrt.serve.client import EngineClient, EngineFailed
from xrt.serve.errors import APIError, error_body
from xrt.serve.front import Front
from xrt.serve.gc_heap import freeze_heap, unfreeze_heap
from xrt.serve.jobs import Job
from xrt.serve.metrics import Metrics, openai_finish_reason
from xrt.serve.prepare import Prepared, SamplingCache, prepare_chat, prepare_completion
from xrt.serve.protocol import ChatCompletionRequest, CompletionRequest
from xrt.serve.responses import DONE, Shapes, event
from xrt.serve.sse import EventStream

log = get_logger(__name__)


@dataclass
class ServerState:
    args: ServeArgs
    model_name: str
    sampling: SamplingArgs  # the defaults of what a request leaves out (cfg.sampling)
    metrics: Metrics
    loop: EngineClient
    draining: bool = False  # SIGTERM came: new requests get 503 while the ones in flight finish
    started: int = field(default_factory=lambda: int(time.time()))
    samplings: SamplingCache = field(init=False)  # a request's sampling over `sampling`
    frozen_objects: int = 0  # how many this process froze once started (serve.freeze_gc)

    def __post_init__(self) -> None:
        self.samplings = SamplingCache(self.sampling)

    @property
    def admission(self) -> Admission:
        return self.loop.admission

    def close(self) -> None:
        """Stops the engine (idempotent: the server's lifespan stops it too)."""
        self.loop.close()


def build_state(cfg: XrtConfig, tokenizer: Tokenizer | None = None) -> ServerState:
    """Starts the engine, in a process of its own or on a thread (serve.engine_process), with its model loaded;
    ValueError or OSError with one line for a model or config that cannot load. The caller closes it.
    tokenizer: one to use instead of the checkpoint's (dummy weights have none)."""
    args = cfg.serve
    name = args.served_model_name or cfg.model.name
    metrics = Metrics(name)
    max_live = cfg.scheduler.max_num_seqs + args.max_queued
    loop: EngineClient
    if args.engine_process:
        from xrt.serve.in_process import start_process

        loop = start_process(cfg, tokenizer, metrics, max_live)
    else:
        from xrt.engine.llm import LLM
        from xrt.serve.in_thread import ThreadEngine

        loop = ThreadEngine(LLM(cfg, tokenizer=tokenizer), metrics, max_live)
    return ServerState(args, name, cfg.sampling, metrics, loop)


def build_app(state: ServerState) -> Front:
    """The ASGI application: FastAPI's, its generation endpoints reached through `Front`."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await state.loop.start()
        if state.args.freeze_gc:  # everything is up (the engine too, when it runs on a thread): serving starts
            state.frozen_objects = freeze_heap()
        yield
        await state.loop.shutdown()  # after uvicorn's grace period: aborts whatever is left
        if state.args.freeze_gc:
            unfreeze_heap()

    app = FastAPI(lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)

    @app.exception_handler(APIError)
    async def api_error(request: Request, e: APIError) -> JSONResponse:
        return JSONResponse(e.body(), status_code=e.status)

    @app.exception_handler(404)
    @app.exception_handler(405)
    async def no_route(request: Request, e: Exception) -> JSONResponse:
        status = getattr(e, "status_code", 404)
        return JSONResponse(error_body(status, f"{request.method} {request.url.path}: {getattr(e, 'detail', '')}"),
                            status_code=status)

    @app.get("/health")
    async def health() -> Response:
        if state.loop.error is not None or not state.loop.running or state.draining:
            why = "the server is shutting down" if state.loop.error is None else f"engine error: {state.loop.error}"
            return JSONResponse(error_body(503, why), status_code=503)
        return Response(status_code=200)

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(generate_latest(state.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models")
    async def models(request: Request) -> dict[str, Any]:
        _auth(state, request)
        card = {"id": state.model_name, "object": "model", "created": state.started, "owned_by": "xrt",
                "max_model_len": state.admission.max_model_len}
        return {"object": "list", "data": [card]}

    async def completions(request: Request) -> Response:
        return await _guarded(state, request, CompletionRequest, prepare_completion, chat=False)

    async def chat_completions(request: Request) -> Response:
        return await _guarded(state, request, ChatCompletionRequest, prepare_chat, chat=True)

    generation = {("POST", "/v1/completions"): completions, ("POST", "/v1/chat/completions"): chat_completions}
    # Routed by `Front` at the server's root; registered here as well for a server mounted under a root_path, and so
    # that another method on these paths gets FastAPI's 405. Starlette's plain routes, not FastAPI's: the handlers
    # read the Request themselves, and FastAPI's per-request dependency solving would only be time inside every TTFT.
    for (method, path), handler in generation.items():
        app.add_route(path, handler, methods=[method])

    return Front(app, generation)


async def _guarded(state: ServerState, request: Request, model: type[BaseModel], prepare: Callable[..., Prepared],
                   chat: bool) -> Response:
    """APIError is the client's; anything else is a bug: one line in the log (XRT_DEBUG=1: the traceback), a 500."""
    try:
        return await _generate(state, request, model, prepare, chat)
    except APIError:
        raise
    except Exception as e:  # noqa: BLE001
        if type(e).__name__ == "ClientDisconnect":  # starlette's: the client left while sending its body
            return Response(status_code=499)
        if os.environ.get("XRT_DEBUG", "") not in ("", "0"):
            traceback.print_exc()
        log.error(f"{request.url.path}: {type(e).__name__}: {e}")
        raise APIError(500, f"internal error: {type(e).__name__}: {e}") from None


async def _generate(state: ServerState, request: Request, model: type[BaseModel], prepare: Callable[..., Prepared],
                    chat: bool) -> Response:
    received = request.scope.get(ARRIVAL) or time.perf_counter()
    _auth(state, request)
    if state.draining:
        raise APIError(503, "the server is shutting down")
    body: Any = await _body(request, model)
    if body.model is not None and body.model != state.model_name:
        raise APIError(404, f"The model `{body.model}` does not exist; this server serves `{state.model_name}`",
                       "model", "model_not_found")
    prepared = prepare(body, state.admission, state.samplings)
    job = state.loop.submit(prepared.requests, received, stream=prepared.stream)
    shapes = Shapes(chat, state.model_name, prepared.include_usage, state.admission.tokenizer)
    if prepared.stream:
        sent = Sent(state.metrics, job)
        return EventStream(_events(job, shapes, prepared, sent), lambda: state.loop.abort(job), sent)
    collect = asyncio.ensure_future(_collect(job))
    gone = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({collect, gone}, return_when=asyncio.FIRST_COMPLETED)
        if not collect.done():  # the client left: nobody reads the answer
            return Response(status_code=499)
        return JSONResponse(shapes.whole(collect.result(), prepared.n))
    finally:
        gone.cancel()
        collect.cancel()
        state.loop.abort(job)  # a no-op once every choice finished


def _auth(state: ServerState, request: Request) -> None:
    key = state.args.api_key
    if not key:
        return
    given = request.headers.get("authorization", "")
    if not given:
        raise APIError(401, "no API key: send `Authorization: Bearer <key>`", code="invalid_api_key")
    if not hmac.compare_digest(given.encode(), f"Bearer {key}".encode()):
        raise APIError(401, "Incorrect API key provided", code="invalid_api_key")


async def _body(request: Request, model: type[BaseModel]) -> BaseModel:
    raw = await request.body()
    try:
        # pydantic's own JSON parser in one pass; a body it refuses is read again below for the problem's words.
        return model.model_validate_json(raw)
    except ValidationError:
        pass
    try:
        data = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise APIError(400, f"the body is not valid JSON: {e}") from None
    if not isinstance(data, dict):
        raise APIError(400, f"the body must be a JSON object, got {type(data).__name__}")
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise APIError(400, *_validation_message(e)) from None


def _validation_message(e: ValidationError) -> tuple[str, str]:
    """(one line, the top-level field) for pydantic's first problem. A value that fits none of a union's types
    gets one problem per type, each located under the type's name: those become one line listing the types."""
    errors = e.errors()
    first = errors[0]
    top = str(first["loc"][0]) if first["loc"] else ""
    union = [err for err in errors if err["loc"][:1] == first["loc"][:1] and len(err["loc"]) == 2
             and isinstance(err["loc"][1], str)]
    if len(union) > 1:
        given = json.dumps(first.get("input"))
        given = given if len(given) <= 40 else given[:37] + "..."
        return f"{top}: got {given}, expected one of {', '.join(str(err['loc'][1]) for err in union)}", top
    loc = ".".join(str(x) for x in first["loc"])
    more = f" (and {len(errors) - 1} more problems)" if len(errors) > 1 else ""
    return f"{loc}: {first['msg']}{more}", top


async def _collect(job: Job) -> list[RequestOutput]:
    outputs: list[RequestOutput | None] = [None] * len(job.choices)
    left = len(job.choices)
    while left:
        index, item = await job.queue.get()
        if isinstance(item, EngineFailed):
            raise item
        if item.output is not None:
            outputs[index] = item.output
            left -= 1
    return [o for o in outputs if o is not None]


class Sent:
    """The tokens of the chunk being written, timed (Metrics.delivered) once the write has returned: the moment the
    server has handed them to the connection."""

    def __init__(self, metrics: Metrics, job: Job) -> None:
        self.metrics = metrics
        self.job = job
        self.pending: list[tuple[int, int, bool]] = []  # (choice index, tokens, its last delta)

    def __call__(self) -> None:
        if self.pending:
            now = time.perf_counter()
            for index, num_tokens, last in self.pending:
                self.metrics.delivered(self.job.choices[index], num_tokens, last, now)
            self.pending.clear()


async def _events(job: Job, shapes: Shapes, prepared: Prepared, sent: Sent) -> AsyncIterator[str]:
    """The SSE events of a streamed request: each choice's text as it comes (a chat choice opens with its role), with
    the logprobs of its tokens when it asked, its finish reason on its last chunk, usage last when asked for
    (`stream_options.include_usage`), `[DONE]`. The deltas already waiting on the job's queue go out in one write,
    each still its own event: a stream that fell behind the engine (hundreds of streams on one event loop) catches up
    in one pass through the ASGI stack instead of one per step."""
    outputs: list[RequestOutput | None] = [None] * len(job.choices)
    opened: set[int] = set()
    left = len(job.choices)
    while left:
        batch = [await job.queue.get()]
        while not job.queue.empty():
            batch.append(job.queue.get_nowait())
        texts: list[str] = []
        for index, item in batch:
            if isinstance(item, EngineFailed):
                texts.append(event(error_body(500, f"engine error: {item}")))
                yield "".join(texts)
                return
            if shapes.chat and index not in opened:
                opened.add(index)
                texts.append(shapes.chunk(index, None, role=True))
            if item.output is None:
                # A chunk for every step's tokens, even when their text is held back (an incomplete UTF-8 sequence,
                # a possible stop string) or there is none (a checkpoint without a tokenizer): clients time tokens
                # by chunks, and a long silence would read as one late token.
                if item.token_ids or item.logprobs:
                    texts.append(shapes.chunk(index, item.text, logprobs=item.logprobs))
                    sent.pending.append((index, len(item.token_ids), False))
                continue
            left -= 1
            outputs[index] = item.output
            text = item.text or (None if shapes.chat and not item.logprobs else "")
            texts.append(shapes.chunk(index, text, openai_finish_reason(item.output.finish_reason),
                                      logprobs=item.logprobs))
            sent.pending.append((index, len(item.token_ids), True))
        if texts:
            yield "".join(texts)
    tail = [shapes.usage_chunk([o for o in outputs if o is not None], prepared.n)] if shapes.include_usage else []
    yield "".join([*tail, DONE])


async def _disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass
