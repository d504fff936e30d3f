"""`GET /v1/log`: search the logged decisions over HTTP, newest first, each record as
`GET /v1/log/{query_id}` shows it; bad parameters are 400s naming the parameter."""

from datetime import timedelta
from typing import Any

import httpx
import pytest

import kairos as kr
from examples.fraud.generate import ANCHOR
from kairos.stores.query_log import LoggedQuery, LoggedValue
from tests.server.fraud import OUTPUTS, error_of, online_body
from tests.server.test_routes import metric_samples, value_of

pytestmark = pytest.mark.anyio


async def query(http: httpx.AsyncClient, uid: str, minutes: int) -> str:
    at = (ANCHOR + timedelta(minutes=minutes)).isoformat()
    response = await http.post("/v1/query/online", json=online_body(uid, now=at))
    assert response.status_code == 200, response.text
    query_id: str = response.json()["query_id"]
    return query_id


async def search(http: httpx.AsyncClient, **params: Any) -> list[dict[str, Any]]:
    response = await http.get("/v1/log", params=params)
    assert response.status_code == 200, response.text
    records: list[dict[str, Any]] = response.json()["records"]
    return records


def ids(records: list[dict[str, Any]]) -> list[str]:
    return [record["query_id"] for record in records]


async def test_search_by_entity_time_model_and_limit(http: httpx.AsyncClient) -> None:
    first = await query(http, "u0001", 0)
    second = await query(http, "u0002", 1)
    third = await query(http, "u0001", 2)
    at = {n: (ANCHOR + timedelta(minutes=n)).isoformat() for n in (0, 1, 2, 3)}

    by_user = await search(http, entity="user.id:u0001")
    assert ids(by_user) == [third, first]
    for record in by_user:  # whole records, the same as reading each one back
        one = (await http.get(f"/v1/log/{record['query_id']}")).json()
        assert record == one
        assert set(record["outputs"]) == set(OUTPUTS)
        assert set(record["values"]) >= {*OUTPUTS, "user.id"}  # intermediates too
    assert ids(await search(http)) == [third, second, first]
    assert ids(await search(http, since=at[1])) == [third, second]  # since is inclusive
    assert ids(await search(http, until=at[1])) == [first]  # until is exclusive
    assert ids(await search(http, since=at[1], until=at[2])) == [second]
    assert ids(await search(http, since=at[3])) == []
    assert ids(await search(http, entity="user.id:u0001", since=at[1])) == [third]
    assert ids(await search(http, limit=1)) == [third]
    assert ids(await search(http, entity="user.id:u0404")) == []

    versions = by_user[0]["plan"]["models"]
    assert versions and all(v.startswith("risk@") for v in versions)
    assert ids(await search(http, model="risk")) == [third, second, first]
    assert ids(await search(http, model=versions[0])) == [third, second, first]
    assert ids(await search(http, model="risk@v999")) == []
    assert ids(await search(http, feature="user.risk", entity="user.id:u0002")) == [second]


async def test_an_unescaped_plus_in_a_time_still_reads_as_its_offset(
    http: httpx.AsyncClient,
) -> None:
    before = await query(http, "u0003", 0)
    after = await query(http, "u0003", 5)
    since = (ANCHOR + timedelta(minutes=1)).isoformat()
    assert "+00:00" in since

    # `+` in a raw query string arrives as a space
    response = await http.get(f"/v1/log?entity=user.id:u0003&since={since}")

    assert response.status_code == 200, response.text
    assert ids(response.json()["records"]) == [after]
    assert before != after


async def test_since_and_until_take_durations_back_from_now(http: httpx.AsyncClient) -> None:
    body = {"inputs": {"user.id": "u0004"}, "outputs": ["user.name"]}  # now: the wall clock
    served = await http.post("/v1/query/online", json=body)
    query_id = served.json()["query_id"]

    assert ids(await search(http, entity="user.id:u0004", since="1h")) == [query_id]
    assert ids(await search(http, entity="user.id:u0004", until="1h")) == []
    assert ids(await search(http, entity="user.id:u0004", since="2h", until="1h")) == []


@pytest.mark.parametrize(
    ("query_string", "field", "says"),
    [
        ("since=bogus", "since", "'bogus'"),
        ("until=yesterday", "until", "ISO time"),
        ("since=infinity", "since", "before year 1"),
        ("since=1h&until=2h", "since", "before until"),
        ("entity=nocolon", "entity", "FEATURE:KEY"),
        ("entity=:u1", "entity", "FEATURE:KEY"),
        ("entity=usr.id:u1", "entity", "usr"),
        ("entity=user.id:u1&entity=user.id:u2", "entity", "twice"),
        ("limit=0", "limit", "1..10000"),
        ("limit=abc", "limit", "whole number"),
        ("limit=99999999999", "limit", "whole number"),
        ("since=1h&since=2h", "since", "once"),
        ("user=u1", "user", "unknown parameter 'user'"),
    ],
)
async def test_a_bad_parameter_is_a_400_naming_it(
    http: httpx.AsyncClient, query_string: str, field: str, says: str
) -> None:
    error = error_of(await http.get(f"/v1/log?{query_string}"), 400)

    assert error["field"] == field
    assert says in error["message"]


async def test_metrics_read_the_query_logs_dropped_count(
    http: httpx.AsyncClient, client: kr.Client
) -> None:
    for minute in range(3):
        await query(http, "u0005", minute)
    bulk = {"inputs": {"user.id": ["u0006", "u0007"]}, "outputs": ["user.name"]}
    assert (await http.post("/v1/query/bulk", json=bulk)).status_code == 200

    samples = metric_samples((await http.get("/metrics")).text)

    assert value_of(samples["kairos_query_log_dropped_total"]) == 0
    assert value_of(samples["kairos_query_log_lost_total"]) == 0
    records = await search(http)
    assert len(records) == 5  # every record is there
    record = client.log.get(records[0]["query_id"])
    client.log.close()
    client.log.append(record)  # a closed log keeps nothing: one record dropped

    samples = metric_samples((await http.get("/metrics")).text)

    assert value_of(samples["kairos_query_log_dropped_total"]) == 1 == client.log.dropped


async def test_an_int_past_64_bits_in_a_record_is_sent_as_its_digits(
    http: httpx.AsyncClient, client: kr.Client
) -> None:
    big = 2**70
    record = LoggedQuery(
        "wide-int", ANCHOR, {"user.id": "u0009"},
        {"user.name": LoggedValue(big, ANCHOR, "user", "v1", None, None)},
        1.0, [], ANCHOR,
    )  # fmt: skip
    client.log.append(record)
    one = await http.get("/v1/log/wide-int")
    assert one.status_code == 200, one.text
    assert one.json()["outputs"]["user.name"]["value"] == str(big)
    found = await http.get("/v1/log", params={"entity": "user.id:u0009"})
    assert found.status_code == 200, found.text
    assert found.json()["records"][0]["values"]["user.name"]["value"] == str(big)
