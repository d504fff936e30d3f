"""The Decisions pages over a small real project (a kairos.yaml, a SQLite source read by a SQL
resolver, a Python resolver, a registered model, an LLM feature through an in-process gateway
to a fake provider over real HTTP, the query log in a SQLite file): what the pages show equals
what the log holds, search filters work, bad input is a 400 page naming the field, forms need
their CSRF token, and a replay with another model version lists the rows that changed."""

from __future__ import annotations

import asyncio
import html
import re
import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import markupsafe
import numpy as np
import pytest
from sklearn.linear_model import LinearRegression
from starlette.testclient import TestClient

import kairos as kr
from kairos import _, features, online
from kairos.gateway import Gateway
from kairos.project.config import Config
from kairos.resolvers.sql import SqlResolver
from kairos.server import create_app
from kairos.stores.query_log import LoggedQuery
from kairos.ui.app import fmt_when
from tests.client.test_decision_records import Upstream, gateway_config
from tests.gateway.fake_upstream import ServerThread

EVIL = '<script>alert(1)</script>"><img src=x onerror=alert(2)>'
SHOPPERS = {"s1": "Ada", "s2": "Brook", "s3": EVIL}
OUTPUTS = ["shopper.name", "shopper.tier", "shopper.score"]


@features(max_staleness="1h")  # cached: the trace reads and writes the online store
class Shopper:
    id: str
    name: str
    credit: float
    spent: float
    tier: str
    score: float = kr.predict("score", inputs=[_.credit, _.spent])
    note: str = kr.completion(
        model="judge",
        messages=[kr.message("user", "{{ name }}: spent {{ spent }} of {{ credit }}. Fine?")],
        max_tokens=20,
        temperature=0,
    )


@online
def shopper_tier(credit: Shopper.credit) -> Shopper.tier:
    return "gold" if credit > 250 else "basic"


SQL = """-- resolves: Shopper
-- source: shop
select id, name, credit, spent from shoppers where id = :id
"""
YAML = """sources:
  shop: sqlite:///shop.db
online_store: memory://
query_log: sqlite:///log.db
models:
  registry: sqlite:///models.db
  volume: models
"""


def score_model(weights: tuple[float, float]) -> LinearRegression:
    x = np.array([[0.0, 0.0], [1.0, 0.0], [0.0, 1.0]])
    return LinearRegression().fit(x, x @ np.array(weights) + 0.1)


@dataclass
class Shop:
    http: TestClient
    client: kr.Client
    ids: dict[str, str]  # shopper -> the id of its scored decision
    llm_id: str  # the decision that called the LLM (s2's note)

    def record(self, query_id: str) -> LoggedQuery:
        record = self.client.log.get(query_id)
        assert record is not None, query_id
        return record

    def page(self, path: str, status: int = 200, **params: Any) -> str:
        response = self.http.get(path, params=params)
        assert response.status_code == status, (response.status_code, response.text[:2000])
        assert response.headers["content-security-policy"].startswith("default-src 'none'")
        assert "Traceback" not in response.text
        return response.text


def project(folder: Path) -> Path:
    (folder / "kairos.yaml").write_text(YAML)
    (folder / "shopper.sql").write_text(SQL)
    with sqlite3.connect(folder / "shop.db") as db:
        db.execute(
            "create table shoppers (id text primary key, name text, credit real, spent real)"
        )
        db.executemany(
            "insert into shoppers values (?, ?, ?, ?)",
            [(sid, name, 100.0 * n, 12.5 * n) for n, (sid, name) in enumerate(SHOPPERS.items(), 1)],
        )
    return folder


