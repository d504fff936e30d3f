"""The dashboard in a real browser (Debian's chromium, driven by Playwright) on the fraud
example after a few queries: sign in, then every page, its content checked against what the
server's JSON API and the query log say, each page saved as a screenshot.

The example's LLM features go through an in-process gateway to a fake OpenAI-compatible
provider (real HTTP, scripted answers), so decisions carry LLM calls and the Gateway pages have
spend to show, without loading a model."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import Page, expect

import kairos as kr
from examples.fraud.generate import ANCHOR
from kairos.gateway import Gateway
from kairos.project.config import ServerConfig
from kairos.server import create_app
from kairos.ui.replays import value_text
from tests.client.test_decision_records import Upstream
from tests.gateway.fake_upstream import ServerThread
from tests.server.fraud import OUTPUTS, copy_project
from tests.ui.browser import Watch, chromium, shoot
from tests.ui.gateways import gateway_config

pytestmark = pytest.mark.slow

KEY, ADMIN = "ui-test-key-0123456789", "ui-test-admin-0123456789"
USERS = ["u0001", "u0002", "u0003", "u0004", "u0005"]
VERDICT = "user.verdict_from_aggregates"


@dataclass
class Served:
    url: str
    http: httpx.Client  # the JSON API, with the key
    client: kr.Client
    llm_query: str  # the id of a decision that called the LLM
    server: ServerThread


@pytest.fixture(scope="module")
def served(fraud_db: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    folder = tmp_path_factory.mktemp("ui-fraud")
    project = copy_project(folder / "fraud")
    fake = Upstream()
    with ServerThread(fake.app()) as upstream:
        gateway = Gateway(
            gateway_config(upstream.url, folder, ADMIN, "gemma", {"local/gemma-270m": "gemma"})
        )
        llm_key, _ = asyncio.run(gateway.create_key(name="fraud-features", models=["gemma"]))
        client = kr.Client(
            project, query_log=f"sqlite:///{folder / 'log.db'}", gateway=gateway, llm_key=llm_key
        )
        client.models.warm()  # as `kairos serve` does before its first query
        client.llm.warm()
        app = create_app(client, ServerConfig(keys=(KEY,)))
        with (
            ServerThread(app) as server,
            httpx.Client(
                base_url=server.url, headers={"Authorization": f"Bearer {KEY}"}, timeout=30
            ) as http,
        ):
            now = ANCHOR.isoformat()
            for uid in [*USERS, USERS[0]]:  # the repeat is served from the cache
                body = {"inputs": {"user.id": uid}, "outputs": OUTPUTS, "now": now}
                assert http.post("/v1/query/online", json=body).status_code == 200
            asked = http.post(
                "/v1/query/online",
                json={"inputs": {"user.id": USERS[1]}, "outputs": [VERDICT], "now": now},
            )
            assert asked.status_code == 200, asked.text
            client.log.flush()
            yield Served(server.url, http, client, asked.json()["query_id"], server)
            server.call(client.aclose())  # on the loop its connections were made on


@pytest.fixture(scope="module")
def page(served: Served) -> Iterator[tuple[Page, Watch]]:
    with chromium() as browser:
        context = browser.new_context(viewport={"width": 1360, "height": 900})
        tab = context.new_page()
        watch = Watch()
        watch.attach(tab)
        yield tab, watch
        context.close()


def sign_in(page: Page, url: str, key: str) -> None:
    page.fill("#key", key)
    page.click("main form button[type=submit]")
    page.wait_for_load_state()


def test_signing_in_puts_the_key_in_an_httponly_strict_cookie(
    served: Served, page: tuple[Page, Watch]
) -> None:
    tab, watch = page
    tab.goto(f"{served.url}/ui/")
    expect(tab.locator("h1")).to_have_text("Sign in")
    sign_in(tab, served.url, "not-the-key")
    expect(tab.locator(".error")).to_contain_text("not one of this server's")
    sign_in(tab, served.url, KEY)
    expect(tab.locator("h1")).to_have_text("Features")
    (cookie,) = [c for c in tab.context.cookies() if c["name"] == "kairos_key"]
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict" and cookie["path"] == "/ui"
    assert not watch.dialogs and not watch.csp_violations, watch.console


def test_features_list_every_feature_with_what_computes_it(
    served: Served, page: tuple[Page, Watch]
) -> None:
    tab, watch = page
    tab.goto(f"{served.url}/ui/features")
    graph = served.client.graph
    for namespace, cls in graph.classes.items():
        rows = tab.locator(f"#class-{namespace} + table tbody tr")
        expect(rows).to_have_count(len(cls.features))
    risk = tab.locator("tr", has=tab.locator("a", has_text="risk")).filter(has_text="model")
    expect(risk.first).to_contain_text("risk")
    expect(tab.locator("tr", has_text="max_staleness").first).to_be_visible()
    shoot(tab, "01-features")
    tab.click("text=account_age_days")
    expect(tab.locator("h1")).to_have_text("user.account_age_days")
    tab.goto(f"{served.url}/ui/features/user.risk")
    kinds = {box.get_attribute("data-kind") for box in tab.locator("svg.lineage g.node").all()}
    assert {"model", "sql", "expression", "input"} <= kinds, kinds
    expect(tab.locator("svg.lineage g.node.target")).to_have_count(1)
    expect(tab.locator("svg.lineage g.node.target")).to_contain_text("model")
    assert tab.locator("svg.lineage path.edge").count() >= len(kinds) - 1
    shoot(tab, "02-feature-lineage")
    assert not watch.dialogs and not watch.csp_violations, watch.console


def test_a_decisions_page_shows_the_values_the_log_holds(
    served: Served, page: tuple[Page, Watch]
) -> None:
    tab, watch = page
    tab.goto(f"{served.url}/ui/decisions")
    tab.fill("#entity-1", f"user.id:{USERS[0]}")
    tab.click("main form.filters button[type=submit]")
    logged = served.http.get("/v1/log", params={"entity": f"user.id:{USERS[0]}"}).json()
    ids = [record["query_id"] for record in logged["records"]]
    assert len(ids) == 2  # the first query and its cached repeat
    expect(tab.locator("table.decisions tbody tr")).to_have_count(len(ids))
    shoot(tab, "03-decisions")
    tab.click(f"text={ids[-1]}")  # the older one: computed, not cached
    expect(tab.locator("h1")).to_contain_text(ids[-1])
    record = served.http.get(f"/v1/log/{ids[-1]}").json()
    for name, value in record["values"].items():
        row = tab.locator(f"[id='value-{name}']")
        expect(row.locator("td.value")).to_have_text(value_text(value["value"]))
        expect(row.locator("td").nth(2)).to_have_text(value["source"] or "–")
    assert tab.locator("table.values tbody tr").count() == len(record["values"])
    nodes = {step["label"] for step in record["trace"] if step.get("node") is not None}
    chart = tab.locator("svg.chart").first
    for label in nodes:
        expect(chart).to_contain_text(label[:30])
    shoot(tab, "04-decision")
    tab.select_option("#recompute", "user.risk")
    tab.click("main form button:has-text('Replay')")
    expect(tab.locator("main")).to_contain_text("user.risk")
    shoot(tab, "05-replay")
    tab.goto(f"{served.url}/ui/decisions/{served.llm_query}")
    llm = served.http.get(f"/v1/log/{served.llm_query}").json()["llm_calls"][0]
    tokens = tab.locator("table.tokens tbody tr")
    expect(tokens).to_have_count(len(llm["tokens_by_feature"]))
    for feature, count in llm["tokens_by_feature"].items():
        expect(tokens.filter(has_text=feature).first).to_contain_text(str(count))
    stages = {"context_ms": "context assembly", "queue_ms": "queue", "ttft_ms": "TTFT",
              "decode_ms": "decode"}  # fmt: skip
    assert {"context_ms", "ttft_ms", "decode_ms"} <= set(llm)  # a provider reports no queue
    for field, stage in stages.items():
        if llm.get(field) is not None:
            expect(tab.locator("svg.chart").last).to_contain_text(stage)
    expect(tab.locator("pre.message").first).to_have_text(llm["messages"][0]["content"])
    shoot(tab, "06-decision-llm")
    assert not watch.dialogs and not watch.csp_violations, watch.console


def test_models_show_versions_aliases_and_who_moved_them(
    served: Served, page: tuple[Page, Watch]
) -> None:
    tab, watch = page
    tab.goto(f"{served.url}/ui/models")
    expect(tab.locator("table.models")).to_contain_text("risk")
    tab.click("table.models >> text=risk")
    registered = served.http.get("/v1/models/risk").json()
    for version in registered["versions"]:
        expect(tab.locator(f"#v{version['version']}")).to_contain_text(version["sha256"][:12])
    expect(tab.locator("table.models-aliases")).to_contain_text("prod")
    shoot(tab, "07-model")
    assert not watch.dialogs and not watch.csp_violations, watch.console


def test_live_shows_traffic_cache_and_freshness(served: Served, page: tuple[Page, Watch]) -> None:
    tab, watch = page
    tab.goto(f"{served.url}/ui/live")
    expect(tab.locator("#endpoint-query_online")).to_be_visible()
    online = tab.locator("#endpoint-query_online td").nth(1)
    assert int(online.inner_text().replace(",", "")) >= len(USERS) + 2
    expect(tab.locator("#cache-window")).not_to_have_text("–")
    for name in ("user.risk", "user.txn_count[1d]"):
        expect(tab.locator(f"table.live-freshness tr[data-feature='{name}']")).to_be_visible()
    expect(tab.locator(f"table.live-cost tr[data-llm='{VERDICT}']")).to_be_visible()
    shoot(tab, "08-live")
    assert not watch.dialogs and not watch.csp_violations, watch.console


def test_gateway_pages_need_the_admin_key_and_show_the_ledger(
    served: Served, page: tuple[Page, Watch]
) -> None:
    tab, watch = page
    tab.goto(f"{served.url}/ui/gateway")
    expect(tab.locator("h1")).to_have_text("Sign in")  # the server key is not the admin key
    sign_in(tab, served.url, ADMIN)
    expect(tab.locator("h1")).to_contain_text("Gateway")
    keys = served.server.call(served.client.llm.gateway().list_keys())
    assert keys
    for key in keys:
        expect(tab.locator("main")).to_contain_text(key.name)
    expect(tab.locator("#gw-requests")).to_have_text("1")
    shoot(tab, "09-gateway")
    assert not watch.dialogs and not watch.csp_violations, watch.console
