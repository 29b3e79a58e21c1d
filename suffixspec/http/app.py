"""The Starlette application of `suffixspec serve`.

Contract of `create_app(state)` (`AppState`: the served names, the API key, the metrics, and, once the
model is loaded, the `EngineLoop` and the `protocol.ModelContext`):

* `GET /health` (never behind the key): 200 `{"status": "ok"}` once the model is loaded and the engine
  loop is alive, idle included; 503 with the reason while loading, after the engine thread died, while
  one step runs past the stall limit, and while draining.
* `GET /metrics`: the Prometheus text format. `GET /v1/models`: the served names.
* `POST /v1/completions`, `POST /v1/chat/completions`: the OpenAI shapes (`protocol`). Non-streaming
  answers one JSON object; `stream: true` answers server-sent events, `data: {chunk}` lines, one chunk
  per engine round that produced text (every token the round committed), a last chunk with the
  finish reason, then `data: [DONE]`. With `stream_options.include_usage` the usage comes in one more
  chunk with no choices, else in the last chunk. A request that fails inside the engine answers 500
  (in a stream: a `data: {"error": ...}` event); the others go on.
* A client that disconnects (while waiting or mid-stream) has its request cancelled at once: the
  engine drops it at its next step.
* With an API key, every path except `/health` needs `Authorization: Bearer KEY` (compared in
  constant time), else 401. Every error is an OpenAI-style error object, never a traceback.

The handlers are the methods of `Routes` (over the one `AppState`); a generation request, once
submitted, is an `Inflight` (its bookkeeping and cancellation) and, once accepted, an `Answer` (its
events turned into the response).
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import time

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ..errors import BadInputError
from . import protocol
from .answer import Answer, error_response
from .choices import ChoiceJob
from .engine_loop import EngineLoop, Handle
from .limits import ClientGone, Limits, read_json
from .metrics import CONTENT_TYPE, Metrics
from .protocol import APIError, ModelContext
from .responses import ResponseStream, response_object, to_chat

__all__ = ["AppState", "create_app"]

log = logging.getLogger(__name__)


class AppState:
    """What the routes share. `engine` and `ctx` stay None until the model is loaded."""

    def __init__(self, names: list[str], api_key: str | None = None, metrics: Metrics | None = None,
                 limits: Limits | None = None):
        self.names = list(names)
        self.limits = limits or Limits()
        self.api_key = api_key.encode() if api_key else None
        self.metrics = metrics or Metrics()
        self.engine: EngineLoop | None = None
        self.ctx: ModelContext | None = None
        self.load_error: str | None = None  # why loading failed, a whole sentence
        self.inflight = 0  # generation responses not yet complete
        self.created = int(time.time())

    @property
    def draining(self) -> bool:
        return self.engine is not None and self.engine.draining

    def ready(self) -> tuple[EngineLoop, ModelContext]:
        if self.load_error is not None:
            raise APIError(503, self.load_error, code="load_failed")
        if self.engine is None or self.ctx is None:
            raise APIError(503, "the model is loading; retry shortly", code="loading",
                           headers={"Retry-After": "2"})
        ok, reason = self.engine.health()
        if not ok:
            raise APIError(503, f"the server cannot take requests: {reason}", code="unavailable")
        return self.engine, self.ctx


class AuthMiddleware:
    """Bearer-token check of every HTTP path but /health (pure ASGI)."""

    def __init__(self, app, state: AppState):
        self.app = app
        self.state = state

    async def __call__(self, scope, receive, send):
        key = self.state.api_key
        if scope["type"] == "http" and key is not None and scope.get("path") != "/health":
            header = b""
            for name, value in scope.get("headers", ()):
                if name == b"authorization":
                    header = value
                    break
            scheme, _, token = header.partition(b" ")
            if not (scheme.lower() == b"bearer" and hmac.compare_digest(token.strip(), key)):
                err = APIError(401, "missing or wrong API key: send the header 'Authorization: Bearer KEY'",
                               code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})
                self.state.metrics.http_request(scope.get("path", ""), 401)
                await error_response(err)(scope, receive, send)
                return
        await self.app(scope, receive, send)


class EventStream:
    """A server-sent-events response over an async iterator of byte chunks; `on_close` runs at the end
    whatever happens (the client gone included)."""

    def __init__(self, chunks, on_close):
        self.chunks = chunks
        self.on_close = on_close

    async def __call__(self, scope, receive, send):
        try:
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-type", b"text/event-stream; charset=utf-8"),
                                    (b"cache-control", b"no-cache"), (b"x-accel-buffering", b"no")]})
            async for chunk in self.chunks:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            self.on_close()


def create_app(state: AppState) -> Starlette:
    routes = Routes(state)
    app = Starlette(routes=[
        Route("/health", routes.health, methods=["GET"]),
        Route("/metrics", routes.metrics_text, methods=["GET"]),
        Route("/v1/models", routes.models, methods=["GET"]),
        Route("/v1/models/{model_id:path}", routes.model, methods=["GET"]),
        Route("/v1/completions", routes.completions, methods=["POST"]),
        Route("/v1/chat/completions", routes.chat_completions, methods=["POST"]),
        Route("/v1/responses", routes.responses, methods=["POST"]),
    ], exception_handlers={HTTPException: http_error, Exception: server_error})
    app.add_middleware(AuthMiddleware, state=state)
    return app


class Routes:
    """The handlers of `create_app`'s routes, over one `AppState`."""

    def __init__(self, state: AppState):
        self.state = state
        self.metrics = state.metrics

    async def health(self, request: Request) -> Response:
        state = self.state
        if state.load_error is not None:
            return JSONResponse({"status": state.load_error}, status_code=503)
        if state.engine is None:
            return JSONResponse({"status": "loading"}, status_code=503)
        ok, reason = state.engine.health()
        return JSONResponse({"status": reason}, status_code=200 if ok else 503)

    async def metrics_text(self, request: Request) -> Response:
        return Response(self.metrics.render(), media_type=CONTENT_TYPE)

    def _card(self, name: str) -> dict:
        state = self.state
        max_len = state.ctx.max_positions if state.ctx is not None else None
        return {"id": name, "object": "model", "created": state.created, "owned_by": "suffixspec",
                "max_model_len": max_len}

    async def models(self, request: Request) -> Response:
        self.metrics.http_request("/v1/models", 200)
        return JSONResponse({"object": "list", "data": [self._card(name) for name in self.state.names]})

    async def model(self, request: Request) -> Response:
        name = request.path_params["model_id"]
        if name not in self.state.names:
            self.metrics.http_request("/v1/models/{id}", 404)
            return error_response(APIError(404, f"model {name!r} is not served here (served: "
                                                f"{', '.join(self.state.names)})", param="model",
                                           code="model_not_found"))
        self.metrics.http_request("/v1/models/{id}", 200)
        return JSONResponse(self._card(name))

    async def completions(self, request: Request) -> Response:
        return await self.generate(request, "completion")

    async def chat_completions(self, request: Request) -> Response:
        return await self.generate(request, "chat")

    async def responses(self, request: Request) -> Response:
        return await self.generate(request, "chat", responses=True)

    async def generate(self, request: Request, kind: str, responses: bool = False) -> Response:
        path = request.url.path
        try:
            engine, ctx, req, handles, sink, body = await self._submit(request, kind, responses)
        except APIError as err:
            self.metrics.http_request(path, err.status)
            return error_response(err)
        except ClientGone as gone:
            log.info("%s: %s", path, gone)
            self.metrics.http_request(path, 499)
            return Response(status_code=499)  # nobody reads it: the connection is gone
        except Exception:  # noqa: BLE001 - a bug must still answer with an error object
            log.exception("request handling failed")
            self.metrics.http_request(path, 500)
            return error_response(APIError(500, "internal error; the server's log has the details"))
        inflight = Inflight(self.state, engine, handles, request)
        try:
            for handle in handles:
                await handle.wait_accepted()
        except APIError as err:
            inflight.close()
            self.metrics.http_request(path, err.status)
            return error_response(err)
        except BaseException:
            inflight.close()
            raise
        answer = Answer(req, handles, sink, ctx, path, self.metrics, aborted=lambda: engine.aborted)
        if req.stream:
            self.metrics.http_request(path, 200)
            chunks = ResponseStream(answer, body).events() if responses else answer.chunks()
            return EventStream(chunks, inflight.close)
        try:
            if not responses:
                return await answer.collect()
            try:
                chat = await answer.whole()
            except APIError as err:
                self.metrics.http_request(path, err.status)
                return error_response(err)
            self.metrics.http_request(path, 200)
            return JSONResponse(response_object(chat, body))
        finally:
            inflight.close()

    async def _submit(self, request: Request, kind: str, responses: bool = False):
        """Read, check and submit one request: one engine request per prompt and sample (`APIError`
        when the server or the request refuses it; what was submitted of it is then cancelled).
        `responses`: a Responses API body, checked as the chat request it becomes."""
        engine, ctx = self.state.ready()
        engine.expect()  # an idle engine waits for this request before it steps (a burst: one prefill)
        handles: list[Handle] = []
        try:
            body = await read_json(request, self.state.limits)
            try:
                chat = to_chat(body) if responses else body
            except BadInputError as exc:
                raise protocol.bad(str(exc), exc.param) from None
            req = protocol.parse_request(chat, kind, ctx)
            sink: asyncio.Queue = asyncio.Queue()
            scored = req.logprobs if req.echo and req.logprobs is not None else None
            for p, prompt in enumerate(req.prompts):
                first = None
                for sample in range(req.best_of):
                    job = ChoiceJob(len(handles), p, sample, prompt)
                    handle = Handle(req, job=job, sink=sink, first=first,
                                    score_prompt=scored if sample == 0 else None)
                    first = first or handle
                    engine.submit(handle)
                    handles.append(handle)
        except BaseException:
            for handle in handles:
                engine.cancel(handle)
            raise
        finally:
            engine.arrived()
        return engine, ctx, req, handles, sink, body


class Inflight:
    """A submitted request's bookkeeping: counted in `state.inflight`, cancelled when its client
    disconnects; `close()` (any number of times) ends both and cancels what still runs of it."""

    def __init__(self, state: AppState, engine: EngineLoop, handles: list[Handle], request: Request):
        self.state, self.engine, self.handles = state, engine, handles
        self.closed = False
        state.inflight += 1
        self.watcher = asyncio.ensure_future(_watch_disconnect(request, engine, handles))

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.state.inflight -= 1
            self.watcher.cancel()
            for handle in self.handles:
                self.engine.cancel(handle)  # a no-op once it finished


async def _watch_disconnect(request: Request, engine: EngineLoop, handles: list[Handle]) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            for handle in handles:
                engine.cancel(handle)
            return


async def http_error(request: Request, exc: HTTPException) -> Response:
    err = APIError(exc.status_code, f"{request.method} {request.url.path}: {exc.detail}",
                   code="not_found" if exc.status_code == 404 else None)
    return error_response(err)


async def server_error(request: Request, exc: Exception) -> Response:
    log.exception("unhandled error", exc_info=exc)
    return error_response(APIError(500, "internal error; the server's log has the details"))
