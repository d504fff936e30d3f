"""`POST /v1/replay`: logged decisions re-run with another model version (or alias), or with
features recomputed, answered with the summary and the rows that changed first.

    {"since": "1d", "models": {"risk": 2}}                  by time (and "until", "entity")
    {"query_ids": ["..."], "recompute": ["user.risk"]}      by id
    -> {"summary": {...}, "rows": [{"query_id", "feature", "logged", "replayed", ...}]}

A replay by time takes every decision of its range, newest first, up to 100,000
(`summary.more` says the range held more: narrow it with "until"); "limit" (at most 10,000,
as every listing's) takes only the newest N. The decisions are read and re-run 1,000 at a
time, queries served between, and the reply keeps only its summary's sums and the `rows` it
answers (at most 10,000, changed ones first): a replay costs the memory of a chunk, not of
its range.

New prompts and resolvers are Python definitions: replay them with `client.replay(...)`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from kairos.client.client import Client
from kairos.project.decisions import MAX_PAGE
from kairos.server.bodies import HTTPProblem, json_response, read_json

Handler = Callable[[Request], Awaitable[Response]]
FIELDS = {"query_ids", "since", "until", "entity", "limit", "models", "recompute", "rows"}
MAX_ROWS = MAX_PAGE  # rows a reply carries at most; the summary covers every decision
MAX_DECISIONS = 100_000  # decisions a replay by time takes at most (without "limit")


def replay_routes(client: Client, r: Callable[[str, Handler], Handler]) -> list[Route]:
    async def replay(request: Request) -> Response:
        body = await read_json(request)
        unknown = sorted(set(body) - FIELDS)
        if unknown:
            raise HTTPProblem(
                422,
                "invalid_body",
                f"unknown field {unknown[0]!r}; send {', '.join(sorted(FIELDS))}",
                unknown[0],
            )
        if body.get("query_ids") is None and body.get("since") is None:
            raise HTTPProblem(
                422,
                "invalid_body",
                'say which decisions: "since" (a time or a duration back, e.g. "1d") or '
                '"query_ids"',
                "since",
            )
        rows = _int(body.get("rows", 1000), "rows", 0, MAX_ROWS)
        limit = body.get("limit")
        result = await client.replay_async(
            body.get("query_ids"),
            since=body.get("since"),
            until=body.get("until"),
            entity=_mapping(body.get("entity"), "entity"),
            limit=MAX_DECISIONS if limit is None else _int(limit, "limit", 1, MAX_PAGE),
            models=_mapping(body.get("models"), "models"),
            recompute=_strings(body.get("recompute", []), "recompute"),
            keep=rows,
        )
        return json_response(result.to_dict(rows))

    return [Route("/v1/replay", r("replay", replay), methods=["POST"])]


def _int(value: Any, field: str, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise HTTPProblem(422, "invalid_body", f"{field} must be an integer {low}..{high}", field)
    return value


def _mapping(value: Any, field: str) -> dict[str, Any] | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise HTTPProblem(
            422, "invalid_body", f'{field} must be an object, e.g. {{"risk": 2}}', field
        )
    return value


def _strings(value: Any, field: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise HTTPProblem(422, "invalid_body", f"{field} must be a list of feature names", field)
    return value
