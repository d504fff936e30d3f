"""`POST /v1/replay`: logged decisions re-run over HTTP; bad bodies name the field."""

from datetime import timedelta

import httpx
import pytest

from examples.fraud.generate import ANCHOR
from tests.server.fraud import online_body

pytestmark = pytest.mark.anyio


async def decide(http: httpx.AsyncClient, uid: str, minutes: int) -> str:
    at = (ANCHOR + timedelta(minutes=minutes)).isoformat()
    response = await http.post("/v1/query/online", json=online_body(uid, now=at))
    assert response.status_code == 200, response.text
    query_id: str = response.json()["query_id"]
    return query_id


async def test_replay_by_id_and_by_time(http: httpx.AsyncClient) -> None:
    first = await decide(http, "u0003", 30)
    second = await decide(http, "u0004", 31)
    response = await http.post(
        "/v1/replay", json={"query_ids": [first, second], "recompute": ["user.risk"]}
    )
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["summary"]["decisions"] == 2
    assert "user.risk" in body["summary"]["recomputed"]
    rows = [r for r in body["rows"] if r["feature"] == "user.risk"]
    assert {r["query_id"] for r in rows} == {first, second}
    for row in rows:  # recomputed from the logged inputs: the logged score, unless it was
        # served from the cache (computed earlier, from other inputs)
        record = (await http.get(f"/v1/log/{row['query_id']}")).json()
        logged = record["values"]["user.risk"]
        assert row["logged"] == logged["value"]
        if logged["source"] != "cache":
            assert row["replayed"] == pytest.approx(row["logged"], abs=1e-12)
    since = (ANCHOR + timedelta(minutes=31)).isoformat()
    by_time = await http.post("/v1/replay", json={"since": since, "models": {"risk": 1}})
    assert by_time.status_code == 200, by_time.text
    assert by_time.json()["summary"]["decisions"] >= 1
    assert {r["query_id"] for r in by_time.json()["rows"]} >= {second}
    few = await http.post("/v1/replay", json={"query_ids": [first], "rows": 0})
    assert few.json()["rows"] == [] and few.json()["summary"]["decisions"] == 1


@pytest.mark.parametrize(
    ("body", "status", "field"),
    [
        ({"since": "1d", "models": {"nope": 2}}, 422, "models"),
        ({"since": "1d", "models": {"risk": 99}}, 422, "models"),
        ({"query_ids": ["never-logged"]}, 422, "query_ids"),
        ({"query_ids": "one"}, 422, "query_ids"),
        ({"since": "the day before"}, 422, "since"),
        ({"since": "infinity"}, 422, "since"),
        ({"since": "1d", "until": "inf"}, 422, "until"),
        ({}, 422, "since"),
        ({"since": "1d", "colour": "red"}, 422, "colour"),
        ({"since": "1d", "rows": -1}, 422, "rows"),
        ({"since": "1d", "models": [1]}, 422, "models"),
        ({"since": "1d", "recompute": "user.risk"}, 422, "recompute"),
        ({"since": "1d", "recompute": ["user.nope"]}, 422, "recompute"),
    ],
)
async def test_bad_replay_bodies_name_the_field(
    http: httpx.AsyncClient, body: dict[str, object], status: int, field: str | None
) -> None:
    response = await http.post("/v1/replay", json=body)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    if field is not None:
        assert error["field"] == field
    assert error["message"]
