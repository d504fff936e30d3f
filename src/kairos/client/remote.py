"""`kr.Client(url=..., key=...)`: the same queries, log and models as the embedded client, over
a kairos server's HTTP API, answered as the same types.

    client = kr.Client(url="http://127.0.0.1:8000", key="...")
    r = client.query(input={User.id: "u1"}, output=[User.risk])    # a QueryResult
    client.log.get(r.meta.query_id); client.models.set_alias("risk", "prod", 2)

One pooled httpx client (and one async client for the `*_async` calls) sends every request
with `Authorization: Bearer <key>` and asks for tagged JSON (`kairos.stores.codec`), so values
read back as the types the server had. Calls that change nothing (GETs, explain, predict) are
retried after a connection failure or a 502/503/504, a few times with backoff; queries are
not, since each one is a logged decision. An error the server names (`error.code`) is raised
as the same KairosError subclass the embedded client raises.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta
from pathlib import Path
from typing import Any, Generic, TypeVar
from urllib.parse import quote

import httpx
import numpy as np
import orjson
import pyarrow as pa
from tenacity import (
    AsyncRetrying,
    Retrying,
    retry_if_exception_type,
    stop_after_attempt,
    wait_exponential_jitter,
)

from kairos.definitions.durations import DurationLike, format_duration, parse_duration
from kairos.definitions.feature import ref_of, window_name
from kairos.engine.result import BulkResult, QueryResult
from kairos.errors import (
    AmbiguousResolvers,
    BackendUnavailable,
    CycleError,
    DefinitionError,
    InvalidInput,
    InvalidValue,
    KairosError,
    MissingInput,
    NoPath,
    PlanError,
    ProjectError,
    UnknownFeature,
    did_you_mean,
)
from kairos.models.errors import SchemaMismatch, TamperedArtifact, UnknownModel, UnsupportedModel
from kairos.models.registry import AliasChange, ModelVersion
from kairos.project.inputs import bulk_columns
from kairos.project.offline import OfflineResult, Progress, spine_columns
from kairos.stores.codec import TAGGED_JSON, CorruptValue, decode
from kairos.stores.query_log import LoggedQuery, QueryLogError

T = TypeVar("T")

TRANSIENT = frozenset({502, 503, 504})  # a proxy or an unready server: worth another try


class RemoteError(KairosError):
    """The server refused or failed a request in a way no other KairosError names: `status`
    is the HTTP status, `code` the body's `error.code`, `field` the part of the request at
    fault."""

    def __init__(self, message: str, *, status: int, code: str, field: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.field = field


class Unauthorized(RemoteError, PermissionError):
    """The server wants a valid key: `kr.Client(url=..., key=...)`."""


class NotFound(RemoteError, LookupError):
    """The server has no such thing (a logged query id, a route)."""


class ServerUnavailable(KairosError, ConnectionError):
    """The server could not be reached, or did not answer in time."""


# What the server's `error.code` names: the class of the error it caught (`_error_status`),
# or one of its own codes for a request it could not read.
_RAISED: dict[str, type[KairosError]] = {
    cls.__name__: cls
    for cls in (
        KairosError,
        DefinitionError,
        ProjectError,
        UnknownFeature,
        InvalidInput,
        InvalidValue,
        BackendUnavailable,
        QueryLogError,
        PlanError,
        NoPath,
        MissingInput,
        AmbiguousResolvers,
        CycleError,
        UnknownModel,
        UnsupportedModel,
        TamperedArtifact,
        SchemaMismatch,
    )
}
_CODES: dict[str, type[KairosError]] = {
    "invalid_body": InvalidInput,
    "invalid_query": InvalidInput,
    "invalid_version": InvalidInput,
    "invalid_format": InvalidInput,
    "malformed_json": InvalidInput,
    "too_large": InvalidInput,
    "unsupported_model": UnsupportedModel,
    "artifact_tampered": TamperedArtifact,
    "unauthorized": Unauthorized,
    "not_found": NotFound,
}


def feature_name(feature: Any) -> str:
    """The name of a feature ref or string without the project's graph (the server checks
    that it exists): `User.txn_count["24h"]` and "user.txn_count[24h]" -> "user.txn_count[1d]".

    >>> feature_name("user.txn_count[24h]")
    'user.txn_count[1d]'
    """
    ref = ref_of(feature)
    if ref is not None:
        return ref.fqn
    if not isinstance(feature, str):
        raise UnknownFeature(
            f"{feature!r} is not a feature; pass a feature such as User.balance or 'user.balance'"
        )
    text = feature.strip()
    if text.endswith("]") and "[" in text:
        base, _, window = text.partition("[")
        try:
            return f"{base}[{window_name(window[:-1].strip(chr(39) + chr(34) + ' '))}]"
        except DefinitionError:
            return text  # the server names what is wrong with it
    return text


@dataclass(frozen=True, slots=True)
class Call(Generic[T]):
    """One request and how to read its answer; `idempotent` ones may be sent again."""

    method: str
    path: str
    read: Callable[[Any], T]
    body: bytes | None = None
    params: list[tuple[str, str]] = field(default_factory=list)
    idempotent: bool = False
    not_found: type[KairosError] = NotFound  # what a 404 means here
    content_type: str = "application/json"

    def request(self) -> dict[str, Any]:
        headers = {"Content-Type": self.content_type} if self.body is not None else None
        return {"content": self.body, "params": self.params or None, "headers": headers}


class _Transient(Exception):
    """A 502/503/504 to an idempotent call: worth another try."""

    def __init__(self, response: httpx.Response) -> None:
        self.response = response


def _json(body: Any, field: str) -> bytes:
    try:
        return orjson.dumps(body, default=_plain, option=orjson.OPT_SERIALIZE_NUMPY)
    except orjson.JSONEncodeError as error:
        raise InvalidInput(f"{field}: cannot be sent as JSON ({error})", field=field) from None


def _plain(value: Any) -> Any:
    """What orjson does not write itself, as the server reads it (a pandas Timestamp, a
    date, a tuple or set of values, a duration in seconds)."""
    if isinstance(value, datetime | date):
        return value.isoformat()
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, tuple | set | frozenset):
        return list(value)
    raise TypeError(f"a {type(value).__name__} is not a JSON value")


class RemoteClient:
    """The client of a kairos server (`kairos serve`): what `kr.Client(url=...)` returns.

    >>> client = kr.Client(url="http://127.0.0.1:8000", key=key)  # doctest: +SKIP
    >>> client.query(input={User.id: "u1"}, output=[User.risk]).values  # doctest: +SKIP
    """

    def __init__(
        self,
        url: str,
        *,
        key: str | None = None,
        timeout: float = 30.0,
        retries: int = 3,
        backoff: float = 0.2,
    ) -> None:
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise InvalidInput(
                f"url={url!r} must be a server's http:// or https:// address, e.g. "
                "'http://127.0.0.1:8000'",
                field="url",
            )
        if key is not None and (not isinstance(key, str) or not key.strip()):
            raise InvalidInput("key must be the server's bearer key (a non-empty str)", field="key")
        if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
            raise InvalidInput(f"retries={retries!r} must be a whole number >= 0", field="retries")
        self.url = url.rstrip("/")
        self.timeout = float(timeout)
        self._attempts = retries + 1
        self._backoff = backoff
        headers = {"Accept": f"{TAGGED_JSON}, application/json"}
        if key is not None:
            headers["Authorization"] = f"Bearer {key.strip()}"
        self._options: dict[str, Any] = {
            "base_url": self.url,
            "headers": headers,
            "timeout": httpx.Timeout(self.timeout),
        }
        self._http = httpx.Client(**self._options)
        self._async: httpx.AsyncClient | None = None
        self._async_loop: asyncio.AbstractEventLoop | None = None
        self.log = RemoteLog(self)
        self.models = RemoteModels(self)

    def __repr__(self) -> str:  # never the key
        return f"<kairos.RemoteClient {self.url}>"

    # --- names ------------------------------------------------------------------------------

    def name(self, feature: Any) -> str:
        """The name a feature ref or string is sent as: `User.txn_count["24h"]` ->
        "user.txn_count[1d]"."""
        return feature_name(feature)

    def _outputs(self, output: Any) -> list[str]:
        if isinstance(output, str | bytes) or not isinstance(output, Sequence | set | frozenset):
            raise InvalidInput(
                "output must be a list of features, e.g. output=[User.balance]", field="output"
            )
        return [self.name(o) for o in output]

    # --- queries ----------------------------------------------------------------------------

    def explain(self, input: Iterable[Any], output: Iterable[Any]) -> str:
        """The server's plan as text: each node, what it reads and writes, what it waits for."""
        return self._send(self._explain(input, output))

    async def explain_async(self, input: Iterable[Any], output: Iterable[Any]) -> str:
        return await self._send_async(self._explain(input, output))

    def query(
        self,
        input: Mapping[Any, Any],
        output: Sequence[Any],
        *,
        now: datetime | None = None,
        staleness: Mapping[Any, DurationLike] | None = None,
        query_id: str | None = None,
    ) -> QueryResult:
        """Compute `output` for one entity identified by `input`, on the server."""
        return self._send(self._query(input, output, now, staleness, query_id))

    async def query_async(
        self,
        input: Mapping[Any, Any],
        output: Sequence[Any],
        *,
        now: datetime | None = None,
        staleness: Mapping[Any, DurationLike] | None = None,
        query_id: str | None = None,
    ) -> QueryResult:
        return await self._send_async(self._query(input, output, now, staleness, query_id))

    def query_bulk(
        self,
        input: Mapping[Any, Sequence[Any]] | Sequence[Mapping[Any, Any]],
        output: Sequence[Any],
        *,
        now: datetime | None = None,
        staleness: Mapping[Any, DurationLike] | None = None,
        query_id: str | None = None,
    ) -> BulkResult:
        """Compute `output` for many entities (columns or rows) in one run of the plan."""
        return self._send(self._bulk(input, output, now, staleness, query_id))

    async def query_bulk_async(
        self,
        input: Mapping[Any, Sequence[Any]] | Sequence[Mapping[Any, Any]],
        output: Sequence[Any],
        *,
        now: datetime | None = None,
        staleness: Mapping[Any, DurationLike] | None = None,
        query_id: str | None = None,
    ) -> BulkResult:
        return await self._send_async(self._bulk(input, output, now, staleness, query_id))

    def offline_query(
        self,
        spine: Any,
        output: Sequence[Any],
        *,
        timestamp: str = "ts",
        recompute: bool | Sequence[Any] = True,
        engine: str = "local",
        address: str | None = None,
        progress: Progress | None = None,
    ) -> OfflineResult:
        """Compute `output` for every spine row as of that row's timestamp, on the server."""
        return self._send(
            self._offline(spine, output, timestamp, recompute, engine, address, progress)
        )

    async def offline_query_async(
        self,
        spine: Any,
        output: Sequence[Any],
        *,
        timestamp: str = "ts",
        recompute: bool | Sequence[Any] = True,
        engine: str = "local",
        address: str | None = None,
        progress: Progress | None = None,
    ) -> OfflineResult:
        return await self._send_async(
            self._offline(spine, output, timestamp, recompute, engine, address, progress)
        )

    def _explain(self, input: Iterable[Any], output: Iterable[Any]) -> Call[str]:
        if isinstance(input, str | bytes) or not isinstance(input, Iterable):
            raise InvalidInput("input must list features, e.g. [User.id]", field="input")
        body = {"inputs": [self.name(i) for i in input], "outputs": self._outputs(list(output))}
        return Call(
            "POST",
            "/v1/query/plan",
            lambda answer: str(answer["explain"]),
            _json(body, "input"),
            idempotent=True,
        )

    def _query(
        self,
        input: Mapping[Any, Any],
        output: Sequence[Any],
        now: datetime | None,
        staleness: Mapping[Any, DurationLike] | None,
        query_id: str | None,
    ) -> Call[QueryResult]:
        if not isinstance(input, Mapping):
            raise InvalidInput(
                "input must be a mapping of feature -> value, e.g. "
                "{User.id: 'u1'}; for many entities use query_bulk",
                field="input",
            )
        body = {
            "inputs": {self.name(k): v for k, v in input.items()},
            "outputs": self._outputs(output),
            **_options(now, staleness, query_id, self.name),
        }
        return Call(
            "POST",
            "/v1/query/online",
            lambda answer: QueryResult.from_dict(answer, self.name),
            _json(body, "input"),
        )

    def _bulk(
        self,
        input: Mapping[Any, Sequence[Any]] | Sequence[Mapping[Any, Any]],
        output: Sequence[Any],
        now: datetime | None,
        staleness: Mapping[Any, DurationLike] | None,
        query_id: str | None,
    ) -> Call[BulkResult]:
        body = {
            "inputs": bulk_columns(input, self.name),
            "outputs": self._outputs(output),
            **_options(now, staleness, query_id, self.name),
        }
        return Call(
            "POST",
            "/v1/query/bulk",
            lambda answer: BulkResult.from_dict(answer, self.name),
            _json(body, "input"),
        )

    def _offline(
        self,
        spine: Any,
        output: Sequence[Any],
        timestamp: str,
        recompute: bool | Sequence[Any],
        engine: str,
        address: str | None,
        progress: Progress | None,
    ) -> Call[OfflineResult]:
        for name, given in (("engine", engine != "local"), ("address", address is not None)):
            if given:
                raise InvalidInput(
                    f"{name}: a remote client's offline queries run on the server, on the "
                    "engine it is set up with; leave engine= and address= out",
                    field=name,
                )
        if progress is not None:
            raise InvalidInput(
                "progress: a remote offline query answers once, when every row is done; "
                "leave progress= out",
                field="progress",
            )
        if isinstance(recompute, bool):
            again: bool | list[str] = recompute
        elif isinstance(recompute, Sequence) and not isinstance(recompute, str | bytes):
            again = [self.name(f) for f in recompute]
        else:
            raise InvalidInput("recompute is true, false or a list of features", field="recompute")
        body = {
            "spine": spine_columns(spine),
            "outputs": self._outputs(output),
            "timestamp": timestamp,
            "recompute": again,
        }
        return Call("POST", "/v1/query/offline", OfflineResult.from_dict, _json(body, "spine"))

    # --- sending ----------------------------------------------------------------------------

    def _policy(self, call: Call[Any]) -> dict[str, Any]:
        return {
            "stop": stop_after_attempt(self._attempts if call.idempotent else 1),
            "wait": wait_exponential_jitter(
                multiplier=self._backoff, max=2.0, jitter=self._backoff
            ),
            "retry": retry_if_exception_type(
                (_Transient, httpx.ConnectError, httpx.ConnectTimeout)
            ),
            "reraise": True,
        }

    def _send(self, call: Call[T]) -> T:
        try:
            for attempt in Retrying(**self._policy(call)):
                with attempt:
                    response = self._http.request(call.method, call.path, **call.request())
                    _check_transient(call, response)
        except _Transient as transient:
            response = transient.response
        except httpx.TransportError as error:
            raise self._unreachable(call, error) from None
        return self._answer(call, response)

    async def _send_async(self, call: Call[T]) -> T:
        http = self._async_http()
        try:
            async for attempt in AsyncRetrying(**self._policy(call)):
                with attempt:
                    response = await http.request(call.method, call.path, **call.request())
                    _check_transient(call, response)
        except _Transient as transient:
            response = transient.response
        except httpx.TransportError as error:
            raise self._unreachable(call, error) from None
        return self._answer(call, response)

    def _async_http(self) -> httpx.AsyncClient:
        """The async client of the running event loop (an httpx.AsyncClient lives on one)."""
        loop = asyncio.get_running_loop()
        if self._async is None or self._async_loop is not loop:
            self._async = httpx.AsyncClient(**self._options)
            self._async_loop = loop
        return self._async

    def _unreachable(self, call: Call[Any], error: httpx.TransportError) -> ServerUnavailable:
        where = f"{call.method} {self.url}{call.path}"
        if isinstance(error, httpx.TimeoutException) and not isinstance(
            error, httpx.ConnectTimeout
        ):
            return ServerUnavailable(
                f"the kairos server at {self.url} did not answer {where} within "
                f"{self.timeout:g}s; pass a longer timeout= to RemoteClient for slow queries"
            )
        return ServerUnavailable(
            f"cannot reach the kairos server at {self.url} ({type(error).__name__}: {error}); "
            "check the url and that `kairos serve` is running there"
        )

    def _answer(self, call: Call[T], response: httpx.Response) -> T:
        try:
            body = _body(response)
        except (orjson.JSONDecodeError, CorruptValue):
            body = None
        if response.is_success and body is not None:
            return call.read(body)
        raise self._error(call, response, body)

    def _error(self, call: Call[Any], response: httpx.Response, body: Any) -> KairosError:
        status = response.status_code
        where = f"{call.method} {self.url}{call.path}"
        problem = body.get("error") if isinstance(body, dict) else None
        if not isinstance(problem, dict):
            text = response.text[:200].strip() or response.reason_phrase
            return RemoteError(
                f"{where} answered HTTP {status}, not a kairos answer: {text!r}",
                status=status,
                code="not_kairos",
            )
        code = str(problem.get("code") or "")
        message = str(problem.get("message") or f"HTTP {status}")
        name = problem.get("field")
        name = name if isinstance(name, str) else None
        if code == "unauthorized":
            message = (
                f"the kairos server at {self.url} refused the key: {message}; pass its key "
                "as kr.Client(url=..., key=...)"
            )
        kind = _RAISED.get(code) or (call.not_found if code == "not_found" else _CODES.get(code))
        error = _made(kind or RemoteError, message, status, code, name)
        error.add_note(f"(the server's answer to {where}: HTTP {status} {code})")
        return error

    # --- closing ----------------------------------------------------------------------------

    async def aclose(self) -> None:
        """Close the connection pools."""
        if self._async is not None and self._async_loop is asyncio.get_running_loop():
            await self._async.aclose()
        self._async = None
        self._http.close()

    def close(self) -> None:
        loop = self._async_loop
        if (
            self._async is not None
            and loop is not None
            and not loop.is_closed()
            and not loop.is_running()
        ):
            loop.run_until_complete(self._async.aclose())
        self._async = None
        self._http.close()

    def __enter__(self) -> RemoteClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def __aenter__(self) -> RemoteClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


