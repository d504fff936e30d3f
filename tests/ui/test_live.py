"""The Live page over the fraud example served in process: queries through the HTTP app, then
the page's traffic, cache ratio, freshness (a stale cached value flagged), LLM cost per
decision and streams; and the Traffic summaries they come from."""

import html
import re
from datetime import timedelta

import httpx
import pytest
from starlette.applications import Starlette
from starlette.routing import Mount

import kairos as kr
from examples.fraud.generate import ANCHOR
from kairos.client.consume import StreamStats
from kairos.stores.query_log import LoggedQuery, LoggedValue
from kairos.ui.app import UI
from kairos.ui.dashboard import dashboard_routes
from kairos.ui.traffic import Traffic, percentile
from tests.server.fraud import online_body
from tests.ui.cells import cells

pytestmark = pytest.mark.anyio


def stat(page: str, name: str) -> str:
    found = re.search(rf'id="{name}">(.*?)</div>', page, re.S)
    assert found, name
    return html.unescape(found.group(1)).strip()


async def live(http: httpx.AsyncClient, query: str = "") -> str:
    response = await http.get(f"/ui/live{query}")
    assert response.status_code == 200, response.text
    assert '<meta http-equiv="refresh" content="5">' in response.text
    assert response.headers["server-timing"].startswith("page;dur=")
    return response.text


async def test_live_shows_traffic_cache_ratio_and_freshness(http: httpx.AsyncClient) -> None:
    hits = computed = 0
    for _ in range(3):  # the first computes and caches; the repeats are served from the cache
        response = await http.post("/v1/query/online", json=online_body("u0001"))
        assert response.status_code == 200, response.text
        hits += response.json()["meta"]["cache_hits"]
        computed += response.json()["meta"]["computed"]
    missing = await http.get("/v1/log/no-such-query")
    assert missing.status_code == 404
    page = await live(http)

    online = cells(page, 'id="endpoint-query_online"')
    assert online[0] == "query_online"
    assert online[1] == "3" and online[3] == "3"  # requests in the last minute and window
    assert online[5].endswith(("ms", "s")) and online[6].endswith(("ms", "s"))  # p50, p99
    assert online[7] == "3" and online[9] == "0" and online[10] == "0"  # 2xx, 4xx, 5xx
    log_get = cells(page, 'id="endpoint-log_get"')
    assert log_get[3] == "1" and log_get[9] == "1"  # one request, a 4xx

    assert hits == 12  # the repeats: all 6 outputs from the cache
    assert stat(page, "cache-window") == f"{hits / (hits + computed) * 100:.1f}%"
    assert stat(page, "cache-minute") == stat(page, "cache-window")
    assert float(stat(page, "qps-minute")) > 0

    assert "Over the newest 3 decisions" in page
    name = cells(page, 'data-feature="user.name"')
    assert name[0] == "user.name"
    assert name[1] == "3" and name[2] == "2"  # 3 values, 2 from the cache
    assert name[6] == "1m 0s"  # User's max_staleness
    assert "STALE" not in page
    risk = cells(page, 'data-feature="user.risk"')
    assert risk[1] == "3"
    assert 'data-feature="user.id"' not in page  # the query's own input is no served value
    assert stat(page, "stale-count") == "0"
    assert "no streams" in page


async def test_a_cached_value_older_than_max_staleness_is_flagged(
    http: httpx.AsyncClient,
) -> None:
    first = await http.post("/v1/query/online", json=online_body("u0002"))
    assert first.status_code == 200, first.text
    later = (ANCHOR + timedelta(minutes=10)).isoformat()  # user.name's max_staleness is 1m
    stale = await http.post(
        "/v1/query/online",
        json=online_body("u0002", ["user.name"], now=later, staleness={"user.name": "1h"}),
    )
    assert stale.status_code == 200, stale.text
    assert stale.json()["meta"]["cache_hits"] == 1

    page = await live(http)
    name = cells(page, 'data-feature="user.name"')
    assert name[4] == "10m 0s"  # p99 age: the cached value was 10 minutes old
    assert name[7] == "1"  # one value older than max_staleness
    assert name[8] == "STALE"
    assert stat(page, "stale-count") == "1"
    assert 'class="kind-stale"' in page  # drawn in the chart as stale too
    assert page.index('data-feature="user.name"') < page.index('data-feature="user.risk"')

    # the newest decision only: the stale one, nothing else read
    newest = await live(http, "?decisions=1")
    assert "Over the newest 1 decision " in newest
    assert 'data-feature="user.risk"' not in newest
    assert cells(newest, 'data-feature="user.name"')[8] == "STALE"


@pytest.mark.parametrize("value", ["0", "5001", "many", "-3"])
async def test_a_bad_decisions_count_is_a_clear_400(http: httpx.AsyncClient, value: str) -> None:
    response = await http.get("/ui/live", params={"decisions": value})
    assert response.status_code == 400
    assert "must be a whole number from 1 to 2500" in html.unescape(response.text)
    assert "<code>decisions</code>" in response.text
    assert "Traceback" not in response.text


