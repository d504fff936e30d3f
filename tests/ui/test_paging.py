"""Paging through decisions that share one `now` (a bulk query's rows): "older →" carries the
last id shown, so the next page starts right after it, skipping nothing and repeating nothing."""

import re

import httpx
import pytest

from tests.server.fraud import USERS, online_body

pytestmark = pytest.mark.anyio


async def test_older_pages_reach_every_decision_of_a_bulk_query(http: httpx.AsyncClient) -> None:
    body = online_body(USERS[0]) | {"inputs": {"user.id": USERS[:12]}}
    assert (await http.post("/v1/query/bulk", json=body)).status_code == 200
    logged = (await http.get("/v1/log", params={"limit": 100})).json()["records"]
    expected = [record["query_id"] for record in logged]
    assert len(expected) == 12 and len({r["now"] for r in logged}) == 1  # one now for all
    seen: list[str] = []
    path = "/ui/decisions?limit=5"
    for _ in range(5):
        page = (await http.get(path)).text
        seen += re.findall(r'href="/ui/decisions/([^"]+)"', page)
        older = re.search(r'href="(/ui/decisions\?[^"]+)">older', page)
        if older is None:
            break
        path = older.group(1).replace("&amp;", "&")
    assert seen == expected  # newest first, each once