def _check_transient(call: Call[Any], response: httpx.Response) -> None:
    if call.idempotent and response.status_code in TRANSIENT:
        raise _Transient(response)


def _body(response: httpx.Response) -> Any:
    content_type = response.headers.get("content-type", "").split(";")[0].strip()
    if content_type == TAGGED_JSON:
        return decode(response.content)
    return orjson.loads(response.content) if response.content else None


def _made(
    kind: type[KairosError], message: str, status: int, code: str, name: str | None
) -> KairosError:
    """The error `kind` as the embedded client would raise it."""
    if issubclass(kind, RemoteError):
        return kind(message, status=status, code=code, field=name)
    if issubclass(kind, InvalidInput):
        return kind(message, field=name)
    if issubclass(kind, UnknownModel):
        return kind(message, field=name or "model")
    return kind(message)


def _options(
    now: datetime | None,
    staleness: Mapping[Any, DurationLike] | None,
    query_id: str | None,
    name: Callable[[Any], str],
) -> dict[str, Any]:
    """`now`, `staleness` and `query_id` as a query body carries them (the server checks
    them as the embedded client does)."""
    options: dict[str, Any] = {}
    if now is not None:
        if not isinstance(now, datetime):
            raise InvalidInput(f"now={now!r} must be a datetime", field="now")
        options["now"] = now.isoformat()
    if staleness is not None:
        if not isinstance(staleness, Mapping):
            raise InvalidInput(
                "staleness maps features to durations, e.g. {User.risk: '0s'}", field="staleness"
            )
        options["staleness"] = {
            name(k): v.total_seconds() if isinstance(v, timedelta) else v
            for k, v in staleness.items()
        }
    if query_id is not None:
        options["query_id"] = query_id
    return options


