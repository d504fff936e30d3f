"""SQL injection through the HTTP API is harmless: inputs are bound parameters, so a hostile
string is just a user id that does not exist, and the example's tables are untouched."""

from pathlib import Path
from urllib.parse import quote

import httpx
import pytest

from tests.server.fraud import error_of, online_body, table_rows

pytestmark = pytest.mark.anyio

HOSTILE = [
    "u0001' OR '1'='1",
    "x'; DROP TABLE users; --",
    'u0001" OR "1"="1',
    "u0001' --",
    "' UNION SELECT id, name, email, signup_at FROM users --",
    "u0001'; DELETE FROM transactions; --",
    "u0001; UPDATE users SET name = 'pwned'",
    "%' OR id LIKE '%",
]


async def test_hostile_user_ids_find_no_user_and_change_nothing(
    http: httpx.AsyncClient, fraud_db: Path
) -> None:
    users, transactions = table_rows(fraud_db, "users"), table_rows(fraud_db, "transactions")
    assert users == 200

    for uid in HOSTILE:
        response = await http.post("/v1/query/online", json=online_body(uid))
        assert response.status_code == 200, (uid, response.text)
        body = response.json()
        assert body["values"]["user.name"] is None, uid  # not some other user's row
        errors = {e["feature"]: e for e in body["errors"]}
        assert "no row" in errors["user.name"]["message"], errors
        assert body["values"]["user.txn_count[1d]"] == 0, uid

    bulk = await http.post(
        "/v1/query/bulk",
        json={"inputs": {"user.id": [*HOSTILE, "u0001"]}, "outputs": ["user.name"]},
    )
    assert bulk.status_code == 200
    assert bulk.json()["values"]["user.name"] == [None] * len(HOSTILE) + ["User 1"]

    assert table_rows(fraud_db, "users") == users
    assert table_rows(fraud_db, "transactions") == transactions
    name = (await http.post("/v1/query/online", json=online_body("u0001", ["user.name"]))).json()
    assert name["values"]["user.name"] == "User 1"


@pytest.mark.parametrize("uid", HOSTILE[:3])
async def test_hostile_strings_elsewhere_are_4xx_not_5xx(http: httpx.AsyncClient, uid: str) -> None:
    # as a feature name, an option, and a query id to look up
    error = error_of(await http.post("/v1/query/online", json=online_body("u0001", [uid])), 422)
    assert error["code"] == "UnknownFeature"
    body = online_body("u0001", ["user.name"], staleness={uid: "0s"})
    assert (await http.post("/v1/query/online", json=body)).status_code == 422
    error_of(await http.get(f"/v1/log/{quote(uid, safe='')}"), 404)
