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
from datetime import datetime, timedelta
from typing import Any, TypeVar

import httpx
import orjson
from tenacity import (
    AsyncRetrying,
    Retrying,
    retry_if_exception_type,
    stop_after_attempt,
    wait_exponential_jitter,
)

from kairos.client.remote_registry import RemoteLog, RemoteModels
from kairos.client.wire import (
    _CODES,
    _RAISED,
    Call,
    RemoteError,
    ServerUnavailable,
    _body,
    _check_transient,
    _json,
    _made,
    _Transient,
    feature_name,
)
from kairos.definitions.durations import DurationLike
from kairos.engine.result import BulkResult, QueryResult
from kairos.errors import (
    InvalidInput,
    KairosError,
)
from kairos.project.inputs import bulk_columns
from kairos.project.offline import OfflineResult, Progress, spine_columns
from kairos.stores.codec import TAGGED_JSON, CorruptValue

T = TypeVar("T")


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