def _moment(value: datetime | DurationLike | None, field: str) -> str | None:
    """A search bound as the server reads it: ISO 8601 time, or a duration back from now."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, datetime):
        return value.isoformat()
    try:
        return format_duration(parse_duration(value, field=field))
    except DefinitionError as error:
        raise InvalidInput(str(error), field=field) from None


class RemoteLog:
    """`client.log` of a remote client: decision records read from the server."""

    def __init__(self, client: RemoteClient) -> None:
        self._client = client

    def get(self, query_id: str) -> LoggedQuery | None:
        """One decision's record, or None."""
        if not isinstance(query_id, str) or not query_id:
            raise InvalidInput("query_id must be a non-empty str", field="query_id")
        call = Call(
            "GET", f"/v1/log/{quote(query_id, safe='')}", LoggedQuery.from_dict, idempotent=True
        )
        try:
            return self._client._send(call)
        except NotFound:
            return None

    def search(
        self,
        *,
        entity: Mapping[Any, Any] | None = None,
        since: datetime | DurationLike | None = None,
        until: datetime | DurationLike | None = None,
        feature: Any = None,
        model: str | None = None,
        limit: int = 100,
    ) -> list[LoggedQuery]:
        """Decisions newest first, found as `client.log.search` finds them embedded."""
        params = []
        for key, value in (entity or {}).items():
            if type(value) not in (str, int):
                raise InvalidInput(
                    f"entity {key!r}: search by a str or int key, got {value!r}", field="entity"
                )
            params.append(("entity", f"{self._client.name(key)}:{value}"))
        for bound, given in (("since", since), ("until", until)):
            text = _moment(given, bound)
            if text is not None:
                params.append((bound, text))
        if feature is not None:
            params.append(("feature", self._client.name(feature)))
        if model is not None:
            params.append(("model", str(model)))
        if isinstance(limit, bool) or not isinstance(limit, int):
            raise InvalidInput(f"limit must be a whole number, got {limit!r}", field="limit")
        params.append(("limit", str(limit)))
        call = Call(
            "GET",
            "/v1/log",
            lambda answer: [LoggedQuery.from_dict(r) for r in answer["records"]],
            params=params,
            idempotent=True,
        )
        return self._client._send(call)


