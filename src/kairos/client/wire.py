"""The wire under `RemoteClient`: a request as a frozen `Call` (its answer's reader, whether
it may be sent again), the errors a server's answer is raised as, and how values are written
as JSON and read back.

    Call("GET", "/v1/models", lambda answer: answer["models"], idempotent=True)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta
from typing import Any, Generic, Protocol, TypeVar

import httpx
import orjson

from kairos.definitions.durations import DurationLike, format_duration, parse_duration
from kairos.definitions.feature import ref_of, window_name
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
)
from kairos.models.errors import SchemaMismatch, TamperedArtifact, UnknownModel, UnsupportedModel
from kairos.stores.codec import TAGGED_JSON, decode
from kairos.stores.query_log import QueryLogError

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


class Transport(Protocol):
    """What sends a `Call` and reads its answer (a `RemoteClient`), and names features as
    the server does."""

    def _send(self, call: Call[T]) -> T: ...

    async def _send_async(self, call: Call[T]) -> T: ...

    def name(self, feature: Any) -> str: ...
