"""kairos' LLM worker: an OpenAI-compatible HTTP server around one llama.cpp model in process.

    python -m kairos.serving.worker --model tiny.gguf --port 8200 --ctx 2048 --threads 1

Routes: `POST /v1/completions`, `POST /v1/chat/completions` (SSE when `stream`; usage in a final
chunk with empty `choices` when `stream_options.include_usage`; always in plain responses),
`GET /v1/models`, `POST /tokenize` (vLLM's shape: `{"prompt"|"messages"}` -> `{"count",
"tokens", "max_model_len"}`), `GET /health` (200 once the model is loaded, 503 before),
`GET /metrics` (Prometheus). Every completion carries `kairos_timings` (queue, prefill, TTFT,
decode, tokens/s, token counts).

Requests wait in a strict FIFO queue and run one at a time (see `kairos.serving.llamacpp`): one that
arrives during a stream waits for it rather than cutting it off. A client that disconnects
cancels its generation, or drops its place in the queue.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
import threading
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import orjson
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from kairos.serving.deploy import cores_argument
from kairos.serving.errors import EngineNotReady, LLMRequestError, UnknownLLM
from kairos.serving.llamacpp import EngineConfig, Finished, Job, LlamaCppEngine, Piece
from kairos.serving.metrics import WorkerMetrics
from kairos.serving.openai_request import (
    CompletionRequest,
    chat_request,
    completion_request,
    tokenize_request,
)
from kairos.serving.tools import ToolCallStream, ToolPlan
from kairos.telemetry import ServerSpans, from_environment


@dataclass(frozen=True, slots=True)
class WorkerConfig:
    engine: EngineConfig
    model_name: str
    host: str = "127.0.0.1"
    port: int = 8200
    parent_pid: int | None = None  # exit when this process goes away (a supervisor's child)
    graceful_s: float = 30.0  # on SIGTERM, how long in-flight requests may still run
    cpus: tuple[int, ...] = ()  # run every thread of the process on these cores; (): anywhere


class Worker:
    """The app's state: one engine, its metrics, and the name it is served under."""

    def __init__(self, config: WorkerConfig) -> None:
        self.config = config
        self.name = config.model_name
        self.metrics = WorkerMetrics(self.name)
        self.engine = LlamaCppEngine(config.engine, self.metrics)
        self.created = int(time.time())
        self.failed = asyncio.Event()
        from_environment()  # OTEL_* (a supervisor's workers inherit its environment)

    def app(self) -> Starlette:
        routes = [
            Route("/health", self.health, methods=["GET"]),
            Route("/metrics", self.prometheus, methods=["GET"]),
            Route("/v1/models", self.models, methods=["GET"]),
            Route("/tokenize", self.tokenize, methods=["POST"]),
            Route("/v1/completions", self.completions, methods=["POST"]),
            Route("/v1/chat/completions", self.chat_completions, methods=["POST"]),
        ]
        handlers = {HTTPException: _http_error}
        return Starlette(
            routes=routes,
            lifespan=self._lifespan,
            exception_handlers=handlers,
            middleware=[Middleware(ServerSpans)],  # continues the gateway's traceparent
        )

    @asynccontextmanager
    async def _lifespan(self, app: Starlette) -> AsyncIterator[None]:
        # listen at once (health says 503) and load in the background
        loading = asyncio.create_task(self._load())
        try:
            yield
        finally:
            loading.cancel()
            await asyncio.to_thread(self.engine.close)

    async def _load(self) -> None:
        try:
            await asyncio.to_thread(self.engine.load)
        except EngineNotReady as error:
            print(f"kairos-llm-worker: {error}", file=sys.stderr, flush=True)
            self.failed.set()
            return
        print(f"kairos-llm-worker: serving {self.name!r} on http://{self.config.host}:"
              f"{self.config.port}", flush=True)  # fmt: skip

    # -- routes ----------------------------------------------------------------------------

    async def health(self, request: Request) -> Response:
        if self.engine.loaded:
            return _json({"status": "ok", "model": self.name})
        detail = self.engine.load_error or "loading"
        return _json({"status": "unavailable", "detail": detail}, 503)

    async def prometheus(self, request: Request) -> Response:
        # `?name[]=...` (Prometheus' own filter) renders just those: the supervisor polls the
        # two queue gauges twice a second, and the whole text cost the worker ~2 ms each time
        names = request.query_params.getlist("name[]")
        registry = self.metrics.registry
        chosen = registry.restricted_registry(names) if names else registry
        return Response(generate_latest(chosen), media_type=CONTENT_TYPE_LATEST)

    async def models(self, request: Request) -> Response:
        if not self.engine.loaded:
            return _error(EngineNotReady(self.engine.load_error or "the model is still loading"))
        card = {
            "id": self.name,
            "object": "model",
            "created": self.created,
            "owned_by": "kairos",
            "max_model_len": self.engine.n_ctx,
        }
        return _json({"object": "list", "data": [card]})

    async def tokenize(self, request: Request) -> Response:
        try:
            model, prompt, messages = tokenize_request(await _body(request))
            self._check_model(model)
            if messages is not None:
                tokens = self.engine.chat_prompt(messages)
            else:
                tokens = self.engine.tokenize(prompt or "")
        except (LLMRequestError, EngineNotReady) as error:
            return _error(error)
        return _json({"count": len(tokens), "tokens": tokens, "max_model_len": self.engine.n_ctx})

    async def completions(self, request: Request) -> Response:
        return await self._complete(request, chat=False)

    async def chat_completions(self, request: Request) -> Response:
        return await self._complete(request, chat=True)

    # -- one completion --------------------------------------------------------------------

    async def _complete(self, request: Request, *, chat: bool) -> Response:
        try:
            body = await _body(request)
            parsed = chat_request(body) if chat else completion_request(body)
            self._check_model(parsed.model)
            job = self._submit(parsed)
        except (LLMRequestError, EngineNotReady) as error:
            return _error(error)
        watcher = asyncio.create_task(_cancel_on_disconnect(request, job))
        shape = _Shape(chat=chat, model=self.name, include_usage=parsed.include_usage,
                       tools=parsed.tools)  # fmt: skip
        if parsed.stream:
            return StreamingResponse(
                _sse(job, watcher, shape),
                media_type="text/event-stream",
                headers={"cache-control": "no-cache", "x-accel-buffering": "no"},
            )
        try:
            text: list[str] = []
            async for event in job.events():
                if isinstance(event, Piece):
                    text.append(event.text)
                else:
                    finished = event
        finally:
            job.cancel()
            watcher.cancel()
        if finished.error:
            return _json({"error": {"message": finished.error, "type": "server_error",
                                    "param": None, "code": "engine_failed"}}, 500)  # fmt: skip
        return _json(shape.whole("".join(text), finished))

    def _submit(self, parsed: CompletionRequest) -> Job:
        engine, sampling = self.engine, parsed.sampling
        if parsed.messages is not None:
            messages = list(parsed.messages)
            if parsed.tools is not None:
                messages = parsed.tools.render(messages)
            prompt, field_name = engine.chat_prompt(messages), "messages"
        elif isinstance(parsed.prompt, tuple):
            prompt, field_name = list(parsed.prompt), "prompt"
            bad = [t for t in prompt if not 0 <= t < engine.n_vocab]
            if bad:
                raise LLMRequestError(
                    f"prompt token {bad[0]} is not in this model's vocabulary "
                    f"(0..{engine.n_vocab - 1})",
                    param="prompt",
                )
        else:
            prompt, field_name = engine.tokenize(parsed.prompt or ""), "prompt"
        max_tokens = engine.fit(prompt, sampling.max_tokens, field_name)
        return engine.submit(prompt, replace(sampling, max_tokens=max_tokens))

    def _check_model(self, model: str | None) -> None:
        if model is not None and model != self.name:
            raise UnknownLLM(
                f"model {model!r} is not served here; this worker serves {self.name!r}",
                param="model",
            )


