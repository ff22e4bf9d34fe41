"""The HTTP face of rank 0: OpenAI-compatible completions, health, readiness, metrics, drain.

Routes: ``POST /v1/completions`` and ``POST /v1/chat/completions`` (plain JSON or, with
``stream: true``, server-sent events), ``GET /v1/models``, ``GET /health`` (the process is
alive: a liveness probe), ``GET /ready`` (weights bound, warm-up done, every rank alive, not
draining: a readiness probe) and ``GET /metrics`` (Prometheus text).

Every malformed request gets a 4xx with OpenAI's error body and changes nothing else. The
server listens before the weights are bound, so liveness answers during a long load while
readiness says no. On SIGTERM it stops listening, lets in-flight requests finish up to the drain
deadline, stops the ranks and returns 0.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Literal

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from .metrics import Metrics
from .scheduler import Event, Leader, Request, SamplingParams
from .tokenizer import Tokenizer

log = logging.getLogger("weightcache.engine.server")

MAX_BODY_BYTES = 4 * 2**20  # far above any prompt that fits a context; bounds what a client can make us buffer


@dataclass
class EngineState:
    """What the HTTP side knows about the engine; written by the start-up thread, read by handlers."""

    model_name: str
    max_model_len: int
    max_queue: int = 64
    leader: Leader | None = None
    tokenizer: Tokenizer | None = None
    ready: bool = False
    draining: bool = False
    failure: str | None = None
    ranks: list[dict[str, Any]] = field(default_factory=list)
    created: int = field(default_factory=lambda: int(time.time()))

    def not_ready_reason(self) -> str | None:
        if self.failure:
            return f"failed: {self.failure}"
        if self.draining:
            return "draining"
        if not self.ready:
            return "starting"
        return None


class APIError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        code: str | None = None,
        kind: str = "invalid_request_error",
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.kind = status, message, param, code, kind

    def response(self) -> web.Response:
        body = {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}
        return web.json_response(body, status=self.status)


class _Common(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    max_tokens: int | None = Field(default=None)
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    n: int = 1
    stream: bool = False
    stop: str | list[str] | None = None
    seed: int | None = None
    ignore_eos: bool = False
    return_token_ids: bool = False  # extension: the generated ids, for token-for-token comparisons

    @field_validator("n")
    @classmethod
    def _one_choice(cls, n: int) -> int:
        if n != 1:
            raise ValueError("only n=1 is supported")
        return n

    @field_validator("stop")
    @classmethod
    def _stops(cls, stop: str | list[str] | None) -> str | list[str] | None:
        stops = [stop] if isinstance(stop, str) else (stop or [])
        if len(stops) > 4 or any(not s for s in stops):
            raise ValueError("stop is at most 4 non-empty strings")
        return stop

    def sampling(self, max_tokens: int) -> SamplingParams:
        stops = (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())
        return SamplingParams(
            max_tokens=max_tokens,
            temperature=self.temperature,
            top_p=self.top_p,
            seed=self.seed,
            stop=stops,
            ignore_eos=self.ignore_eos,
        )


class CompletionBody(_Common):
    prompt: str | list[int] | list[str]
    echo: bool = False
    logprobs: int | None = None


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")
    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: str


class ChatBody(_Common):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = None


def build_app(state: EngineState, metrics: Metrics) -> web.Application:
    inflight: set[asyncio.Task[Any]] = set()

    @web.middleware
    async def observe(request: web.Request, handler: Any) -> web.StreamResponse:
        route = request.match_info.route.resource.canonical if request.match_info.route.resource else "unmatched"
        started = time.perf_counter()
        task = asyncio.current_task()
        if task is not None:
            inflight.add(task)
        status = 500
        try:
            response: web.StreamResponse = await handler(request)
            status = response.status
            return response
        except APIError as exc:
            status = exc.status
            return exc.response()
        except web.HTTPException as exc:
            status = exc.status
            raise
        finally:
            if task is not None:
                inflight.discard(task)
            metrics.inc("weightcache_engine_requests_total", route=route, method=request.method, code=status)
            metrics.observe("weightcache_engine_request_seconds", time.perf_counter() - started, route=route)

    app = web.Application(middlewares=[observe], client_max_size=MAX_BODY_BYTES)
    app["state"] = state
    app["inflight"] = inflight

    async def health(_: web.Request) -> web.Response:
        return web.json_response({"status": "ok", "ready": state.not_ready_reason() is None, "ranks": state.ranks})

    async def ready(_: web.Request) -> web.Response:
        reason = state.not_ready_reason()
        if reason is None:
            return web.json_response({"status": "ready"})
        return web.json_response({"status": "not ready", "reason": reason}, status=503)

    async def metrics_route(_: web.Request) -> web.Response:
        metrics.set("weightcache_engine_ready", 1.0 if state.not_ready_reason() is None else 0.0)
        metrics.set("weightcache_engine_active_requests", float(state.leader.pending if state.leader else 0))
        return web.Response(
            text=metrics.render(),
            content_type="text/plain",
            charset="utf-8",
            headers={"X-Content-Format": "prometheus-0.0.4"},
        )

    async def models(_: web.Request) -> web.Response:
        return web.json_response(
            {
                "object": "list",
                "data": [
                    {
                        "id": state.model_name,
                        "object": "model",
                        "created": state.created,
                        "owned_by": "weightcache",
                        "max_model_len": state.max_model_len,
                    }
                ],
            }
        )

    async def completions(request: web.Request) -> web.StreamResponse:
        body = await _parse(request, CompletionBody)
        if body.echo or body.logprobs is not None:
            raise APIError(
                400, "echo and logprobs are not supported by this engine", "echo" if body.echo else "logprobs"
            )
        prompt = body.prompt
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], str):
            if len(prompt) != 1:
                raise APIError(400, "only one prompt per request is supported", "prompt")
            prompt = prompt[0]
        return await _generate(request, body, prompt, chat=False)

    async def chat(request: web.Request) -> web.StreamResponse:
        body = await _parse(request, ChatBody)
        if body.max_tokens is None and body.max_completion_tokens is not None:
            body.max_tokens = body.max_completion_tokens
        tokenizer = _tokenizer()
        text = tokenizer.render_chat([m.model_dump() for m in body.messages])
        return await _generate(request, body, text, chat=True)

    def _tokenizer() -> Tokenizer:
        reason = state.not_ready_reason()
        if reason is not None or state.tokenizer is None or state.leader is None:
            raise APIError(503, f"the engine is not ready ({reason})", kind="service_unavailable", code="not_ready")
        return state.tokenizer

    async def _generate(request: web.Request, body: _Common, prompt: str | list[int], chat: bool) -> web.StreamResponse:
        tokenizer = _tokenizer()
        assert state.leader is not None
        if body.model is not None and body.model != state.model_name:
            raise APIError(
                404,
                f"the model {body.model!r} does not exist; this engine serves {state.model_name!r}",
                "model",
                "model_not_found",
            )
        if isinstance(prompt, list):
            if not prompt or any(not 0 <= t < tokenizer_vocab(state) for t in prompt):
                raise APIError(400, "token ids in prompt must be a non-empty list within the vocabulary", "prompt")
            ids = list(prompt)
        else:
            ids = tokenizer.encode(prompt)
            if not ids:
                raise APIError(400, "the prompt is empty", "prompt")
        limit = state.max_model_len
        if len(ids) >= limit:
            raise APIError(
                400,
                f"this model's maximum context length is {limit} tokens; the prompt has {len(ids)}, "
                "leaving no room to generate",
                "prompt",
                "context_length_exceeded",
            )
        max_tokens = body.max_tokens if body.max_tokens is not None else min(16, limit - len(ids))
        if not 1 <= max_tokens <= limit:
            raise APIError(400, f"max_tokens must be between 1 and {limit}, got {max_tokens}", "max_tokens")
        if len(ids) + max_tokens > limit:
            raise APIError(
                400,
                f"this model's maximum context length is {limit} tokens; the prompt has {len(ids)} "
                f"and max_tokens asks for {max_tokens} more",
                "prompt",
                "context_length_exceeded",
            )
        if state.leader.pending >= state.max_queue:
            raise APIError(
                429,
                f"{state.leader.pending} requests are queued; try again later",
                kind="rate_limit_error",
                code="overloaded",
            )

        loop = asyncio.get_running_loop()
        events: asyncio.Queue[Event] = asyncio.Queue()

        def sink(event: Event) -> None:
            loop.call_soon_threadsafe(events.put_nowait, event)

        work = Request(ids, body.sampling(max_tokens), sink)
        started = time.perf_counter()
        state.leader.submit(work)
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        created = int(time.time())

        async def stream_events() -> AsyncIterator[Event]:
            first = True
            while True:
                event = await events.get()
                if first and event.kind == "token":
                    metrics.observe("weightcache_engine_first_token_seconds", time.perf_counter() - started)
                    first = False
                yield event
                if event.kind != "token":
                    if event.kind == "done":
                        metrics.inc("weightcache_engine_prompt_tokens_total", event.prompt_tokens)
                        metrics.inc("weightcache_engine_generated_tokens_total", event.completion_tokens)
                    return

        try:
            if body.stream:
                return await _stream(request, stream_events(), rid, created, chat, body.return_token_ids)
            text, token_ids, finish, usage = "", [], None, {}
            async for event in stream_events():
                if event.kind == "error":
                    raise APIError(500, event.text, kind="server_error", code="engine_failed")
                if event.kind == "token":
                    text += event.text
                    assert event.token_id is not None
                    token_ids.append(event.token_id)
                else:
                    finish = event.finish_reason
                    usage = {
                        "prompt_tokens": event.prompt_tokens,
                        "completion_tokens": event.completion_tokens,
                        "total_tokens": event.prompt_tokens + event.completion_tokens,
                    }
        finally:
            work.cancelled = True  # a no-op once finished; stops generation if the client went away
        choice: dict[str, Any] = {"index": 0, "finish_reason": finish, "logprobs": None}
        if chat:
            choice["message"] = {"role": "assistant", "content": text}
        else:
            choice["text"] = text
        if body.return_token_ids:
            choice["token_ids"] = token_ids
        return web.json_response(
            {
                "id": rid,
                "object": "chat.completion" if chat else "text_completion",
                "created": created,
                "model": state.model_name,
                "choices": [choice],
                "usage": usage,
            }
        )

    async def _stream(
        request: web.Request, events: AsyncIterator[Event], rid: str, created: int, chat: bool, with_ids: bool
    ) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await response.prepare(request)
        kind = "chat.completion.chunk" if chat else "text_completion"

        async def send(choice: dict[str, Any], extra: dict[str, Any] | None = None) -> None:
            chunk = {
                "id": rid,
                "object": kind,
                "created": created,
                "model": state.model_name,
                "choices": [{"index": 0, **choice}],
                **(extra or {}),
            }
            await response.write(f"data: {json.dumps(chunk)}\n\n".encode())

        if chat:
            await send({"delta": {"role": "assistant", "content": ""}, "finish_reason": None})
        async for event in events:
            if event.kind == "error":
                payload = {
                    "error": {"message": event.text, "type": "server_error", "param": None, "code": "engine_failed"}
                }
                await response.write(f"data: {json.dumps(payload)}\n\n".encode())
                break
            if event.kind == "token":
                choice: dict[str, Any] = {"delta": {"content": event.text}} if chat else {"text": event.text}
                if with_ids:
                    choice["token_ids"] = [event.token_id]
                await send({**choice, "finish_reason": None})
            else:
                usage = {
                    "prompt_tokens": event.prompt_tokens,
                    "completion_tokens": event.completion_tokens,
                    "total_tokens": event.prompt_tokens + event.completion_tokens,
                }
                await send(
                    {"delta": {}, "finish_reason": event.finish_reason}
                    if chat
                    else {"text": "", "finish_reason": event.finish_reason},
                    {"usage": usage},
                )
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    app.router.add_get("/health", health)
    app.router.add_get("/ready", ready)
    app.router.add_get("/metrics", metrics_route)
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/completions", completions)
    app.router.add_post("/v1/chat/completions", chat)
    return app


def tokenizer_vocab(state: EngineState) -> int:
    assert state.leader is not None
    return state.leader.worker.model.cfg.vocab_size


async def _parse(request: web.Request, model: type[BaseModel]) -> Any:
    state: EngineState = request.app["state"]
    if state.draining:
        raise APIError(
            503, "the engine is draining and accepts no new requests", kind="service_unavailable", code="draining"
        )
    try:
        raw = await request.json(loads=json.loads)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise APIError(400, f"the request body is not valid JSON: {exc}", code="invalid_json") from None
    except web.HTTPRequestEntityTooLarge:
        raise APIError(413, f"the request body exceeds {MAX_BODY_BYTES} bytes", code="request_too_large") from None
    if not isinstance(raw, dict):
        raise APIError(400, "the request body must be a JSON object", code="invalid_json")
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        param = ".".join(str(p) for p in first["loc"]) or None
        missing = first["type"] == "missing"
        message = f"missing required field {param!r}" if missing else f"{param}: {first['msg']}"
        raise APIError(400, message, param, "missing_field" if missing else "invalid_value") from None