async def test_llm_cost_per_decision_from_the_records(
    client: kr.Client, http: httpx.AsyncClient
) -> None:
    """Decision records with LLM calls (as the LLM resolver reports them) in the real log:
    spend and tokens per LLM feature and per prompt feature, mean per decision."""
    now = ANCHOR
    value = LoggedValue("yes", now, "llm:verdict", "v1", None, None)
    for index, cost in enumerate([0.002, 0.004, None]):
        calls = [
            {
                "feature": "user.verdict_from_history",
                "model": "local/gemma-270m",
                "prompt_tokens": 900,
                "completion_tokens": 16,
                "tokens_by_feature": {"user.transactions": 850, "user.name": 40, "(format)": 10},
                "cost_usd": cost,
                "cost_by_feature": None
                if cost is None
                else {"user.transactions": cost * 0.9, "user.name": cost * 0.1},
            }
        ]
        client.log.store.append(
            LoggedQuery(
                f"llm-{index}",
                now,
                {"user.id": "u0001"},
                {"user.verdict_from_history": value},
                1.0,
                [],
                now,
                llm_calls=calls,
            )
        )
    client.log.store.append(  # a decision without LLM calls counts in the mean as 0
        LoggedQuery("plain", now, {"user.id": "u0003"}, {}, 1.0, [], now)
    )
    page = await live(http)
    row = cells(page, 'data-llm="user.verdict_from_history"')
    assert row[:3] == ["user.verdict_from_history", "3", "3"]  # calls, decisions
    assert row[3] == "675.0"  # 3 x 900 prompt tokens over 4 decisions
    assert row[4] == "12.0"
    assert row[5] == "$0.0015"  # (0.002 + 0.004) / 4
    assert row[6] == "$0.006"
    assert stat(page, "cost-per-decision") == "$0.0015"
    history = cells(page, '<td class="mono">user.transactions</td>')
    assert history[1] == "637.5"  # 3 x 850 / 4
    assert "3 of 4 decisions called an LLM" in page


async def test_streams_show_lag_and_dead_letters_with_secrets_redacted(
    client: kr.Client,
) -> None:
    stats = StreamStats(messages=120, events=118, dead=2, lag=37)
    stats.last_error = "cannot read redis://:hunter2@broker:6379/0: timeout"
    ui = UI(client, streams=lambda: [("payments", stats)])
    app = Starlette(routes=[Mount("/ui", routes=dashboard_routes(ui))])
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://localhost"
    ) as http:
        page = await live(http)
    row = cells(page, '<td class="mono">payments</td>')
    assert row[:7] == ["payments", "37", "120", "118", "0", "2", "0"]
    assert "hunter2" not in page
    assert "redis://:***@broker:6379/0" in html.unescape(page)
    assert "No requests in the last" in page


def test_traffic_rates_percentiles_and_bounded_memory() -> None:
    traffic = Traffic(started=0.0, most=1000)
    for index in range(100):  # 100 requests over the last 100 s, 1..100 ms
        traffic.add_request(200.0 + index, "query_online", 200 if index else 500, index / 1e3)
    traffic.add_request(290.0, "log_get", 404, 0.001)
    online, log_get = traffic.endpoints(now=300.0)
    assert (online.endpoint, online.last_minute, online.last_window) == ("query_online", 60, 100)
    assert online.per_s_minute == pytest.approx(1.0)
    assert online.per_s_window == pytest.approx(100 / 300)
    assert online.p50_ms == pytest.approx(49.0) and online.p99_ms == pytest.approx(98.0)
    assert online.by_class == {"2xx": 99, "5xx": 1} and online.errors == 1
    assert log_get.by_class == {"4xx": 1}
    assert traffic.endpoints(now=1000.0) == []  # all of it older than the window

    for index in range(5000):  # a burst past `most` in the last second: the newest are kept
        traffic.add_request(299.0 + index / 5000, "query_online", 200, 0.001)
    assert traffic.requests == 1000
    assert traffic.span(60.0, now=300.0) == pytest.approx(0.2)  # rates over what is held
    (burst,) = traffic.endpoints(now=300.0)
    assert burst.last_window == 1000 and burst.per_s_minute == pytest.approx(5000)
    assert percentile([], 50) != percentile([], 50)  # NaN for no samples


async def test_an_unreadable_query_log_still_shows_the_rest(
    client: kr.Client, http: httpx.AsyncClient
) -> None:
    response = await http.post("/v1/query/online", json=online_body("u0004"))
    assert response.status_code == 200, response.text
    client.log.store.close()  # reading it now fails
    page = await live(http)
    assert "the query log could not be read" in page and "is closed" in page
    assert cells(page, 'id="endpoint-query_online"')[3] == "1"
