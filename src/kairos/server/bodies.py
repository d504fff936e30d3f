"""JSON bodies of the HTTP server: read a request's, answer a value or a problem (an error
with a status and a JSON body, never a stack trace)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response

from kairos.stores.codec import TAGGED_JSON, UnencodableValue, encode

MAX_BODY = 4 * 1024 * 1024


class HTTPProblem(Exception):
    """An error answered with a status and a JSON body; never a stack trace."""

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        field: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.field = field
        self.headers = headers or {}


def _default(value: Any) -> Any:
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, set | frozenset | tuple):
        return list(value)
    return str(value)


def json_response(body: Any, status: int = 200, *, tagged: bool = False) -> Response:
    """`body` as JSON; with `tagged`, as the codec's tagged JSON (datetimes, bytes, tuples...
    kept as themselves) unless a value is one the codec cannot keep."""
    if tagged:
        try:
            return Response(encode(body), status_code=status, media_type=TAGGED_JSON)
        except UnencodableValue:
            pass  # plain JSON below: such a value as its text
    try:
        data = orjson.dumps(body, default=_default, option=orjson.OPT_NON_STR_KEYS)
    except orjson.JSONEncodeError:  # an int past 64 bits (a logged value): as its digits
        data = orjson.dumps(_wide_ints(body), default=_default, option=orjson.OPT_NON_STR_KEYS)
    return Response(data, status_code=status, media_type="application/json")


def _wide_ints(tree: Any) -> Any:
    """`tree` with every int orjson cannot write (beyond 64 bits) as its decimal text."""
    if isinstance(tree, bool):
        return tree
    if isinstance(tree, int):
        return tree if -(2**63) <= tree < 2**64 else str(tree)
    if isinstance(tree, dict):
        return {key: _wide_ints(value) for key, value in tree.items()}
    if isinstance(tree, list | tuple | set | frozenset):
        return [_wide_ints(item) for item in tree]
    return tree


def wants_tagged(request: Request) -> bool:
    """Whether the caller asked for tagged JSON (a remote kairos client does)."""
    return TAGGED_JSON in request.headers.get("accept", "")


def problem_response(problem: HTTPProblem) -> Response:
    error: dict[str, Any] = {"code": problem.code, "message": problem.message}
    if problem.field:
        error["field"] = problem.field
    response = json_response({"error": error}, problem.status)
    response.headers.update(problem.headers)
    return response


def too_large(request: Request, limit: int) -> bool:
    """Whether the request's Content-Length already says its body is over `limit` bytes (a
    malformed one is left to the server's HTTP parser and the read's own count).

    `str.isdigit` alone is not enough: it accepts "²", which `int` refuses."""
    declared = request.headers.get("content-length", "")
    return declared.isascii() and declared.isdigit() and int(declared) > limit


async def read_json(request: Request) -> dict[str, Any]:
    if too_large(request, MAX_BODY):
        raise HTTPProblem(413, "too_large", f"the body is over {MAX_BODY} bytes")
    raw = await request.body()
    if len(raw) > MAX_BODY:
        raise HTTPProblem(413, "too_large", f"the body is over {MAX_BODY} bytes")
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as error:
        raise HTTPProblem(400, "malformed_json", f"the body is not valid JSON: {error}") from None
    if not isinstance(body, dict):
        raise HTTPProblem(422, "invalid_body", "the body must be a JSON object", "body")
    return body
