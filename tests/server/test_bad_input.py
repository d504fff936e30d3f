"""Bad input is a 4xx with a JSON body naming the field or feature and the fix; never a 5xx,
never a stack trace."""

import json
from typing import Any
from urllib.parse import quote

import httpx
import pytest

from examples.fraud.generate import ANCHOR
from kairos.server.bodies import MAX_BODY
from tests.server.fraud import error_of, online_body

pytestmark = pytest.mark.anyio

NOW = ANCHOR.isoformat()
JSON = {"content-type": "application/json"}  # raw bodies below are sent as JSON
ONE = {"inputs": {"user.id": "u0001"}, "outputs": ["user.name"]}
MANY = {"inputs": {"user.id": ["u0001"]}, "outputs": ["user.name"]}
PLAN = {"inputs": ["user.id"], "outputs": ["user.name"]}


def without(body: dict[str, Any], key: str) -> dict[str, Any]:
    return {k: v for k, v in body.items() if k != key}


# how a message says what to send instead
FIXES = ("e.g.", "use inputs, outputs", "1-128 letters", "must be a JSON object")
# (path, body, field the 422 names)
SHAPE_ERRORS = [
    ("/v1/query/online", [ONE], "body"),
    ("/v1/query/online", "user.id=u0001", "body"),
    ("/v1/query/online", None, "body"),
    ("/v1/query/online", 42, "body"),
    ("/v1/query/online", without(ONE, "outputs"), "outputs"),
    ("/v1/query/online", {**ONE, "outputs": []}, "outputs"),
    ("/v1/query/online", {**ONE, "outputs": "user.name"}, "outputs"),
    ("/v1/query/online", {**ONE, "outputs": [1]}, "outputs"),
    ("/v1/query/online", {**ONE, "outputs": [None]}, "outputs"),
    ("/v1/query/online", without(ONE, "inputs"), "inputs"),
    ("/v1/query/online", {**ONE, "inputs": ["u0001"]}, "inputs"),
    ("/v1/query/online", {**ONE, "inputs": "u0001"}, "inputs"),
    ("/v1/query/online", {**ONE, "now": 1780315200}, "now"),
    ("/v1/query/online", {**ONE, "now": "yesterday"}, "now"),
    ("/v1/query/online", {**ONE, "now": ["2026-06-01"]}, "now"),
    ("/v1/query/online", {**ONE, "staleness": ["user.name", "0s"]}, "staleness"),
    ("/v1/query/online", {**ONE, "staleness": "0s"}, "staleness"),
    ("/v1/query/online", {**ONE, "staleness": {"user.name": True}}, "staleness"),
    ("/v1/query/online", {**ONE, "staleness": {"user.name": {"s": 1}}}, "staleness"),
    ("/v1/query/online", {**ONE, "query_id": 7}, "query_id"),
    ("/v1/query/online", {**ONE, "query_id": ""}, "query_id"),
    ("/v1/query/online", {**ONE, "query_id": "q" * 129}, "query_id"),
    ("/v1/query/online", {**ONE, "output": ["user.name"]}, "output"),
    ("/v1/query/online", {**ONE, "user.id": "u0001"}, "user.id"),
    ("/v1/query/bulk", {**MANY, "inputs": {"user.id": "u0001"}}, "inputs"),
    ("/v1/query/bulk", {**MANY, "inputs": {"user.id": {"0": "u0001"}}}, "inputs"),
    ("/v1/query/bulk", {**MANY, "inputs": [{"user.id": "u0001"}]}, "inputs"),
    ("/v1/query/bulk", {**MANY, "outputs": []}, "outputs"),
    ("/v1/query/bulk", {**MANY, "now": False}, "now"),
    ("/v1/query/bulk", {**MANY, "rows": 1}, "rows"),
    ("/v1/query/plan", {**PLAN, "inputs": "user.id"}, "inputs"),
    ("/v1/query/plan", {**PLAN, "inputs": [1]}, "inputs"),
    ("/v1/query/plan", without(PLAN, "outputs"), "outputs"),
    ("/v1/query/plan", {**PLAN, "explain": True}, "explain"),
]


