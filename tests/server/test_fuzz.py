"""Schemathesis over the server's own OpenAPI document: whatever fits (or almost fits) the
documented bodies and paths, the server answers without a 5xx, and every error is JSON.

The operations come from `openapi_document()`, the function `GET /openapi.json` serves (the
first test checks they are the same), so collecting this module does no I/O: the lazy
`schemathesis.pytest.from_fixture` loader needs `Item._nodeid`, which pytest 9 removed.
"""

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
import schemathesis
from hypothesis import settings
from schemathesis.checks import not_a_server_error
from schemathesis.core import NOT_SET
from starlette.applications import Starlette

import kairos as kr
from kairos.server import create_app
from kairos.server.openapi import openapi_document
from tests.server.fraud import PROJECT

schema = schemathesis.openapi.from_dict(openapi_document())
BASE_URL = "http://127.0.0.1"
LOOPBACK = {"host": "127.0.0.1"}


@pytest.fixture(scope="module")
def fuzzed_app(fraud_db: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Starlette]:
    log = tmp_path_factory.mktemp("fuzz") / "query_log.db"
    with kr.Client(PROJECT, query_log=f"sqlite:///{log}") as client:
        yield create_app(client)


def reached_the_route(ctx: Any, response: Any, case: Any) -> None:
    """The request got past the guard (kairos.server.guard): a loopback Host, no Origin and a
    body of the documented type are never refused, so every such case exercises its route
    (a case that leaves out a required body is rightly a 415)."""
    seen = (case.method, case.path, response.content)
    assert response.status_code != 403, seen
    documented = case.operation.definition.raw.get("requestBody", {}).get("content", {})
    sent = response.request.headers.get("Content-Type") or ""  # as sent, overrides too
    sent = sent.partition(";")[0].strip().lower()
    if documented and (case.body is NOT_SET or sent not in documented):
        assert response.status_code == 415, seen  # schemathesis trying another type: refused
    else:
        assert response.status_code != 415, seen


def errors_are_json(ctx: Any, response: Any, case: Any) -> None:
    """Every 4xx/5xx is `{"error": {"code", "message", ...}}` (schemathesis check)."""
    if response.status_code < 400:
        return
    body = orjson.loads(response.content)
    assert isinstance(body, dict) and set(body) == {"error"}, body
    assert isinstance(body["error"]["code"], str), body
    assert isinstance(body["error"]["message"], str) and body["error"]["message"], body


def test_the_fuzzed_document_is_the_one_the_app_serves(fuzzed_app: Starlette) -> None:
    served = schemathesis.openapi.from_asgi("/openapi.json", fuzzed_app, headers=LOOPBACK)
    assert served.raw_schema == openapi_document()
    assert len(list(schema.get_all_operations())) == 19


@pytest.mark.slow
@schema.parametrize()
# derandomize: the same cases every run, so a red run is a real change, never luck
@settings(max_examples=30, deadline=None, derandomize=True, database=None)
def test_no_input_makes_a_server_error(case: schemathesis.Case[Any], fuzzed_app: Starlette) -> None:
    case.call_and_validate(
        app=fuzzed_app,
        base_url=BASE_URL,  # without keys the server answers this machine's names only
        checks=[not_a_server_error, errors_are_json, reached_the_route],
    )