class RemoteModels:
    """`client.models` of a remote client: the server's registry and its predictors."""

    def __init__(self, client: RemoteClient) -> None:
        self._client = client

    def _get(self, path: str, read: Callable[[Any], T]) -> T:
        return self._client._send(Call("GET", path, read, idempotent=True, not_found=UnknownModel))

    def names(self) -> list[str]:
        return self._get("/v1/models", lambda answer: [m["name"] for m in answer["models"]])

    def versions(self, name: str) -> list[ModelVersion]:
        return self._get(
            _path(name), lambda answer: [ModelVersion.from_json(v) for v in answer["versions"]]
        )

    def get(self, name: str, version: int | None = None, alias: str | None = None) -> ModelVersion:
        """One version (by number or alias; the newest when neither is given)."""
        if version is not None and alias is not None:
            raise InvalidInput("pass a version or an alias, not both", field="version")
        if alias is not None:
            aliases = self.aliases(name)
            if alias not in aliases:
                raise UnknownModel(
                    f"model {name!r} has no alias {alias!r}{did_you_mean(alias, aliases)}; "
                    f"its aliases: {', '.join(sorted(aliases)) or 'none'}",
                    field="alias",
                )
            version = aliases[alias]
        if version is None:
            return self.versions(name)[-1]
        return self._get(f"{_path(name)}/versions/{int(version)}", ModelVersion.from_json)

    def aliases(self, name: str) -> dict[str, int]:
        return self._get(f"{_path(name)}/aliases", lambda answer: dict(answer["aliases"]))

    def history(self, name: str, alias: str | None = None) -> list[AliasChange]:
        """Every alias change of `name`, oldest first, each with its time."""
        return self._get(
            f"{_path(name)}/aliases",
            lambda answer: [
                AliasChange.from_json(name, c)
                for c in answer["history"]
                if alias is None or c["alias"] == alias
            ],
        )

    def set_alias(
        self, name: str, alias: str, version: int, *, by: str | None = None
    ) -> AliasChange:
        """Point `alias` at `version`; the server records who did from the key."""
        _no_by(by)
        body = _json({"version": version}, "version")
        return self._client._send(
            Call(
                "PUT",
                f"{_path(name)}/aliases/{quote(alias, safe='')}",
                lambda answer: AliasChange.from_json(name, answer),
                body,
                not_found=UnknownModel,
            )
        )

    def rollback(self, name: str, alias: str, *, by: str | None = None) -> AliasChange:
        """Point `alias` back where it was before its latest move."""
        _no_by(by)
        return self._client._send(
            Call(
                "POST",
                f"{_path(name)}/aliases/{quote(alias, safe='')}/rollback",
                lambda answer: AliasChange.from_json(name, answer),
                b"{}",  # a POST declares JSON: the server refuses one without a body type
                not_found=UnknownModel,
            )
        )

    def predict(
        self, name: str, rows: Any, *, version: int | None = None, alias: str | None = None
    ) -> np.ndarray:
        """Predictions for `rows` (objects keyed by input name, lists, Arrow, pandas or
        NumPy), by the server's predictor."""
        return self._client._send(self._predict(name, rows, version, alias))[1]

    async def predict_async(
        self, name: str, rows: Any, *, version: int | None = None, alias: str | None = None
    ) -> tuple[ModelVersion, np.ndarray]:
        number, predictions = await self._client._send_async(
            self._predict(name, rows, version, alias)
        )
        path = f"{_path(name)}/versions/{number}"
        record = await self._client._send_async(
            Call("GET", path, ModelVersion.from_json, idempotent=True, not_found=UnknownModel)
        )
        return record, predictions

    def _predict(
        self, name: str, rows: Any, version: int | None, alias: str | None
    ) -> Call[tuple[int, np.ndarray]]:
        body = {"rows": _rows(rows), "version": version, "alias": alias}
        return Call(
            "POST",
            f"{_path(name)}/predict",
            lambda answer: (int(answer["version"]), np.asarray(answer["predictions"])),
            _json(body, "rows"),
            idempotent=True,  # a prediction changes nothing on the server
            not_found=UnknownModel,
        )

    def register(
        self,
        name: str,
        artifact: bytes | str | Path,
        *,
        format: str,
        aliases: Sequence[str] = (),
        inputs: Sequence[str] | None = None,
        output: str | None = None,
    ) -> ModelVersion:
        """Register a saved artifact in a safe format (its bytes, or a file's path): `format`
        is one of onnx, skops, xgboost-ubj, xgboost-json, lightgbm-text, catboost-cbm. The
        server infers its schema as `client.models.register` does for a Python object, which
        only an embedded client can send."""
        if isinstance(artifact, (str, Path)):
            path = Path(artifact)
            if not path.is_file():
                raise InvalidInput(f"artifact {str(path)!r} is not a file", field="artifact")
            data = path.read_bytes()
        elif isinstance(artifact, (bytes, bytearray, memoryview)):
            data = bytes(artifact)
        else:
            raise InvalidInput(
                f"a remote client registers an artifact's bytes or path, not a "
                f"{type(artifact).__name__}; save it in a safe format (e.g. skops.io.dumps) "
                "or register the object with an embedded client, kr.Client(project)",
                field="artifact",
            )
        params = [("format", format), ("aliases", ",".join(aliases))]
        params += [("inputs", ",".join(inputs))] if inputs else []
        params += [("output", output)] if output else []
        return self._client._send(
            Call(
                "POST",
                f"{_path(name)}/versions",
                ModelVersion.from_json,
                data,
                params,
                content_type="application/octet-stream",
            )
        )

    def score(self, name: str, data: Any, **options: Any) -> Any:
        raise KairosError(
            f"score with model {name!r} over HTTP by predict(); batch scoring of files "
            "runs where the files are, with an embedded client"
        )


def _path(name: str) -> str:
    if not isinstance(name, str) or not name:
        raise InvalidInput("a model's name is a non-empty str, e.g. 'risk'", field="model")
    return f"/v1/models/{quote(name, safe='')}"


def _no_by(by: str | None) -> None:
    if by is not None:
        raise InvalidInput(
            "by: the server records who moved an alias from the key it was sent (key:<hash>); "
            "leave by= out",
            field="by",
        )


def _rows(rows: Any) -> Any:
    """Model rows as JSON: objects by input name, or lists in input order."""
    if isinstance(rows, np.ndarray):
        return rows.tolist()
    if isinstance(rows, pa.Table):
        return rows.to_pylist()
    if type(rows).__module__.startswith("pandas"):
        return pa.Table.from_pandas(rows, preserve_index=False).to_pylist()
    return rows
