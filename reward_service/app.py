"""The HTTP API (FastAPI): enqueue, pull, ping, health. Thin: parsing is wire_format.py, Redis is broker.py.

Answers (docs/reward-service.md, "Wire format" and "Reliability model"):
    POST /api/reward/enqueue   200 {"uuid"} | 401 token | 409 request id reused with another body | 413 too large
                               | 422 malformed or unknown reward | 429 queue full | 503 Redis unreachable or
                               a requested reward has no live worker (`no_worker` lists them)
    POST /api/reward/pull      form uuid, type (+ optional wait, seconds): 200 result | 400 {"status": "pending"}
                               | 404 unknown | 500 {"status": "failed", "error"} | 401 | 422 bad form | 503
                               | 502 {"status": "refused"}: the stored result fails its signature check
    POST /api/reward/ping      form info_data (optional): 200 {"message": "Ping request received"} | 401
    GET  /health               200 ok / 503 degraded or unavailable; details (workers) only with the token
The token is compared in constant time (`hmac.compare_digest` of SHA-256 digests) before any body is read.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import math
import urllib.parse
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import redis.asyncio as aioredis
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from redis.exceptions import RedisError
from starlette.concurrency import run_in_threadpool
from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Receive, Scope, Send

from reward_service.broker import (
    PENDING_STATUS,
    REFUSED_STATUS,
    AsyncBroker,
    QueueFull,
    RequestIdConflict,
)
from reward_service.config import REWARD_NAME, ServiceConfig
from reward_service.keys import Keys
from reward_service.signing import BodyDigests, result_key
from reward_service.wire_format import REQUEST_ID, EnqueueRequest, PayloadError, parse_enqueue

if TYPE_CHECKING:
    from reward_service.inline import InlineBroker

FORM_LIMIT = 64 * 1024
"""Largest pull / ping form body."""
FORM_FIELDS = 16
"""Most fields a pull / ping form may have."""
THREAD_PARSE_BYTES = 8 * 1024 * 1024
"""Bodies above this size are parsed and hashed off the event loop. Parsing reads only the npy header; hashing
the pixels (once, for the task signature and the request id's digest) runs at ~1 GB/s, so smaller bodies cost less
than the hop to a thread (measured: a 300 KB body took ~0.3 ms inline and 2-7 ms through the thread pool on a loaded
machine)."""


class Refusal(Exception):
    """An error answer: HTTP status, JSON body, extra headers."""

    def __init__(self, status: int, error: str, headers: dict[str, str] | None = None, **extra: Any) -> None:
        super().__init__(error)
        self.status, self.headers = status, headers or {}
        self.body = {"status": "error", "error": error, **extra}


def _digest(text: str | bytes) -> bytes:
    return hashlib.sha256(text.encode() if isinstance(text, str) else text).digest()


@dataclass(frozen=True)
class Settings:
    """What the endpoints need besides Redis: the config, the token's digest, the enabled reward names."""

    config: ServiceConfig
    token_digest: bytes
    enabled: tuple[str, ...]

    def authorized(self, request: Request) -> bool:
        scheme, _, value = request.headers.get("authorization", "").partition(" ")
        return hmac.compare_digest(_digest(value.strip()), self.token_digest) and scheme.lower() == "bearer"

    def authorize(self, request: Request) -> None:
        """Raise a 401 Refusal unless the request carries the bearer token."""
        if not self.authorized(request):
            raise Refusal(
                401,
                "missing or wrong bearer token: send `Authorization: Bearer <token>` with the service's token "
                "(the trainer reads it from REMOTE_REWARD_TOKEN).",
                headers={"WWW-Authenticate": "Bearer"},
            )


@contextlib.asynccontextmanager
async def _inline(app: FastAPI, scorer: InlineBroker) -> AsyncIterator[None]:
    """`workers.inline`: score on `scorer`'s thread while the app serves."""
    scorer.start(asyncio.get_running_loop())
    app.state.broker = scorer
    try:
        yield
    finally:
        scorer.stop()


def create_app(
    config: ServiceConfig, *, token: str, redis_url: str, scorer: InlineBroker | None = None
) -> FastAPI:
    """The service's FastAPI app for `config`, checking `token`, keeping its state in the Redis at `redis_url`;
    with `workers.inline`, in this process instead: `scorer` (`reward_service.inline.inline_broker(config)`, its
    models loaded) scores, `redis_url` is unused."""
    if config.workers.inline and scorer is None:
        raise ValueError("workers.inline: pass the scorer, reward_service.inline.inline_broker(config)")

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if config.workers.inline:
            async with _inline(app, scorer):
                yield
            return
        client = aioredis.Redis.from_url(redis_url, socket_timeout=30, socket_connect_timeout=5)
        broker = AsyncBroker(
            client, Keys(config.redis_prefix), config.limits, config.workers, key=result_key(token)
        )
        app.state.broker = broker
        listener = asyncio.create_task(broker.listen())
        try:
            yield
        finally:
            listener.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await listener
            await client.aclose()

    app = FastAPI(  # no /docs, /redoc, /openapi.json: nothing answers without the token but /health
        title="sanarl reward service", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None
    )
    enabled = tuple(entry.reward_type for entry in config.enabled_rewards())
    app.state.settings = Settings(config, _digest(token), enabled)
    app.add_route("/api/reward/enqueue", enqueue, methods=["POST"])
    app.add_route("/api/reward/pull", pull, methods=["POST"])
    app.add_route("/api/reward/ping", ping, methods=["POST"])
    app.add_route("/health", health, methods=["GET"])
    _install_handlers(app)
    return app


HOT_PATHS = ("/api/reward/enqueue", "/api/reward/pull")
"""The two endpoints every scored request takes; `serve_hot_paths` calls them without the app's middleware."""


def serve_hot_paths(app: FastAPI) -> ASGIApp:
    """The ASGI application uvicorn serves: POSTs to the `HOT_PATHS` go straight to their endpoint (the same
    function, the same exception handlers of `app`), everything else (the other routes, lifespan, 404 / 405)
    to `app`. FastAPI's and Starlette's middleware and routing cost about 0.2 ms per exchange on the development
    VM (docs/results.md, "Reward service"), and a scored request makes two."""
    endpoints = {
        path: route.endpoint for route in app.routes if (path := getattr(route, "path", "")) in HOT_PATHS
    }

    async def serve(scope: Scope, receive: Receive, send: Send) -> None:
        endpoint = endpoints.get(scope["path"]) if scope["type"] == "http" else None
        if endpoint is None or scope["method"] != "POST":
            await app(scope, receive, send)
            return
        scope["app"] = app  # what Starlette sets: `request.app` reads it
        request = Request(scope, receive, send)
        try:
            response = await endpoint(request)
        except Exception as exc:
            handler = next(
                (app.exception_handlers[t] for t in type(exc).__mro__ if t in app.exception_handlers), None
            )
            if handler is None:
                raise  # uvicorn logs it and answers 500, as the app's error middleware does
            response = await handler(request, exc)
        await response(scope, receive, send)

    return serve


async def enqueue(request: Request) -> Response:
    """Authorize, read the body under the size limit, parse it (off the loop when large), queue it."""
    settings: Settings = request.app.state.settings
    settings.authorize(request)
    limits = settings.config.limits
    body = await _read_body(request, limits.max_payload_bytes)
    broker: AsyncBroker | InlineBroker = request.app.state.broker
    known = set(settings.enabled) | await broker.served_rewards()

    def parse(hash_now: bool) -> tuple[EnqueueRequest, BodyDigests]:
        parsed = parse_enqueue(
            body, max_images=limits.max_images, max_json_bytes=limits.max_json_bytes, known_rewards=known
        )
        digests = BodyDigests(body, parsed.npy, parsed.request_id)  # one pass over the pixels, when needed
        if hash_now:  # both digests here, off the event loop (`request` reuses `pixels`)
            digests.pixels  # noqa: B018
            digests.request  # noqa: B018
        return parsed, digests

    large = len(body) > THREAD_PARSE_BYTES
    parsed, digests = await run_in_threadpool(parse, True) if large else parse(False)
    missing = await broker.without_worker(list(parsed.rewards))
    if missing:
        raise Refusal(
            503,
            f"no live worker hosts reward(s) {missing}, so nothing would score this request; it was not queued. "
            "Workers may still be loading (retry shortly) or have died: see GET /health and the service log.",
            headers={"Retry-After": "1"},
            no_worker=missing,
        )
    return JSONResponse({"uuid": await broker.enqueue(parsed, digests)})


async def pull(request: Request) -> Response:
    """The task's answer, waiting up to the form's `wait` seconds while it is pending."""
    request.app.state.settings.authorize(request)
    task_uuid, reward, wait = _pull_fields(await _read_form(request))
    answer = await request.app.state.broker.pull(task_uuid, reward, wait)
    headers = {"Retry-After": "1"} if answer.status in (PENDING_STATUS, REFUSED_STATUS) else None
    return JSONResponse(answer.body, status_code=answer.status, headers=headers)


async def ping(request: Request) -> Response:
    """Cosmos-RL's connectivity check (form `info_data`, ignored)."""
    request.app.state.settings.authorize(request)
    await _read_form(request)
    return JSONResponse({"message": "Ping request received"})


async def health(request: Request) -> Response:
    """Redis reachable, live workers per reward, queue depth, latency; worker details only with the token."""
    settings: Settings = request.app.state.settings
    try:
        figures = await request.app.state.broker.figures(list(settings.enabled))
    except RedisError as exc:  # its text names the Redis address: only for holders of the token
        redis_state: dict[str, Any] = {"ok": False}
        if settings.authorized(request):
            redis_state["error"] = f"{type(exc).__name__}: {exc}"
        return JSONResponse({"status": "unavailable", "redis": redis_state}, 503)
    missing = [name for name in settings.enabled if figures["rewards"][name]["workers"] == 0]
    status = "degraded" if missing else "ok"
    # with workers.inline there is no Redis to report on
    store = {"inline": True} if settings.config.workers.inline else {"redis": {"ok": True}}
    body: dict[str, Any] = {"status": status, **store, "pending": figures["pending"]}
    body["rewards"] = figures["rewards"]
    if missing:
        body["no_worker"] = missing
    if settings.authorized(request):
        body["workers"] = figures["workers"]
    return JSONResponse(body, status_code=200 if status == "ok" else 503)


def _install_handlers(app: FastAPI) -> None:
    """Map refusals, payload errors, back-pressure and Redis outages to their answers."""

    @app.exception_handler(Refusal)
    async def refusal(request: Request, exc: Refusal) -> Response:
        return JSONResponse(exc.body, status_code=exc.status, headers=exc.headers)

    @app.exception_handler(PayloadError)
    async def payload(request: Request, exc: PayloadError) -> Response:
        return JSONResponse({"status": "error", "error": str(exc)}, status_code=exc.status)

    @app.exception_handler(QueueFull)
    async def full(request: Request, exc: QueueFull) -> Response:
        return JSONResponse(
            {"status": "error", "error": str(exc)}, status_code=429, headers={"Retry-After": "1"}
        )

    @app.exception_handler(RequestIdConflict)
    async def conflict(request: Request, exc: RequestIdConflict) -> Response:
        error = f"request_id was already used for uuid {exc} with a different body; use a fresh request_id."
        return JSONResponse({"status": "error", "error": error, "uuid": str(exc)}, status_code=409)

    @app.exception_handler(RedisError)
    async def unavailable(request: Request, exc: RedisError) -> Response:
        error = f"Redis is unreachable ({type(exc).__name__}: {exc}); retry shortly."
        return JSONResponse(
            {"status": "unavailable", "error": error}, status_code=503, headers={"Retry-After": "1"}
        )

    @app.exception_handler(ClientDisconnect)
    async def disconnected(request: Request, exc: ClientDisconnect) -> Response:
        return Response(status_code=400)  # nobody is listening; nothing was queued


def _declared_length(request: Request, limit: int) -> None:
    declared = request.headers.get("content-length")
    if declared is None:
        return
    if not declared.isdigit():
        raise Refusal(422, f"Content-Length {declared[:32]!r} is not a number.")
    if int(declared) > limit:
        raise Refusal(413, f"the body declares {int(declared)} bytes, more than the limit of {limit} bytes.")


async def _read_body(request: Request, limit: int, limit_name: str = "limits.max_payload_bytes") -> bytes:
    """The whole body, refusing (413) one that declares or turns out to be over `limit` bytes (`limit_name`)."""
    _declared_length(request, limit)
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise Refusal(413, f"the body is larger than {limit_name} = {limit} bytes.")
        chunks.append(chunk)
    return b"".join(chunks)


async def _read_form(request: Request) -> dict[str, str]:
    """A small urlencoded or multipart form as {field: text} (the last value of a repeated field). The urlencoded
    form clients send is parsed here (0.1 ms less per pull than Starlette's form parser on the development VM)."""
    media_type = request.headers.get("content-type", "").partition(";")[0].strip().lower()
    if media_type != "application/x-www-form-urlencoded":
        _declared_length(request, FORM_LIMIT)
        form = await request.form(max_files=0, max_fields=FORM_FIELDS)
        return {key: value for key, value in form.items() if isinstance(value, str)}
    body = await _read_body(request, FORM_LIMIT, "the form limit")
    try:  # as Starlette reads a form: bytes as latin-1, percent-escapes as UTF-8
        pairs = urllib.parse.parse_qsl(
            body.decode("latin-1"), keep_blank_values=True, max_num_fields=FORM_FIELDS
        )
    except ValueError:
        raise Refusal(422, f"the form has more than {FORM_FIELDS} fields.") from None
    return dict(pairs)


def _pull_fields(form: dict[str, str]) -> tuple[str, str, float]:
    task_uuid, reward, wait = form.get("uuid", ""), form.get("type", ""), form.get("wait", "0")
    if not REQUEST_ID.fullmatch(task_uuid):
        raise Refusal(422, "form field `uuid` is missing or malformed; send the uuid enqueue answered.")
    if not REWARD_NAME.fullmatch(reward):
        raise Refusal(422, "form field `type` is missing or malformed; send a reward name of the request.")
    try:
        seconds = float(wait)
    except ValueError:
        seconds = math.nan
    if not math.isfinite(seconds) or seconds < 0:
        raise Refusal(422, f"form field `wait` must be a number of seconds >= 0, got {wait[:32]!r}.")
    return task_uuid, reward, seconds
