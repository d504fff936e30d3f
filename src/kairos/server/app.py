"""Routes of the HTTP server, declared as one list; each handler parses, calls the client,
formats. Bad input is a 4xx with a JSON body naming the field and the fix, never a 500."""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import datetime
from typing import Any

from starlette.applications import Starlette
from starlette.datastructures import QueryParams
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Mount, Route

from kairos.client.client import Client
from kairos.client.consume import consumers_for, run_consumers
from kairos.errors import (
    BackendUnavailable,
    DefinitionError,
    InvalidInput,
    KairosError,
    PlanError,
    UnknownFeature,
)
from kairos.http.access import log_access
from kairos.project.config import ServerConfig
from kairos.project.decisions import MAX_PAGE, entity_keys, moment, typed_time
from kairos.project.session import QUERY_ID
from kairos.server.bodies import (
    HTTPProblem,
    json_response,
    problem_response,
    read_json,
    wants_tagged,
)
from kairos.server.guard import RequestGuard
from kairos.server.metrics import Metrics
from kairos.server.models_routes import BODIES, model_routes
from kairos.server.openapi import openapi_document
from kairos.server.replay_routes import replay_routes
from kairos.telemetry import ServerSpans
from kairos.ui import UI, Traffic, dashboard_routes
from kairos.ui.throttle import AuthThrottle, client_address

Handler = Callable[[Request], Awaitable[Response]]
logger = logging.getLogger(__name__)


def _outputs(body: dict[str, Any]) -> list[str]:
    outputs = body.get("outputs")
    if not isinstance(outputs, list) or not outputs or not all(isinstance(o, str) for o in outputs):
        raise HTTPProblem(
            422,
            "invalid_body",
            'outputs must be a non-empty list of feature names, e.g. ["user.risk"]',
            "outputs",
        )
    return outputs


def _inputs(body: dict[str, Any]) -> dict[str, Any]:
    inputs = body.get("inputs")
    if not isinstance(inputs, dict):
        raise HTTPProblem(
            422, "invalid_body", 'inputs must be an object, e.g. {"user.id": "u1"}', "inputs"
        )
    return inputs


def _options(body: dict[str, Any]) -> dict[str, Any]:
    unknown = set(body) - {"inputs", "outputs", "now", "staleness", "query_id"}
    if unknown:
        name = sorted(unknown)[0]
        raise HTTPProblem(
            422,
            "invalid_body",
            f"unknown field {name!r}; use inputs, outputs, now, staleness, query_id",
            name,
        )
    options: dict[str, Any] = {}
    now = body.get("now")
    if now is not None:
        try:
            options["now"] = datetime.fromisoformat(now) if isinstance(now, str) else None
        except ValueError:
            options["now"] = None
        if options["now"] is None:
            raise HTTPProblem(
                422,
                "invalid_body",
                'now must be an ISO 8601 time, e.g. "2026-06-01T12:00:00Z"',
                "now",
            )
    staleness = body.get("staleness")
    if staleness is not None:
        if not isinstance(staleness, dict) or not all(
            isinstance(v, str | int | float) and not isinstance(v, bool) for v in staleness.values()
        ):
            raise HTTPProblem(
                422,
                "invalid_body",
                'staleness maps features to durations, e.g. {"user.risk": "0s"}',
                "staleness",
            )
        options["staleness"] = staleness
    query_id = body.get("query_id")
    if query_id is not None:
        if not isinstance(query_id, str) or not QUERY_ID.fullmatch(query_id):
            raise HTTPProblem(
                422,
                "invalid_body",
                "query_id is 1-128 letters, digits or . _ ~ : - (it names one decision)",
                "query_id",
            )
        options["query_id"] = query_id
    return options


_SEARCH = ("entity", "since", "until", "feature", "model", "limit")