@dataclass(frozen=True, slots=True)
class _Shape:
    """OpenAI's response and chunk shapes for a completion or a chat completion."""

    chat: bool
    model: str
    include_usage: bool
    tools: ToolPlan | None = None
    id: str = ""
    created: int = 0

    def __post_init__(self) -> None:
        prefix = "chatcmpl-" if self.chat else "cmpl-"
        object.__setattr__(self, "id", prefix + uuid.uuid4().hex[:24])
        object.__setattr__(self, "created", int(time.time()))

    def _head(self, kind: str) -> dict[str, Any]:
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model}

    def whole(self, text: str, finished: Finished) -> dict[str, Any]:
        calls: list[dict[str, Any]] = []
        if self.chat:
            content: str | None = text
            if self.tools is not None and finished.finish_reason == "stop":
                content, calls = self.tools.parse(text)
            message: dict[str, Any] = {"role": "assistant", "content": content}
            if calls:
                message["tool_calls"] = calls
            choice: dict[str, Any] = {"index": 0, "message": message}
        else:
            choice = {"index": 0, "text": text, "logprobs": None}
        choice["finish_reason"] = "tool_calls" if calls else _reason(finished)
        body = self._head("chat.completion" if self.chat else "text_completion")
        body["choices"] = [choice]
        body["usage"] = _usage(finished)
        body["kairos_timings"] = finished.timings.as_dict()
        return body

    def chunk(
        self,
        text: str | None,
        finish: Finished | None = None,
        *,
        calls: list[dict[str, Any]] | None = None,
        reason: str | None = None,
    ) -> dict[str, Any]:
        if self.chat:
            delta: dict[str, Any] = {} if text is None else {"content": text}
            if calls:
                delta = {"tool_calls": calls}
            choice: dict[str, Any] = {"index": 0, "delta": delta}
        else:
            choice = {"index": 0, "text": text or "", "logprobs": None}
        choice["finish_reason"] = reason or (_reason(finish) if finish else None)
        body = self._head("chat.completion.chunk" if self.chat else "text_completion")
        body["choices"] = [choice]
        if self.include_usage:
            body["usage"] = None
        if finish is not None:
            body["kairos_timings"] = finish.timings.as_dict()
        return body

    def usage_chunk(self, finished: Finished) -> dict[str, Any]:
        body = self._head("chat.completion.chunk" if self.chat else "text_completion")
        body["choices"] = []
        body["usage"] = _usage(finished)
        body["kairos_timings"] = finished.timings.as_dict()
        return body