@pytest.fixture(scope="module")
def shop(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Shop]:
    folder = project(tmp_path_factory.mktemp("shop"))
    fake = Upstream()
    with ServerThread(fake.app()) as upstream:
        gateway = Gateway(gateway_config(upstream.url, folder))
        key, _ = asyncio.run(gateway.create_key(name="features", models=["judge"]))
        definitions = [Shopper, shopper_tier, SqlResolver.from_file(folder / "shopper.sql")]
        config = Config.load(folder)  # the folder's kairos.yaml
        client = kr.Client(definitions=definitions, config=config, gateway=gateway, llm_key=key)
        client.models.register("score", score_model((0.001, 0.01)), inputs=["c", "s"])
        # the app closes the client on its own loop, where the gateway's connections are
        with TestClient(create_app(client, close_client=True), base_url="http://localhost") as http:
            ids = {}
            for sid in SHOPPERS:
                body = {"inputs": {"shopper.id": sid}, "outputs": OUTPUTS}
                response = http.post("/v1/query/online", json=body)
                assert response.status_code == 200, response.text
                ids[sid] = response.json()["query_id"]
            body = {"inputs": {"shopper.id": "s2"}, "outputs": ["shopper.note"]}
            asked = http.post("/v1/query/online", json=body)
            assert asked.status_code == 200, asked.text
            client.models.register("score", score_model((0.004, -0.02)), inputs=["c", "s"])
            client.log.flush()
            yield Shop(http, client, ids, asked.json()["query_id"])


def row_of(page: str, name: str) -> str:
    found = re.search(rf'id="value-{re.escape(escape(name))}">(.*?)</tr>', page, re.S)
    assert found, f"no row for {name!r}"
    return found.group(1)


def csrf_of(page: str) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', page)
    assert found, "no CSRF token in the page's forms"
    return found.group(1)


def escape(text: str) -> str:
    return str(markupsafe.escape(text))  # as the templates escape: &#34; for a quote


def shown(value: Any) -> str:
    """A scalar as the log holds it, as it must appear in the page (escaped)."""
    if isinstance(value, float):
        return repr(value)
    return escape(str(value))


# --- the search --------------------------------------------------------------------------


def test_the_search_lists_decisions_newest_first_with_what_the_log_holds(shop: Shop) -> None:
    page = shop.page("/ui/decisions")
    ids = [*shop.ids.values(), shop.llm_id]
    positions = [page.index(f">{query_id}</a>") for query_id in ids]
    assert positions == sorted(positions, reverse=True), "not newest first"
    for sid, query_id in shop.ids.items():
        record = shop.record(query_id)
        assert shown(record.value("shopper.score")) in page
        assert f'<dt>shopper.id</dt><dd class="mono">{sid}</dd>' in page
    assert '<div class="nowrap">score@v1</div>' in page
    assert escape(EVIL[:30]) in page and "<script>" not in page
    llm = shop.record(shop.llm_id)
    assert llm.cost_usd is not None and llm.cost_usd > 0
    assert f"${llm.cost_usd:.6f}".rstrip("0") in page
    assert shown(llm.value("shopper.note")) in page


def test_search_filters_by_entity_feature_model_and_time(shop: Shop) -> None:
    by_entity = shop.page("/ui/decisions", entity="shopper.id:s2")
    assert shop.ids["s2"] in by_entity and shop.llm_id in by_entity
    assert shop.ids["s1"] not in by_entity and shop.ids["s3"] not in by_entity
    by_feature = shop.page("/ui/decisions", feature="shopper.note")
    assert shop.llm_id in by_feature and not any(i in by_feature for i in shop.ids.values())
    by_model = shop.page("/ui/decisions", model="score@v1")
    assert all(i in by_model for i in shop.ids.values()) and shop.llm_id not in by_model
    assert shop.ids["s1"] not in shop.page("/ui/decisions", model="score@v2")
    later = shop.record(shop.ids["s3"]).now.isoformat()
    before = shop.page("/ui/decisions", until=later)
    assert shop.ids["s1"] in before and shop.ids["s3"] not in before
    # one a page, then "older →" with until= the oldest shown
    first = shop.page("/ui/decisions", limit="1", model="score")
    assert shop.ids["s3"] in first and shop.ids["s2"] not in first
    older = re.search(r'href="(/ui/decisions\?[^"]+)">older', first)
    assert older, "no older link on a full page"
    link = html.unescape(older.group(1))
    assert "until=" in link and "model=score" in link
    second = shop.http.get(link)
    assert second.status_code == 200
    assert shop.ids["s2"] in second.text and shop.ids["s3"] not in second.text


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"since": "the day before"}, "since"),
        ({"until": "soon"}, "until"),
        ({"since": "1h", "until": "2h"}, "since"),
        ({"entity": "foo"}, "entity"),
        ({"entity": "shopper.nope:s1"}, "entity"),
        ({"feature": "shopper.nope"}, "feature"),
        ({"limit": "0"}, "limit"),
        ({"limit": "501"}, "limit"),
        ({"limit": "ten"}, "limit"),
    ],
)
def test_bad_search_input_is_a_400_page_naming_the_field(
    shop: Shop, params: dict[str, str], field: str
) -> None:
    page = shop.page("/ui/decisions", 400, **params)
    assert f"field: <code>{field}</code>" in page
    assert 'role="alert"' in page and f'id="{field}"' in page.replace(
        'id="entity-1"', 'id="entity"'
    )
    assert 'aria-invalid="true"' in page  # the form is shown again, the field marked