def _search_options(params: QueryParams) -> dict[str, Any]:
    """`GET /v1/log` parameters as `client.log.parse` arguments; a bad one is a 400 naming it.

    >>> _search_options(QueryParams("entity=user.id:u1&since=1h&limit=10"))["entity"]
    {'user.id': 'u1'}
    """
    unknown = sorted(set(params) - set(_SEARCH))
    if unknown:
        raise HTTPProblem(
            400, "invalid_query", f"unknown parameter {unknown[0]!r}; use {', '.join(_SEARCH)}",
            unknown[0],
        )  # fmt: skip
    for name in _SEARCH[1:]:
        if len(params.getlist(name)) > 1:
            raise HTTPProblem(400, "invalid_query", f"give {name} once", name)
    try:
        entity = entity_keys(params.getlist("entity"))
    except InvalidInput as error:
        raise HTTPProblem(400, "invalid_query", str(error), error.field) from None
    options: dict[str, Any] = {"entity": entity}
    for name in ("since", "until"):
        text = params.get(name)
        if text is not None:
            try:
                options[name] = moment(typed_time(text), name)
            except InvalidInput as error:  # not a time, or a duration back past year 1
                raise HTTPProblem(400, "invalid_query", str(error), name) from None
    for name in ("feature", "model"):
        options[name] = params.get(name)
    limit = params.get("limit")
    if limit is not None:
        options["limit"] = page_limit(limit)
    return options


def page_limit(text: str | None, default: int = 100) -> int:
    """A listing's `limit` query parameter: 1..MAX_PAGE, else a 400 naming it and the most.

    >>> page_limit("50"), page_limit(None)
    (50, 100)
    """
    if text is None:
        return default
    if not (text.isascii() and text.isdigit() and len(text) <= 9 and 1 <= int(text) <= MAX_PAGE):
        raise HTTPProblem(
            400, "invalid_query",
            f"limit={text!r} must be a whole number 1..{MAX_PAGE} (the most one reply lists; "
            "page through more with until= the oldest's now)",
            "limit",
        )  # fmt: skip
    return int(text)


def _error_status(error: KairosError) -> HTTPProblem:
    code = type(error).__name__
    if isinstance(error, UnknownFeature | InvalidInput | PlanError | DefinitionError):
        return HTTPProblem(422, code, str(error), getattr(error, "field", None))
    if isinstance(error, BackendUnavailable):
        return HTTPProblem(503, code, str(error))  # our backend failed, not the request
    return HTTPProblem(400, code, str(error))