async def _sse(job: Job, watcher: asyncio.Task[None], shape: _Shape) -> AsyncIterator[bytes]:
    try:
        if shape.chat:
            role = shape.chunk(None)
            role["choices"][0]["delta"] = {"role": "assistant", "content": ""}
            yield _event(role)
        calls = _CallSplitter(shape.tools) if shape.chat and shape.tools else None
        async for event in job.events():
            if isinstance(event, Piece):
                if calls is None:
                    yield _event(shape.chunk(event.text))
                    continue
                text, deltas = calls.feed(event.text)
                if text:
                    yield _event(shape.chunk(text))
                if deltas:
                    yield _event(shape.chunk(None, calls=deltas))
                continue
            if event.error:
                yield _event({"error": {"message": event.error, "type": "server_error",
                                        "param": None, "code": "engine_failed"}})  # fmt: skip
            elif event.finish_reason != "cancelled":
                called = calls is not None and calls.called and event.finish_reason == "stop"
                yield _event(shape.chunk(None, event, reason="tool_calls" if called else None))
                if shape.include_usage:
                    yield _event(shape.usage_chunk(event))
        yield b"data: [DONE]\n\n"
    finally:
        job.cancel()  # a no-op when it finished; stops it when the client went away
        watcher.cancel()


class _CallSplitter:
    """A streamed turn that may be tool calls: content pieces pass as they are, a turn that
    opens with "{" (only calls may) becomes `tool_calls` deltas."""

    def __init__(self, plan: ToolPlan) -> None:
        self._stream: ToolCallStream | None = None
        self._mode = "text" if plan.choice == "none" else "undecided"

    @property
    def called(self) -> bool:
        return self._mode == "calls"

    def feed(self, piece: str) -> tuple[str, list[dict[str, Any]]]:
        if self._mode == "undecided" and piece:
            self._mode = "calls" if piece.startswith("{") else "text"
            if self._mode == "calls":
                self._stream = ToolCallStream()
        if self._stream is not None:
            return "", self._stream.feed(piece)
        return piece, []


