"""Schemathesis over the gateway's own OpenAPI document (`GET /openapi.json` on `kairos gateway
serve`): whatever fits (or almost fits) the documented bodies, paths and queries, the gateway
answers without a 5xx, and every error is JSON in its route's shape, a 400 or 422 naming the
field (`param`; in the message on Anthropic's routes, whose errors have no param).

The gateway runs module-wide on kairos' own HTTP server on 127.0.0.1 in front of the fake
upstream, with a key; its model groups carry the names the document's examples use, so the
examples reach the provider. The operations come from `openapi_document()`, the function the
route serves (the first tests check they are the same and that they are the app's routes), so
collecting this module does no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.core.result import Ok

from kairos.gateway import Gateway
from kairos.gateway.app import GatewayApp, create_gateway_app
from kairos.gateway.openapi import openapi_document
from tests.gateway.conftest import ADMIN_KEY, config, deployment, new_key
from tests.gateway.fake_upstream import FakeUpstream, ServerThread

ROOT = Path(__file__).resolve().parents[2]
schema = schemathesis.openapi.from_dict(openapi_document())
MODELS = {
    "gpt-4o-mini": {"deployments": [deployment("echo")]},
    "text-embedding-3-small": {"deployments": [deployment("echo")]},
    "claude-haiku-4-5": {"deployments": [{**deployment("echo"), "provider": "claude"}]},
}
# routes with an id in the path, as the document writes them
TEMPLATES = {"/admin/keys/{id}": ("DELETE",), "/v1/models/{model}": ("GET",)}


@pytest.fixture(scope="module")
def gateway(
    upstream: FakeUpstream, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerThread]:
    """The gateway served by kairos' own server; `gateway.key` is a key without limits."""
    folder = tmp_path_factory.mktemp("openapi")
    served = Gateway(config(upstream, folder, models=MODELS))
    app = create_gateway_app(served)
    with ServerThread(app, kairos=True) as server:
        server.gateway, server.app = served, app  # type: ignore[attr-defined]
        server.key = new_key(server)  # type: ignore[attr-defined]
        yield server
        server.call(served.close())


def test_the_fuzzed_document_is_the_one_the_gateway_serves(gateway: ServerThread) -> None:
    served = httpx.get(f"{gateway.url}/openapi.json")
    assert served.status_code == 200
    assert served.headers["content-type"] == "application/json"
    assert served.json() == openapi_document()


def test_the_document_describes_the_apps_routes(gateway: ServerThread) -> None:
    app: GatewayApp = gateway.app  # type: ignore[attr-defined]
    results = list(schema.get_all_operations())
    assert all(isinstance(result, Ok) for result in results)
    routes = {(method, path) for path, methods in app.routes.items() for method in methods}
    routes |= {(method, path) for path, methods in TEMPLATES.items() for method in methods}
    documented = {
        (operation.method.upper(), operation.path)
        for operation in (result.ok() for result in results if isinstance(result, Ok))
    }
    assert documented == routes


def _bounded_fields(node: Any, name: str = "") -> Iterator[str]:
    """The names of the document's properties that have a maximum or a longest length."""
    if isinstance(node, dict):
        if name and any(k in node for k in ("maximum", "maxLength", "maxItems")):
            yield name
        for key, value in node.items():
            if key == "properties":
                for field, spec in value.items():
                    yield from _bounded_fields(spec, field)
            elif key != "example":
                yield from _bounded_fields(value)
    elif isinstance(node, list):
        for item in node:
            yield from _bounded_fields(item)


def test_docs_list_every_bound_the_document_has() -> None:
    table = (ROOT / "docs" / "gateway.md").read_text().split("What a client may send", 1)[1]
    fields = set(_bounded_fields(openapi_document()))
    missing = {f for f in fields if re.search(rf"[`.]{re.escape(f)}`", table) is None}
    assert missing == set()


# --- what the fuzz found, each pinned ----------------------------------------------------------


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/messages", "/admin/keys"])
@pytest.mark.parametrize("raw", [b"", b'{"model": ', b"\xff\xfe"], ids=["empty", "cut", "bytes"])
def test_a_body_that_is_not_json_is_a_400_naming_the_body(
    gateway: ServerThread, path: str, raw: bytes
) -> None:
    token = ADMIN_KEY if path.startswith("/admin") else gateway.key  # type: ignore[attr-defined]
    response = httpx.post(
        f"{gateway.url}{path}", content=raw, headers={"authorization": f"Bearer {token}"}
    )
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert "JSON" in error["message"] and error.get("param", "body") == "body", error


@pytest.mark.parametrize("path", ["/v1/messages", "/v1/messages/count_tokens"])
def test_a_method_anthropics_routes_do_not_take_is_refused_in_anthropics_shape(
    gateway: ServerThread, path: str
) -> None:
    response = httpx.request("TRACE", f"{gateway.url}{path}")
    assert response.status_code == 405
    assert response.json() == {
        "type": "error",
        "error": {
            "type": "invalid_request_error",
            "message": f"TRACE is not allowed on {path}",
        },
    }


def _names_the_field(body: dict[str, Any], path: str) -> bool:
    """A 400 or 422 says which field is at fault: OpenAI's `param` (the body as a whole:
    "body"), or on Anthropic's routes a message naming it (they have no param)."""
    error = body["error"]
    if path.startswith("/v1/messages"):
        return bool(error["message"])
    return isinstance(error["param"], str)  # "" too: a field may be named so


def errors_are_json(ctx: Any, response: Any, case: Any) -> None:
    """Every 4xx/5xx is the route's JSON error; a 400 or 422 names the field (a check)."""
    if response.status_code < 400:
        return
    body = orjson.loads(response.content)
    assert isinstance(body, dict), body
    error = body.get("error")
    assert isinstance(error, dict) and isinstance(error.get("message"), str), body
    assert error["message"], body
    if case.path.startswith("/v1/messages"):
        assert body.get("type") == "error" and isinstance(error.get("type"), str), body
    else:
        assert set(error) == {"message", "type", "param", "code"}, body
    if response.status_code in (400, 422):
        assert _names_the_field(body, case.path), body


@pytest.mark.slow
@schema.parametrize()
# derandomize: the same cases every run, so a red run is a real change, never luck
@settings(
    max_examples=25,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
def test_no_input_makes_a_server_error(case: schemathesis.Case[Any], gateway: ServerThread) -> None:
    admin = case.path.startswith("/admin")
    token = ADMIN_KEY if admin else gateway.key  # type: ignore[attr-defined]
    case.call_and_validate(
        base_url=gateway.url,
        headers={"authorization": f"Bearer {token}"},
        checks=[not_a_server_error, errors_are_json],
        timeout=30,
    )