# --- one decision ------------------------------------------------------------------------


def test_a_decisions_page_shows_every_value_as_logged(shop: Shop) -> None:
    record = shop.record(shop.ids["s1"])
    page = shop.page(f"/ui/decisions/{record.query_id}")
    assert set(record.values) == {
        "shopper.id", "shopper.name", "shopper.credit", "shopper.spent", "shopper.tier",
        "shopper.score",
    }  # fmt: skip
    for name, value in record.values.items():
        row = row_of(page, name)
        assert f"<code>{shown(value.value)}</code>" in row, (name, row)
        assert escape(value.source or "–") in row, (name, row)
        assert escape(value.version or "–") in row, (name, row)
        assert fmt_when(value.observed_at) in row
    assert "role-input" in row_of(page, "shopper.id")
    assert all("role-output" in row_of(page, n) for n in OUTPUTS)
    assert "role-" not in row_of(page, "shopper.credit")  # read on the way, not asked for
    # the exact vector the model was given, against the values
    [call] = record.model_calls
    assert call["version"] == "score@v1"
    vector = page.split("<h2>Model calls</h2>")[1].split("</section>")[0]
    for name, given in zip(call["inputs"], call["vector"], strict=True):
        assert given == record.value(name)
        assert f'<td class="mono">{name}</td><td class="mono">{given!r}</td>' in vector
    # the trace as a waterfall: the SQL read, the Python resolver, the model, the cache
    trace = page.split("<h2>Trace</h2>")[1]
    for kind in ("sql", "python", "model", "cache", "query"):
        assert f'<rect class="kind-{kind}"' in trace, kind
    for step in record.trace:
        if step["kind"] != "query":
            assert escape(f"{step['kind']} {step['label']}") in trace


def test_an_llm_decisions_page_shows_the_call_and_its_tokens_per_feature(shop: Shop) -> None:
    record = shop.record(shop.llm_id)
    page = shop.page(f"/ui/decisions/{shop.llm_id}")
    [call] = record.llm_calls
    [message] = call["messages"]
    assert message["content"].startswith("Brook: spent 25.0 of 200.0")
    assert f'<pre class="message">{escape(message["content"])}</pre>' in page
    assert f'<pre class="answer">{escape(call["answer"])}</pre>' in page
    for text in ("judge-1", "fake", call["request_id"], f"${call['cost_usd']:.6f}"):
        assert f'<dd class="mono">{escape(text)}</dd>' in page, text
    for label in ("prompt tokens", "completion tokens"):
        key = label.replace(" ", "_")
        assert f'<dt>{label}</dt><dd class="mono">{call[key]}</dd>' in page
    # the prompt's tokens per feature: a bar per feature with its count
    chart = page.split("<h3>Prompt tokens per feature</h3>")[1].split("</svg>")[0]
    counts = call["tokens_by_feature"]
    assert {"name", "spent", "credit"} <= set(counts)
    for feature_name, count in counts.items():
        assert f"<title>{escape(feature_name)}: {count} (" in chart, feature_name
    # LLM stages in the waterfall, after the LLM node
    trace = page.split("<h2>Trace</h2>")[1]
    for kind in ("llm", "context", "ttft", "decode"):
        assert f'<rect class="kind-{kind}"' in trace, kind
    assert trace.index("python llm:shopper.note") < trace.index("shopper.note: TTFT")


def test_nothing_stored_is_rendered_unescaped(shop: Shop) -> None:
    record = shop.record(shop.ids["s3"])
    assert record.value("shopper.name") == EVIL
    page = shop.page(f"/ui/decisions/{record.query_id}")
    assert EVIL not in page and "<script>" not in page and "<img" not in page
    assert f"<code>{escape(EVIL)}</code>" in row_of(page, "shopper.name")