async def _cancel_on_disconnect(request: Request, job: Job) -> None:
    """Cancel the job when the client goes away, whether it is queued or generating."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            job.cancel()
            return


def _reason(finished: Finished | None) -> str | None:
    if finished is None:
        return None
    return "length" if finished.finish_reason == "length" else "stop"


def _usage(finished: Finished) -> dict[str, Any]:
    t = finished.timings
    return {
        "prompt_tokens": t.prompt_tokens,
        "completion_tokens": t.completion_tokens,
        "total_tokens": t.prompt_tokens + t.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": t.cached_tokens},
    }


async def _body(request: Request) -> Any:
    raw = await request.body()
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise LLMRequestError("the request body is not valid JSON", param="body") from None


def _event(body: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(body) + b"\n\n"


def _json(body: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(body), status_code=status, media_type="application/json")


async def _http_error(request: Request, error: Exception) -> Response:
    """Unknown paths and wrong methods answer JSON too, naming what exists."""
    status = error.status_code if isinstance(error, HTTPException) else 500
    routes = "POST /v1/completions, POST /v1/chat/completions, GET /v1/models, POST /tokenize"
    message = f"{request.method} {request.url.path} is not served here; try {routes}"
    body = {"message": message, "type": "invalid_request_error", "param": None,
            "code": "not_found" if status == 404 else "method_not_allowed"}  # fmt: skip
    return _json({"error": body}, status)


def _error(error: LLMRequestError | EngineNotReady) -> Response:
    if isinstance(error, EngineNotReady):
        body = {"message": str(error), "type": "server_error", "param": None,
                "code": "model_not_ready"}  # fmt: skip
        return _json({"error": body}, 503)
    body = {"message": error.message, "type": error.kind, "param": error.param,
            "code": error.code}  # fmt: skip
    return _json({"error": body}, error.status)


# -- the process ---------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None = None) -> WorkerConfig:
    parser = argparse.ArgumentParser(
        prog="python -m kairos.serving.worker",
        description="Serve one GGUF model over an OpenAI-compatible HTTP API.",
    )
    parser.add_argument("--model", required=True, help="path to a .gguf file")
    parser.add_argument("--name", help="the model id clients send (default: the file's stem)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8200)
    parser.add_argument("--ctx", type=int, default=2048, help="context length in tokens")
    parser.add_argument("--threads", type=int, help="CPU threads (default: llama.cpp's)")
    parser.add_argument("--cpus", type=cores_argument, default=(), metavar="N[,N...]",
                        help="run every thread (llama.cpp's too) on these cores")  # fmt: skip
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--slots", type=_slots_argument, default=8,
                        help="requests decoded together (continuous batching); 1: one at a "
                             "time in arrival order")  # fmt: skip
    parser.add_argument("--chat-format", help="a llama-cpp chat format instead of the GGUF's")
    parser.add_argument("--parent-pid", type=int, help="exit when this process is gone")
    parser.add_argument("--graceful", type=float, default=30.0, help="seconds to finish on stop")
    args = parser.parse_args(argv)
    engine = EngineConfig(
        model_path=args.model,
        n_ctx=args.ctx,
        n_threads=args.threads,
        seed=args.seed,
        chat_format=args.chat_format,
        slots=args.slots,
    )
    return WorkerConfig(
        engine=engine,
        model_name=args.name or Path(args.model).stem,
        host=args.host,
        port=args.port,
        parent_pid=args.parent_pid,
        graceful_s=args.graceful,
        cpus=args.cpus,
    )


def _slots_argument(text: str) -> int:
    if not (text.isascii() and text.isdigit()) or int(text) < 1:
        raise argparse.ArgumentTypeError(f"--slots must be a whole number >= 1, not {text!r}")
    return int(text)


def pin(cores: Sequence[int]) -> None:
    """Run every thread of this process on `cores`: those already running (an import may have
    started one) and, since Linux threads inherit their creator's affinity, those started
    after (llama.cpp's, the server's)."""
    try:
        for thread in os.listdir("/proc/self/task"):
            with contextlib.suppress(ProcessLookupError):  # a thread that has since ended
                os.sched_setaffinity(int(thread), set(cores))
    except OSError as error:
        usable = sorted(os.sched_getaffinity(0))
        raise SystemExit(
            f"kairos-llm-worker: --cpus {','.join(map(str, cores))} cannot be used ({error}); "
            f"this process may run on cores {usable}"
        ) from None


def serve(config: WorkerConfig) -> int:
    """Run the worker until SIGINT/SIGTERM; exit 3 when the model cannot be loaded."""
    import uvicorn

    if config.cpus:
        pin(config.cpus)
    worker = Worker(config)
    server = uvicorn.Server(
        uvicorn.Config(
            worker.app(),
            host=config.host,
            port=config.port,
            log_level="warning",
            timeout_graceful_shutdown=int(config.graceful_s),
            lifespan="on",
        )
    )

    async def run() -> int:
        async def stop_on_failure() -> None:
            await worker.failed.wait()
            server.should_exit = True

        watch = asyncio.create_task(stop_on_failure())
        if config.parent_pid is not None:
            _watch_parent(config.parent_pid, server)
        await server.serve()
        watch.cancel()
        return 3 if worker.failed.is_set() else 0

    return asyncio.run(run())


def _watch_parent(pid: int, server: Any) -> None:
    def watch() -> None:
        while True:
            time.sleep(0.5)
            if os.getppid() != pid:  # re-parented: the supervisor died without stopping us
                server.should_exit = True
                return

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def main(argv: Sequence[str] | None = None) -> int:
    with contextlib.suppress(KeyboardInterrupt):
        return serve(parse_args(argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
