"""A client's text is bounded wherever the gateway keeps or repeats it: a requested model name
over 256 characters is a 400, a ledger row keeps at most 256, and no error, admin listing or
metric sends back (or keeps) a client's long string whole. Over HTTP, on kairos' own server."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from kairos.gateway.bounds import MAX_MODEL_NAME
from tests.gateway.conftest import ADMIN_KEY, new_key
from tests.gateway.fake_upstream import FakeUpstream, ServerThread

HI = [{"role": "user", "content": "hi"}]
ADMIN = {"authorization": f"Bearer {ADMIN_KEY}"}
MEGABYTE = "m" * 1_000_000
SMALL = 4_096  # bytes an error body stays under, whatever the request held
ROUTES: list[tuple[str, dict[str, Any]]] = [
    ("/v1/chat/completions", {"messages": HI}),
    ("/v1/completions", {"prompt": "hi"}),
    ("/v1/embeddings", {"input": "hi"}),
    ("/v1/responses", {"input": "hi"}),
    ("/v1/messages", {"messages": HI, "max_tokens": 5}),
    ("/v1/messages/count_tokens", {"messages": HI}),
]


def post(server: ServerThread, path: str, key: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{server.url}{path}", json=body, headers={"authorization": f"Bearer {key}"})


def usage(server: ServerThread) -> httpx.Response:
    return httpx.get(f"{server.url}/admin/usage?rows=1", headers=ADMIN)


@pytest.mark.parametrize(("path", "body"), ROUTES, ids=[path for path, _ in ROUTES])
def test_a_model_name_over_256_characters_is_a_400(
    served: ServerThread, upstream: FakeUpstream, path: str, body: dict[str, Any]
) -> None:
    key = new_key(served)
    for model in ("x" * (MAX_MODEL_NAME + 1), MEGABYTE):
        response = post(served, path, key, {**body, "model": model})
        assert response.status_code == 400, response.text[:300]
        assert len(response.content) < SMALL
        error = response.json()["error"]
        assert "model" in error["message"] and str(MAX_MODEL_NAME) in error["message"], error
        assert error.get("param", "model") == "model"
    # at the bound, the name is looked up (there is no such model) and its row keeps it whole
    longest = "y" * MAX_MODEL_NAME
    assert post(served, path, key, {**body, "model": longest}).status_code == 404
    rows = usage(served).json()["rows"]
    assert [row["model_requested"] for row in rows] == [longest]
    assert upstream.received == []


def test_five_calls_naming_1_mb_models_leave_the_usage_small(served: ServerThread) -> None:
    key = new_key(served)
    for index, (path, body) in enumerate(ROUTES[:5]):
        response = post(served, path, key, {**body, "model": f"{index}{MEGABYTE}"})
        assert response.status_code == 400 and len(response.content) < SMALL
    assert post(served, "/v1/chat/completions", key, {"model": "chat", "messages": HI}).is_success
    assert len(usage(served).content) < 200_000


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        # a field name of 1 MB, where only some names are taken
        ("/v1/messages", {"model": "chat", "messages": HI, "max_tokens": 5, MEGABYTE: 1}, None),
        ("/v1/messages/count_tokens", {"model": "chat", "messages": HI, MEGABYTE: 1}, None),
        # a block or part type of 1 MB
        (
            "/v1/messages",
            {"model": "chat", "max_tokens": 5,
             "messages": [{"role": "user", "content": [{"type": MEGABYTE}]}]},
            "messages[0].content[0].type",
        ),
        # a value that cannot be sent to an Anthropic deployment, quoted in the 400
        ("/v1/responses", {"model": "claude", "input": "hi", "truncation": MEGABYTE},
         "truncation"),
        (
            "/v1/chat/completions",
            {"model": "claude", "messages": HI,
             "tool_choice": {"type": "function", "function": {"name": MEGABYTE}}},
            "tools",
        ),
        # a field name of 1 MB on a message, and in a body, for an Anthropic deployment
        (
            "/v1/chat/completions",
            {"model": "claude", "messages": [{"role": "user", "content": "hi", MEGABYTE: 1}]},
            "messages[0]." + "m" * 45 + "...",
        ),
        ("/v1/responses", {"model": "claude", "input": "hi", MEGABYTE: 1}, "m" * 57 + "..."),
        (
            "/v1/chat/completions",
            {"model": "claude", "messages": [{"role": MEGABYTE, "content": "hi"}]},
            "messages[0].role",
        ),
        # a model name in the path
        ("/v1/models/" + "q" * 60_000, None, "model"),
    ],
    ids=["messages field", "count_tokens field", "block type", "responses value", "tool_choice",
         "message field", "responses field", "role", "model path"],
)  # fmt: skip
def test_errors_quote_a_clients_long_text_cut_short(
    served: ServerThread,
    upstream: FakeUpstream,
    path: str,
    body: dict[str, Any] | None,
    field: str | None,
) -> None:
    key = new_key(served)
    if body is None:
        response = httpx.get(f"{served.url}{path}", headers={"authorization": f"Bearer {key}"})
    else:
        response = post(served, path, key, body)
    assert 400 <= response.status_code < 500, response.text[:300]
    assert len(response.content) < SMALL, response.text[:300]
    error = response.json()["error"]
    if field is not None and "param" in error:
        assert error["param"] == field, error
    assert upstream.received == []


def test_admin_routes_keep_and_quote_no_long_text(served: ServerThread) -> None:
    created = httpx.post(
        f"{served.url}/admin/keys", json={"name": "team", "models": [MEGABYTE]}, headers=ADMIN
    )
    assert created.status_code == 422 and len(created.content) < SMALL, created.text[:300]
    assert created.json()["error"]["param"] == "models"
    unknown = httpx.post(
        f"{served.url}/admin/keys", json={"name": "team", MEGABYTE: 1}, headers=ADMIN
    )
    assert unknown.status_code == 422 and len(unknown.content) < SMALL, unknown.text[:300]
    gone = httpx.delete(f"{served.url}/admin/keys/{'k' * 60_000}", headers=ADMIN)
    assert gone.status_code == 404 and len(gone.content) < SMALL, gone.text[:300]
    listed = httpx.get(f"{served.url}/admin/keys", headers=ADMIN)
    assert listed.json()["keys"] == [] and len(listed.content) < SMALL


@pytest.mark.parametrize("moment", ["0001-01-01T00:00:00+05:00", "9999-12-31T23:59:59-05:00"])
def test_a_key_cannot_expire_past_the_calendars_ends(served: ServerThread, moment: str) -> None:
    """expires_at is stored in UTC: one that falls outside years 1-9999 there could not be
    read back, and every listing of keys (and every call with the key) would fail."""
    created = httpx.post(
        f"{served.url}/admin/keys", json={"name": "team", "expires_at": moment}, headers=ADMIN
    )
    assert created.status_code == 422, created.text[:300]
    assert created.json()["error"]["param"] == "expires_at"
    listed = httpx.get(f"{served.url}/admin/keys", headers=ADMIN)
    assert listed.status_code == 200 and listed.json()["keys"] == []
    # the same instants, written in UTC's own terms, are the calendar's ends and are taken
    for edge in ("0001-01-01T05:00:00+05:00", "9999-12-31T18:59:59-05:00"):
        created = httpx.post(
            f"{served.url}/admin/keys", json={"name": "team", "expires_at": edge}, headers=ADMIN
        )
        assert created.status_code == 201, created.text[:300]
    assert httpx.get(f"{served.url}/admin/keys", headers=ADMIN).status_code == 200


def test_metrics_name_no_model_the_gateway_does_not_serve(served: ServerThread) -> None:
    """A refused call's row names the model asked for; the metrics label it as unknown, so
    clients cannot add a time series per name they make up."""
    key = new_key(served)
    names = [f"made-up-{index}" for index in range(20)]
    for name in names:
        assert (
            post(served, "/v1/chat/completions", key, {"model": name, "messages": HI}).status_code
            == 404
        )
    assert post(served, "/v1/chat/completions", key, {"model": "chat", "messages": HI}).is_success
    served.call(served.gateway.drain())  # type: ignore[attr-defined]
    metrics = httpx.get(f"{served.url}/metrics").text
    assert not any(name in metrics for name in names)
    assert 'model="chat"' in metrics and 'status="model_not_found"' in metrics