class Server:
    """Holds the client, the metrics and the auth keys for the routes."""

    def __init__(self, client: Client, config: ServerConfig) -> None:
        self.client = client
        self.keys = [k.encode() for k in config.keys]
        self.consumers = consumers_for(client)  # the project's streams: entries
        self.metrics = Metrics(
            query_log_dropped=lambda: client.log.dropped,
            query_log_lost=lambda: client.log.lost,
            streams=lambda: [(c.name, c.stats) for c in self.consumers],
        )
        self.traffic = Traffic()  # the last minutes, for the dashboard's Live page
        self.throttle = AuthThrottle()  # failed keys per client, the dashboard's sign-in too

    def authorized(self, request: Request) -> bool:
        if not self.keys:
            return True
        header = request.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not token:
            return False
        given = token.strip().encode()
        return any(hmac.compare_digest(given, key) for key in self.keys)

    def authenticate(self, request: Request) -> None:
        """Let in a request with a valid key (any, without keys); refuse one without (401),
        counting it when it carried a key, and every one from a client with too many
        failures lately (429, checked first: see `kairos.ui.throttle`)."""
        if not self.keys:
            return
        client = client_address(request)
        wait = self.throttle.retry_after(client)
        if wait:
            raise HTTPProblem(
                429, "too_many_failures",
                f"{self.throttle.most} failed authentications from {client} within "
                f"{self.throttle.window:.0f} s; try again in {wait} s with a valid key",
                headers={"Retry-After": str(wait)},
            )  # fmt: skip
        if self.authorized(request):
            return
        if "authorization" in request.headers:
            self.throttle.failed(client)
        raise HTTPProblem(
            401,
            "unauthorized",
            "send `Authorization: Bearer <key>` with a valid key",
            headers={"WWW-Authenticate": 'Bearer realm="kairos"'},
        )

    def insider(self, request: Request) -> bool:
        """Whether a public route may tell this request more: no keys, or a valid one. A
        wrong key counts as a failure here too (else this would be a way to test keys) and a
        locked-out client is told nothing more."""
        if not self.keys:
            return True
        try:
            self.authenticate(request)
        except HTTPProblem:
            return False
        return True

    def route(self, endpoint: str, handler: Handler, *, public: bool = False) -> Handler:
        """Wrap a handler: auth, errors as JSON, metrics by endpoint, the access line."""

        async def wrapped(request: Request) -> Response:
            started = time.perf_counter()
            try:
                if not public:
                    self.authenticate(request)
                response = await handler(request)
            except HTTPProblem as problem:
                response = problem_response(problem)
            except KairosError as error:
                response = problem_response(_error_status(error))
            except Exception as error:  # never a stack trace to the client: to the log
                logger.error(
                    "internal error answering %s %s", request.method, endpoint, exc_info=error
                )
                response = problem_response(
                    HTTPProblem(500, "internal_error", f"internal error ({type(error).__name__})")
                )
            seconds = time.perf_counter() - started
            self.metrics.observe_request(endpoint, response.status_code, seconds)
            self.traffic.observe_request(endpoint, response.status_code, seconds)
            log_access(
                request.method, request.scope["path"], response.status_code, seconds,
                request.scope.get("state", {}).get("query_id"),
            )  # fmt: skip
            return response

        return wrapped

    async def query_online(self, request: Request) -> Response:
        body = await read_json(request)
        options = _options(body)
        result = await self.client.query_async(_inputs(body), _outputs(body), **options)
        self.observe_query(request, result)
        return json_response(result.to_dict(), tagged=wants_tagged(request))

    async def query_bulk(self, request: Request) -> Response:
        body = await read_json(request)
        options = _options(body)
        inputs = _inputs(body)
        if not all(isinstance(v, list) for v in inputs.values()):
            raise HTTPProblem(
                422,
                "invalid_body",
                'bulk inputs map each feature to a list, e.g. {"user.id": ["u1", "u2"]}',
                "inputs",
            )
        result = await self.client.query_bulk_async(inputs, _outputs(body), **options)
        self.observe_query(request, result)
        return json_response(result.to_dict(), tagged=wants_tagged(request))

    def observe_query(self, request: Request, result: Any) -> None:
        meta = result.meta
        request.state.query_id = meta.query_id  # for the access line
        self.metrics.observe_query(result.trace, meta.cache_hits, meta.computed, meta.llm)
        self.traffic.observe_query(meta.cache_hits, meta.computed)

    async def query_plan(self, request: Request) -> Response:
        body = await read_json(request)
        _options({k: v for k, v in body.items() if k not in ("now", "staleness", "query_id")})
        inputs = body.get("inputs")
        names = list(inputs) if isinstance(inputs, dict | list) else None
        if names is None or not all(isinstance(n, str) for n in names):
            raise HTTPProblem(
                422, "invalid_body", 'inputs must list feature names, e.g. ["user.id"]', "inputs"
            )
        plan = self.client.plan(names, _outputs(body))
        return json_response(
            {
                "explain": plan.explain(),
                "nodes": [
                    {
                        "id": n.id,
                        "kind": n.kind,
                        "label": n.label,
                        "reads": ["now" if a is None else a for a in n.args],
                        "writes": list(n.outputs),
                        "after": list(n.after),
                    }
                    for n in plan.nodes
                ],
            }
        )

    async def query_offline(self, request: Request) -> Response:
        body = await read_json(request)
        unknown = set(body) - {"spine", "outputs", "timestamp", "recompute"}
        if unknown:
            name = sorted(unknown)[0]
            raise HTTPProblem(
                422, "invalid_body",
                f"unknown field {name!r}; use spine, outputs, timestamp, recompute", name,
            )  # fmt: skip
        spine = body.get("spine")
        if not isinstance(spine, dict) or not all(isinstance(v, list) for v in spine.values()):
            raise HTTPProblem(
                422,
                "invalid_body",
                'spine maps columns to lists, e.g. {"user.id": ["u1"], "ts": ["2026-06-01"]}',
                "spine",
            )
        if len({len(v) for v in spine.values()}) > 1:
            raise HTTPProblem(422, "invalid_body", "spine columns differ in length", "spine")
        timestamp = body.get("timestamp", "ts")
        recompute = body.get("recompute", True)
        if not isinstance(timestamp, str):
            raise HTTPProblem(422, "invalid_body", "timestamp names a spine column", "timestamp")
        if not isinstance(recompute, bool) and not (
            isinstance(recompute, list) and all(isinstance(f, str) for f in recompute)
        ):
            raise HTTPProblem(
                422, "invalid_body", "recompute is true, false or a list of features", "recompute"
            )
        result = await self.client.offline_query_async(
            spine, _outputs(body), timestamp=timestamp, recompute=recompute
        )
        tagged = wants_tagged(request)
        return json_response(result.to_dict(schema=tagged), tagged=tagged)

    async def write_events(self, request: Request) -> Response:
        body = await read_json(request)
        rows = body.get("rows")
        if (
            set(body) - {"rows"}
            or not isinstance(rows, list)
            or not all(isinstance(r, dict) for r in rows)
        ):
            raise HTTPProblem(
                422,
                "invalid_body",
                'send {"rows": [{...}, ...]}: event rows keyed by feature name',
                "rows",
            )
        namespace = request.path_params["namespace"]
        if namespace not in self.client.graph.classes:
            raise HTTPProblem(404, "not_found", f"no feature class {namespace!r}", "namespace")
        written = self.client.write_events(namespace, rows)
        return json_response({"written": written})

    async def log_get(self, request: Request) -> Response:
        query_id = request.path_params["query_id"]
        record = await asyncio.to_thread(self.client.log.get, query_id)
        if record is None:
            raise HTTPProblem(404, "not_found", f"no logged query {query_id!r}", "query_id")
        return json_response(record.to_dict(), tagged=wants_tagged(request))

    async def log_search(self, request: Request) -> Response:
        """Decisions newest first: `?entity=user.id:u1&since=1h&model=risk@v2&limit=50`."""
        try:
            search = self.client.log.parse(**_search_options(request.query_params))
        except InvalidInput as error:
            raise HTTPProblem(400, "invalid_query", str(error), error.field) from None
        records = await asyncio.to_thread(self.client.log.find, search)
        return json_response(
            {"records": [record.to_dict() for record in records]}, tagged=wants_tagged(request)
        )

    def ui(self) -> UI:
        """The dashboard over this server's client, keys, traffic and streams."""
        gateway = self.client.llm.configured_gateway()
        return UI(
            self.client,
            keys=[k.decode() for k in self.keys],
            gateway=gateway,
            admin_key=gateway.config.admin_key if gateway is not None else "",
            traffic=self.traffic,
            streams=lambda: [(c.name, c.stats) for c in self.consumers],
            throttle=self.throttle,
        )

    async def healthz(self, request: Request) -> Response:
        return json_response({"status": "ok"})

    async def readyz(self, request: Request) -> Response:
        insider = self.insider(request)  # sees the details (hosts, paths) of what failed
        problems = {}
        for name, source in self.client.sources.items():
            try:
                await asyncio.wait_for(source.fetch("select 1", []), 2.0)
            except Exception as error:  # report, do not crash the probe
                # the probe is public: details (hosts, paths) only for an authorized caller
                detail = f"{type(error).__name__}: {error}"
                problems[name] = detail if insider else "unavailable"
        # the project's LLM deployments: starting or failed is not ready; an engine this
        # install lacks is reported (its features say what to install) but serves the rest
        deployments, waiting = {}, []
        for name, found in self.client.llm.deployments.status().items():
            detail = f": {found.error}" if found.error and insider else ""
            deployments[name] = found.state + detail
            if found.state in ("starting", "restarting", "failed"):
                waiting.append(found.state)
        body: dict[str, Any] = {"deployments": deployments} if deployments else {}
        if problems:
            return json_response({"status": "unavailable", "sources": problems, **body}, 503)
        if waiting:
            status = "starting" if set(waiting) <= {"starting", "restarting"} else "unavailable"
            return json_response({"status": status, **body}, 503)
        return json_response({"status": "ready", **body})

    async def metrics_endpoint(self, request: Request) -> Response:
        return Response(self.metrics.render(), media_type="text/plain; version=0.0.4")

    async def openapi(self, request: Request) -> Response:
        return json_response(openapi_document())


