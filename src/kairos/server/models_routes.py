"""HTTP routes of the model registry and model serving.

    GET  /v1/models                                   names, versions, aliases
    POST /v1/models/{name}/versions?format=onnx       register an artifact (body: its bytes,
                                                      Content-Type: application/octet-stream)
    GET  /v1/models/{name}                            its versions and aliases
    GET  /v1/models/{name}/versions/{version}         one version: schema, sha256, metadata
    PUT  /v1/models/{name}/aliases/{alias}            {"version": 3}: move an alias
    POST /v1/models/{name}/aliases/{alias}/rollback   {}: undo the alias's latest move
    GET  /v1/models/{name}/aliases                    aliases and their history
    POST /v1/models/{name}/predict                    {"rows": [...]} or an Arrow IPC stream

Unknown models, versions and aliases are 404s naming what exists; rows that do not fit the
model's schema are 422s naming the expected inputs. The three listings take `?limit=` (1 to
10,000, the default): the first models by name, the newest versions, the latest alias moves;
`"more": true` says some were left out.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np
import pyarrow
import pyarrow.ipc
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from kairos.client.client import Client
from kairos.errors import InvalidInput
from kairos.models import formats
from kairos.models.errors import TamperedArtifact, UnknownModel, UnsupportedModel
from kairos.project.decisions import MAX_PAGE
from kairos.server.bodies import MAX_BODY, HTTPProblem, json_response, read_json, too_large

ARROW = "application/vnd.apache.arrow.stream"
OCTETS = "application/octet-stream"
MAX_ARTIFACT = 512 * 1024 * 1024
MAX_VERSION = 2**63 - 1  # what the registry's integer column holds
# the bodies of the routes that read something other than JSON (kairos.server.guard)
BODIES = {
    "/v1/models/{name}/versions": (OCTETS,),
    "/v1/models/{name}/predict": ("application/json", ARROW),
}
Handler = Callable[[Request], Awaitable[Response]]


def model_routes(client: Client, r: Callable[[str, Handler], Handler]) -> list[Route]:
    """The routes over `client`, each wrapped by `r` like every other route (auth, JSON errors,
    metrics)."""
    handlers = ModelHandlers(client)
    return [
        Route("/v1/models", r("models_list", handlers.list), methods=["GET"]),
        Route(
            "/v1/models/{name}/versions",
            r("models_register", handlers.register),
            methods=["POST"],
        ),
        Route("/v1/models/{name}", r("models_get", handlers.get), methods=["GET"]),
        Route(
            "/v1/models/{name}/versions/{version}",
            r("models_version", handlers.version),
            methods=["GET"],
        ),
        Route("/v1/models/{name}/aliases", r("models_aliases", handlers.aliases), methods=["GET"]),
        Route(
            "/v1/models/{name}/aliases/{alias}",
            r("models_alias_set", handlers.set_alias),
            methods=["PUT"],
        ),
        Route(
            "/v1/models/{name}/aliases/{alias}/rollback",
            r("models_alias_rollback", handlers.rollback),
            methods=["POST"],
        ),
        Route("/v1/models/{name}/predict", r("models_predict", handlers.predict), methods=["POST"]),
    ]


def _problems(handler: Handler) -> Handler:
    """Model errors as the statuses they deserve."""

    async def wrapped(request: Request) -> Response:
        try:
            return await handler(request)
        except UnknownModel as error:
            raise HTTPProblem(404, "not_found", str(error), error.field) from None
        except UnsupportedModel as error:
            raise HTTPProblem(422, "unsupported_model", str(error), "body") from None
        except TamperedArtifact as error:
            raise HTTPProblem(503, "artifact_tampered", str(error)) from None

    return wrapped


class ModelHandlers:
    def __init__(self, client: Client) -> None:
        self.client = client
        self.list = _problems(self._list)
        self.register = _problems(self._register)
        self.get = _problems(self._get)
        self.version = _problems(self._version)
        self.aliases = _problems(self._aliases)
        self.set_alias = _problems(self._set_alias)
        self.rollback = _problems(self._rollback)
        self.predict = _problems(self._predict)

    async def _list(self, request: Request) -> Response:
        models = self.client.models
        limit = _limit(request)
        names = await asyncio.to_thread(models.names)

        def read() -> list[dict[str, Any]]:
            out = []
            for name in names[:limit]:  # each costs a registry read: only those listed
                versions = models.versions(name)
                out.append(
                    {
                        "name": name,
                        "latest": versions[-1].version,
                        "versions": len(versions),
                        "aliases": models.aliases(name),
                    }
                )
            return out

        listed = await asyncio.to_thread(read)
        return json_response({"models": listed, "more": len(names) > limit})

    async def _get(self, request: Request) -> Response:
        name = request.path_params["name"]
        limit = _limit(request)
        models = self.client.models
        versions = await asyncio.to_thread(models.versions, name)
        aliases = await asyncio.to_thread(models.aliases, name)
        return json_response(
            {
                "name": name,
                "aliases": aliases,
                "versions": [v.to_json() for v in versions[-limit:]],  # the newest
                "more": len(versions) > limit,
            }
        )

    async def _version(self, request: Request) -> Response:
        name = request.path_params["name"]
        version = _version_number(request.path_params["version"])
        record = await asyncio.to_thread(self.client.models.get, name, version)
        return json_response(record.to_json())

    async def _aliases(self, request: Request) -> Response:
        name = request.path_params["name"]
        models = self.client.models
        limit = _limit(request)
        aliases = await asyncio.to_thread(models.aliases, name)
        history = await asyncio.to_thread(models.history, name)
        return json_response(
            {
                "name": name,
                "aliases": aliases,
                "history": [c.to_json() for c in history[-limit:]],  # the latest moves
                "more": len(history) > limit,
            }
        )

    async def _set_alias(self, request: Request) -> Response:
        name, alias = request.path_params["name"], request.path_params["alias"]
        body = await read_json(request)
        version = body.get("version")
        if (
            not isinstance(version, int)
            or isinstance(version, bool)
            or not 1 <= version <= MAX_VERSION
        ):
            raise HTTPProblem(
                422, "invalid_body", 'send {"version": N} with a registered version', "version"
            )
        change = await asyncio.to_thread(
            self.client.models.set_alias, name, alias, version, by=_who(request)
        )
        return json_response(change.to_json())

    async def _rollback(self, request: Request) -> Response:
        name, alias = request.path_params["name"], request.path_params["alias"]
        change = await asyncio.to_thread(self.client.models.rollback, name, alias, by=_who(request))
        return json_response(change.to_json())

    async def _register(self, request: Request) -> Response:
        """Register an artifact in a safe format; the schema is inferred as for Python."""
        name = request.path_params["name"]
        params = request.query_params
        kind = params.get("format")
        if kind not in UPLOADABLE:
            raise HTTPProblem(
                422,
                "invalid_format",
                f"format={kind!r}; send ?format= one of {', '.join(UPLOADABLE)} with the "
                "artifact's bytes as the body (Python objects register with client.models)",
                "format",
            )
        data = await _body(request, MAX_ARTIFACT)
        if not data:
            raise HTTPProblem(422, "invalid_body", "the body must be the artifact's bytes", "body")
        aliases = [a for a in params.get("aliases", "").split(",") if a]
        inputs = [i for i in params.get("inputs", "").split(",") if i] or None
        output = params.get("output") or None

        def register() -> Any:
            model = formats.from_artifact(data, kind)
            return self.client.models.register(
                name, model, aliases=aliases, inputs=inputs, output=output
            )

        record = await asyncio.to_thread(register)
        return json_response(record.to_json(), 201)

    async def _predict(self, request: Request) -> Response:
        name = request.path_params["name"]
        arrow = request.headers.get("content-type", "").split(";")[0].strip() == ARROW
        if arrow:
            rows = _read_arrow(await _body(request, MAX_BODY))
            version = _version_number(request.query_params.get("version"))
            alias = request.query_params.get("alias")
        else:
            body = await read_json(request)
            rows = body.get("rows")
            if rows is None:
                raise HTTPProblem(
                    422,
                    "invalid_body",
                    'send {"rows": [{"input": value, ...}, ...]} (or lists in input order)',
                    "rows",
                )
            version = _version_number(body.get("version"))
            alias = body.get("alias")
            if alias is not None and not isinstance(alias, str):
                raise HTTPProblem(422, "invalid_body", "alias is a string", "alias")
        try:
            record, predictions = await self.client.models.predict_async(
                name, rows, version=version, alias=alias
            )
        except (UnknownModel, InvalidInput):
            raise
        except Exception as error:  # the model itself raised on rows that fit its schema
            raise HTTPProblem(
                422, "model_error", f"model {name!r} raised {type(error).__name__}: {error}"
            ) from None
        if "arrow" in request.headers.get("accept", ""):
            return _arrow_response(record.label, predictions)
        return json_response(
            {"model": record.label, "version": record.version, "predictions": predictions.tolist()}
        )


def _who(request: Request) -> str:
    """Who moves an alias, for its history: `key:` and the first 8 hex digits of the bearer
    key's sha256 (never the key), or `local` when the server has no keys (none is sent)."""
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return "local"
    return f"key:{hashlib.sha256(token.strip().encode()).hexdigest()[:8]}"