@pytest.mark.parametrize(("path", "body", "field"), SHAPE_ERRORS)
async def test_a_body_of_the_wrong_shape_is_a_422_naming_the_field(
    http: httpx.AsyncClient, path: str, body: Any, field: str
) -> None:
    error = error_of(await http.post(path, content=json.dumps(body).encode(), headers=JSON), 422)
    assert error["field"] == field
    assert field in error["message"]
    assert any(fix in error["message"] for fix in FIXES), error["message"]


@pytest.mark.parametrize("raw", [b'{"inputs": {"user.id": "u0001"}', b"", b"\xff\xfe", b"{'a': 1}"])
@pytest.mark.parametrize("path", ["/v1/query/online", "/v1/query/bulk", "/v1/query/plan"])
async def test_malformed_json_is_a_400(http: httpx.AsyncClient, path: str, raw: bytes) -> None:
    error = error_of(await http.post(path, content=raw, headers=JSON), 400)
    assert error["code"] == "malformed_json"
    assert "not valid JSON" in error["message"]


@pytest.mark.parametrize(
    ("path", "body", "named", "hint"),
    [
        ("/v1/query/online", {**ONE, "outputs": ["user.rsik"]}, "user.rsik", "user.risk"),
        ("/v1/query/online", {**ONE, "outputs": ["user.declines[1d]"]}, "[1d]", "declines[7d]"),
        ("/v1/query/online", {**ONE, "inputs": {"user.idd": "u0001"}}, "user.idd", "user.id"),
        ("/v1/query/bulk", {**MANY, "outputs": ["user.emial"]}, "user.emial", "user.email"),
        ("/v1/query/plan", {**PLAN, "outputs": ["usr.name"]}, "usr.name", "user.name"),
    ],
)
async def test_an_unknown_feature_is_a_422_with_did_you_mean(
    http: httpx.AsyncClient, path: str, body: dict[str, Any], named: str, hint: str
) -> None:
    error = error_of(await http.post(path, json=body), 422)
    assert error["code"] == "UnknownFeature"
    assert named in error["message"]
    assert "did you mean '" in error["message"]
    assert f"{hint}'?" in error["message"]


async def test_a_windowed_feature_without_a_window_says_which_windows_exist(
    http: httpx.AsyncClient,
) -> None:
    body = {**ONE, "outputs": ["user.txn_count"]}
    error = error_of(await http.post("/v1/query/online", json=body), 422)
    assert "user.txn_count[1d]" in error["message"]
    assert "user.txn_count[7d]" in error["message"]


@pytest.mark.parametrize("value", [1, 1.5, True, None, ["u0001"], {"id": "u0001"}])
async def test_an_input_of_the_wrong_type_is_a_422_naming_the_input(
    http: httpx.AsyncClient, value: Any
) -> None:
    body = {**ONE, "inputs": {"user.id": value}}
    error = error_of(await http.post("/v1/query/online", json=body), 422)
    assert "'user.id'" in error["message"]
    assert "str" in error["message"]  # the type it should be


async def test_a_bulk_input_of_the_wrong_type_names_the_row(http: httpx.AsyncClient) -> None:
    body = {**MANY, "inputs": {"user.id": ["u0001", "u0002", 3]}}
    error = error_of(await http.post("/v1/query/bulk", json=body), 422)
    assert "'user.id' (row 2)" in error["message"]


async def test_bulk_columns_of_different_lengths_are_a_422(http: httpx.AsyncClient) -> None:
    body = {**MANY, "inputs": {"user.id": ["u0001"], "user.email": ["a@b", "c@d"]}}
    error = error_of(await http.post("/v1/query/bulk", json=body), 422)
    assert "user.id=1" in error["message"] and "user.email=2" in error["message"]


async def test_a_query_without_its_key_says_which_input_to_pass(http: httpx.AsyncClient) -> None:
    body = {"inputs": {"user.name": "User 1"}, "outputs": ["user.risk"]}
    error = error_of(await http.post("/v1/query/online", json=body), 422)
    assert "'user.id'" in error["message"]