def create_app(
    client: Client, config: ServerConfig | None = None, *, close_client: bool = False
) -> Starlette:
    """The ASGI app serving `client`; with `close_client`, shutting the app down closes the
    client, which flushes the query log before the process exits."""
    settings = config or client.config.server
    server = Server(client, settings)
    r = server.route
    routes = [
        Route("/v1/query/online", r("query_online", server.query_online), methods=["POST"]),
        Route("/v1/query/bulk", r("query_bulk", server.query_bulk), methods=["POST"]),
        Route("/v1/query/plan", r("query_plan", server.query_plan), methods=["POST"]),
        Route("/v1/query/offline", r("query_offline", server.query_offline), methods=["POST"]),
        Route("/v1/events/{namespace}", r("events", server.write_events), methods=["POST"]),
        Route("/v1/log", r("log_search", server.log_search), methods=["GET"]),
        Route("/v1/log/{query_id}", r("log_get", server.log_get), methods=["GET"]),
        Route("/healthz", r("healthz", server.healthz, public=True), methods=["GET"]),
        Route("/readyz", r("readyz", server.readyz, public=True), methods=["GET"]),
        Route("/metrics", r("metrics", server.metrics_endpoint), methods=["GET"]),
        Route("/openapi.json", r("openapi", server.openapi, public=True), methods=["GET"]),
        *model_routes(client, r),
        *replay_routes(client, r),
        Mount("/ui", routes=dashboard_routes(server.ui())),
    ]

    async def not_found(request: Request, exc: Exception) -> Response:
        started = time.perf_counter()
        response = problem_response(HTTPProblem(404, "not_found", f"no route {request.url.path}"))
        log_access(request.method, request.scope["path"], 404, time.perf_counter() - started)
        return response

    async def not_allowed(request: Request, exc: Exception) -> Response:
        started = time.perf_counter()
        allowed = getattr(exc, "headers", None) or {}
        response = problem_response(
            HTTPProblem(
                405,
                "method_not_allowed",
                f"{request.method} is not allowed here",
                headers={"Allow": allowed["Allow"]} if "Allow" in allowed else None,
            )
        )
        log_access(request.method, request.scope["path"], 405, time.perf_counter() - started)
        return response

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        client.llm.deployments.start_all()  # LLM replicas load meanwhile (/readyz says)
        await asyncio.to_thread(client.models.warm)  # models load before the first query
        await asyncio.to_thread(client.llm.warm)  # and the tokenizers LLM features count with
        stop = asyncio.Event()  # the project's streams, consumed while the server runs
        consuming = asyncio.ensure_future(run_consumers(server.consumers, stop))
        yield
        stop.set()
        await consuming
        if close_client:
            await client.aclose()
            print("kairos stopped; query log flushed", file=sys.stderr, flush=True)

    app = Starlette(
        routes=routes,
        exception_handlers={404: not_found, 405: not_allowed},
        lifespan=lifespan,
        middleware=[
            Middleware(ServerSpans),  # a span per request, with tracing on
            # before any route: bodies of the declared type; without keys, this machine's
            # own requests only (kairos.server.guard)
            Middleware(
                RequestGuard,
                routes=routes,
                bodies=BODIES,
                local=not server.keys,
                hosts=(settings.host,),
            ),
        ],
    )
    app.state.server = server
    return app