UPLOADABLE = ("onnx", "skops", "xgboost-ubj", "xgboost-json", "lightgbm-text", "catboost-cbm")


def _version_number(value: Any) -> int | None:
    """A version from a path, a query or a body: a whole number 1..MAX_VERSION.

    `str.isdigit` alone is not enough: "²" is a digit to it and no number to `int`.

    >>> _version_number("2"), _version_number(3), _version_number(None)
    (2, 3, None)
    """
    if value is None:
        return None
    if isinstance(value, str) and value.isascii() and value.isdigit() and len(value) <= 19:
        value = int(value)
    if isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= MAX_VERSION:
        return value
    raise HTTPProblem(
        422, "invalid_version", f"version {value!r} must be a whole number 1..{MAX_VERSION}",
        "version",
    )  # fmt: skip


def _limit(request: Request) -> int:
    """A listing's `limit` (the newest that many are listed): 1..MAX_PAGE, MAX_PAGE when
    not given; a 400 naming it and the most otherwise."""
    text = request.query_params.get("limit")
    if text is None:
        return MAX_PAGE
    if not (text.isascii() and text.isdigit() and len(text) <= 9 and 1 <= int(text) <= MAX_PAGE):
        raise HTTPProblem(
            400, "invalid_query", f"limit={text!r} must be a whole number 1..{MAX_PAGE}", "limit"
        )
    return int(text)


async def _body(request: Request, limit: int) -> bytes:
    if too_large(request, limit):
        raise HTTPProblem(413, "too_large", f"the body is over {limit} bytes")
    chunks = []
    total = 0
    async for chunk in request.stream():
        total += len(chunk)
        if total > limit:
            raise HTTPProblem(413, "too_large", f"the body is over {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def _read_arrow(data: bytes) -> Any:
    try:
        return pyarrow.ipc.open_stream(pyarrow.BufferReader(data)).read_all()
    except (pyarrow.ArrowInvalid, OSError) as error:
        raise HTTPProblem(
            422, "invalid_body", f"the body is not an Arrow IPC stream ({error})", "body"
        ) from None


def _arrow_response(label: str, predictions: np.ndarray) -> Response:
    values = (
        pyarrow.array(predictions)
        if predictions.ndim == 1 and predictions.dtype.kind in "fiub"
        else pyarrow.array(predictions.tolist())
    )
    table = pyarrow.table({"prediction": values})
    sink = pyarrow.BufferOutputStream()
    with pyarrow.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return Response(sink.getvalue().to_pybytes(), media_type=ARROW, headers={"X-Model": label})