@pytest.mark.parametrize("duration", ["banana", "-5m", -1, "5 parsecs"])
async def test_a_staleness_that_is_no_duration_is_a_4xx_naming_the_feature(
    http: httpx.AsyncClient, duration: Any
) -> None:
    body = {**ONE, "staleness": {"user.name": duration}}
    response = await http.post("/v1/query/online", json=body)
    # documented as "a bad option" (400); 422 would fit as well
    error = error_of(response, response.status_code)
    assert response.status_code in (400, 422)
    assert "staleness['user.name']" in error["message"]
    assert "e.g." in error["message"] or ">= 0" in error["message"]


async def test_an_unknown_route_is_a_404_in_json(http: httpx.AsyncClient) -> None:
    error = error_of(await http.get("/v1/query/onlin"), 404)
    assert "/v1/query/onlin" in error["message"]
    error_of(await http.post("/v2/query/online", json=ONE), 404)


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/v1/query/online"),
        ("PUT", "/v1/query/bulk"),
        ("GET", "/v1/query/plan"),
        ("DELETE", "/v1/log/abc"),
        ("POST", "/healthz"),
        ("POST", "/metrics"),
    ],
)
async def test_a_wrong_method_is_a_405_in_json(
    http: httpx.AsyncClient, method: str, path: str
) -> None:
    error = error_of(await http.request(method, path, json=ONE), 405)
    assert method in error["message"]


async def test_a_405_says_which_methods_are_allowed(http: httpx.AsyncClient) -> None:
    response = await http.get("/v1/query/online")
    assert response.status_code == 405
    assert response.headers.get("allow") == "POST"


async def test_an_oversized_body_is_a_413(http: httpx.AsyncClient) -> None:
    raw = b'{"inputs": {"user.id": "u0001"}, "outputs": ["user.name"]' + b" " * MAX_BODY + b"}"
    error = error_of(await http.post("/v1/query/online", content=raw, headers=JSON), 413)
    assert error["code"] == "too_large"
    just_fits = b'{"inputs": {"user.id": "u0001"}, "outputs": ["user.name"]}'
    just_fits = just_fits[:-1] + b" " * (MAX_BODY - len(just_fits)) + b"}"
    fits = await http.post("/v1/query/online", content=just_fits, headers=JSON)
    assert fits.status_code == 200


# --- bugs: inputs that reach a 5xx or are accepted and then lost ---------------------------


@pytest.mark.parametrize("now", ["0001-01-01T00:00:00+05:00", "9999-12-31T23:59:59-05:00"])
async def test_a_now_out_of_range_is_a_422_naming_now(http: httpx.AsyncClient, now: str) -> None:
    error = error_of(await http.post("/v1/query/online", json={**ONE, "now": now}), 422)
    assert error.get("field") == "now" or "now" in error["message"]


@pytest.mark.parametrize("duration", [1e300, "99999999999d"])
async def test_a_staleness_too_large_is_a_4xx(http: httpx.AsyncClient, duration: Any) -> None:
    body = {**ONE, "staleness": {"user.name": duration}}
    response = await http.post("/v1/query/online", json=body)
    assert response.status_code in (400, 422), response.text
    assert "staleness" in error_of(response, response.status_code)["message"]


async def test_a_staleness_for_an_unknown_feature_is_a_422_with_did_you_mean(
    http: httpx.AsyncClient,
) -> None:
    body = {**ONE, "now": NOW, "staleness": {"user.nme": "0s"}}
    error = error_of(await http.post("/v1/query/online", json=body), 422)
    assert "did you mean 'user.name'" in error["message"]


@pytest.mark.parametrize("query_id", ["a\x00b", "team/decision-1"])
async def test_every_query_id_the_server_accepts_can_be_read_back(
    http: httpx.AsyncClient, query_id: str
) -> None:
    response = await http.post("/v1/query/online", json={**ONE, "query_id": query_id})
    if response.status_code == 422:  # refusing it up front is fine too
        assert error_of(response, 422)["field"] == "query_id"
        return
    assert response.status_code == 200
    logged = await http.get(f"/v1/log/{quote(query_id, safe='')}")
    assert logged.status_code == 200, logged.text
    assert logged.json()["query_id"] == query_id