def test_an_unknown_decision_is_a_404_naming_it(shop: Shop) -> None:
    page = shop.page("/ui/decisions/never-logged", 404)
    assert "never-logged" in page and "field: <code>query_id</code>" in page
    evil = shop.page(f"/ui/decisions/{EVIL.replace('/', '')}", 404)
    assert "<script>" not in evil


# --- replay ------------------------------------------------------------------------------


def test_a_post_without_its_csrf_token_is_refused(shop: Shop) -> None:
    body = {"query_id": shop.ids["s1"], "models": "score@v2"}
    assert shop.http.post("/ui/replay", data=body).status_code == 403
    assert shop.http.post("/ui/replay", data={**body, "csrf": "x" * 40}).status_code == 403


def test_a_replay_with_another_model_version_shows_the_changed_rows(shop: Shop) -> None:
    record = shop.record(shop.ids["s1"])
    page = shop.page(f"/ui/decisions/{record.query_id}")
    assert '<option value="score@v2">' in page and '<option value="score@v1">' in page
    body = {"csrf": csrf_of(page), "query_id": record.query_id, "models": "score@v2"}
    response = shop.http.post("/ui/replay", data=body)
    assert response.status_code == 200, response.text[:2000]
    [call] = record.model_calls
    [again] = shop.client.models.predict("score", [call["vector"]], version=2).tolist()
    logged = record.value("shopper.score")
    assert again != logged
    rows = response.text.split("<h2>Changed rows</h2>")[1]
    assert f">{record.query_id}</a>" in rows
    assert f'<td class="mono">{logged!r}</td>' in rows
    assert f'<td class="mono">{again!r}</td>' in rows
    assert f"{again - logged:+.6g}" in rows
    features = response.text.split("<h2>What changed</h2>")[1].split("</table>")[0]
    changed = r'<tr class="changed">\s*<td class="mono">shopper.score</td>(.*?)</tr>'
    score = re.search(changed, features, re.S)
    assert score, features
    assert f"{abs(again - logged):,.6f}" in score.group(1)


def test_a_replay_by_time_range_counts_every_decision_changed(shop: Shop) -> None:
    page = shop.page("/ui/replay")
    body = {"csrf": csrf_of(page), "since": "1h", "models": "score@v2", "limit": "1000"}
    response = shop.http.post("/ui/replay", data=body)
    assert response.status_code == 200, response.text[:2000]
    text = response.text
    assert all(f">{query_id}</a>" in text for query_id in shop.ids.values())
    stats = re.findall(r'<div class="label">([^<]+)</div><div class="value">([^<]+)</div>', text)
    assert dict(stats)["decisions replayed"] == "4" and dict(stats)["decisions changed"] == "3"
    same = shop.http.post("/ui/replay", data={**body, "models": "score@v1"})
    assert same.status_code == 200 and "Nothing changed." in same.text


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"since": "1h", "models": "score"}, "models"),
        ({"since": "1h", "models": "score@v9"}, "models"),
        ({"since": "1h", "models": "nope@v1"}, "models"),
        ({"since": "1h"}, "models"),
        ({"models": "score@v2"}, "since"),
        ({"since": "whenever", "models": "score@v2"}, "since"),
        ({"since": "1h", "models": "score@v2", "limit": "1001"}, "limit"),
        ({"since": "1h", "models": "score@v2", "entity": "foo"}, "entity"),
        ({"since": "1h", "recompute": "shopper.nope"}, "recompute"),
        ({"query_id": "never-logged", "models": "score@v2"}, "query_ids"),
    ],
)
def test_bad_replay_input_is_a_400_page_naming_the_field(
    shop: Shop, fields: dict[str, str], field: str
) -> None:
    page = shop.page("/ui/replay")
    response = shop.http.post("/ui/replay", data={"csrf": csrf_of(page), **fields})
    assert response.status_code == 400, response.text[:2000]
    assert f"field: <code>{field}</code>" in response.text
    assert "Traceback" not in response.text and 'role="alert"' in response.text


def test_pages_answer_fast(shop: Shop) -> None:
    for path in ("/ui/decisions", f"/ui/decisions/{shop.llm_id}", "/ui/replay"):
        response = shop.http.get(path)
        took = float(response.headers["server-timing"].split("dur=")[1])
        assert took < 300, (path, took)