async def test_a_reused_query_id_never_reads_back_another_decision(
    http: httpx.AsyncClient,
) -> None:
    first = await http.post("/v1/query/online", json=online_body("u0001", query_id="same"))
    second = await http.post("/v1/query/online", json=online_body("u0002", query_id="same"))
    assert first.status_code == 200
    if second.status_code in (409, 422):
        assert error_of(second, second.status_code).get("field") == "query_id"
        return
    logged = (await http.get("/v1/log/same")).json()
    assert logged["inputs"] == {"user.id": "u0002"}
    assert logged["outputs"]["user.name"]["value"] == second.json()["values"]["user.name"]


# --- listings are bounded: a limit past 10,000 is a 400 naming it and the most --------------


@pytest.mark.parametrize(
    "path",
    ["/v1/log", "/v1/models", "/v1/models/risk", "/v1/models/risk/aliases"],
)
@pytest.mark.parametrize("limit", ["10001", "1000000", "0", "-1", "1e3", "²", "10000000000"])
async def test_a_listing_limit_out_of_range_is_a_400_naming_it_and_the_most(
    http: httpx.AsyncClient, path: str, limit: str
) -> None:
    error = error_of(await http.get(path, params={"limit": limit}), 400)
    assert error["field"] == "limit"
    assert "1..10000" in error["message"]


@pytest.mark.parametrize(
    "path", ["/v1/log", "/v1/models", "/v1/models/risk", "/v1/models/risk/aliases"]
)
async def test_a_listing_takes_a_limit_up_to_10000(http: httpx.AsyncClient, path: str) -> None:
    for limit in ("1", "10000"):
        response = await http.get(path, params={"limit": limit})
        assert response.status_code == 200, (limit, response.text)


async def test_a_listing_lists_at_most_its_limit_and_says_there_is_more(
    http: httpx.AsyncClient,
) -> None:
    for uid in ("u0001", "u0002", "u0003"):
        assert (await http.post("/v1/query/online", json=online_body(uid))).status_code == 200
    assert len((await http.get("/v1/log", params={"limit": "2"})).json()["records"]) == 2
    one = (await http.get("/v1/models/risk", params={"limit": "1"})).json()
    every = (await http.get("/v1/models/risk")).json()
    assert one["versions"] == every["versions"][-1:]  # the newest
    assert one["more"] is (len(every["versions"]) > 1) and every["more"] is False


async def test_a_replay_of_more_than_10000_decisions_is_refused_naming_limit(
    http: httpx.AsyncClient,
) -> None:
    response = await http.post("/v1/replay", json={"since": "1d", "limit": 10_001})
    error = error_of(response, 422)
    assert error["field"] == "limit" and "10000" in error["message"]


# --- numbers: str.isdigit says yes to "²", which int() refuses -----------------------------


@pytest.mark.parametrize("version", ["²", "¹²", "٣", "𝟘", "99999999999999999999", "0", "v1"])
async def test_a_version_that_is_no_plain_number_is_a_422_not_a_500(
    http: httpx.AsyncClient, version: str
) -> None:
    path = f"/v1/models/risk/versions/{quote(version)}"
    error = error_of(await http.get(path), 422)
    assert error["field"] == "version" and "whole number" in error["message"]
    predict = await http.post(
        "/v1/models/risk/predict", json={"rows": [[1.0, 2.0, 3.0, 4.0]], "version": version}
    )
    assert error_of(predict, 422)["field"] == "version"


@pytest.mark.parametrize("version", [10**20, 2**63])
async def test_a_version_past_what_the_registry_holds_is_a_422_not_a_500(
    http: httpx.AsyncClient, version: int
) -> None:
    moved = await http.put("/v1/models/risk/aliases/canary", json={"version": version})
    assert error_of(moved, 422)["field"] == "version"
    predict = await http.post(
        "/v1/models/risk/predict", json={"rows": [[1.0, 2.0, 3.0, 4.0]], "version": version}
    )
    assert error_of(predict, 422)["field"] == "version"
