"""Markup stored where the dashboard shows it — feature values, entity keys, descriptions, tags
and owners, rendered prompts and LLM answers, gateway key names — is shown as text in a real
browser and never runs: no dialog opens, no injected element exists, no script executes."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

import httpx
import pytest
from playwright.sync_api import Page

import kairos as kr
from kairos import feature, features, online
from kairos.gateway import Gateway
from kairos.project.config import ServerConfig
from kairos.server import create_app
from tests.client.test_decision_records import Upstream
from tests.gateway.fake_upstream import ServerThread
from tests.ui.browser import Watch, chromium, shoot
from tests.ui.gateways import gateway_config

pytestmark = pytest.mark.slow

KEY, ADMIN = "xss-test-key-0123456789", "xss-test-admin-0123456789"
SCRIPT = "<script>window.__xss = 'script'; alert('script')</script>"
ATTRIBUTE = "\"><img src=x onerror=\"window.__xss='img'; alert('img')\">"
SVG = "<svg onload=\"alert('svg')\"></svg>"
HOSTILE_ID = "s1\"><img src=x onerror=alert('id')>"


@features
class Shop:
    id: str
    name: str = feature(description=SCRIPT, owner=SVG, tags=[ATTRIBUTE, "ok"])
    blurb: str = kr.completion(
        model="judge",
        messages=[kr.message("user", "{{ name }}: describe this shop. " + SCRIPT)],
        max_tokens=20,
        temperature=0,
    )


@online
def shop_name(sid: Shop.id) -> Shop.name:
    return f"{ATTRIBUTE} {sid} </td></tr></table>{SCRIPT}"


@dataclass
class Served:
    url: str
    query_ids: list[str]


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    folder: Path = tmp_path_factory.mktemp("ui-xss")
    fake = Upstream()
    with ServerThread(fake.app()) as upstream:
        config = gateway_config(upstream.url, folder, ADMIN, "judge")
        gateway = Gateway(config)
        llm_key, _ = asyncio.run(gateway.create_key(name=SCRIPT + ATTRIBUTE, models=["judge"]))
        client = kr.Client(
            definitions=[Shop, shop_name],
            query_log=f"sqlite:///{folder / 'log.db'}",
            offline_store="none://",
            gateway=gateway,
            llm_key=llm_key,
        )
        app = create_app(client, ServerConfig(keys=(KEY,)))
        with (
            ServerThread(app) as server,
            httpx.Client(
                base_url=server.url, headers={"Authorization": f"Bearer {KEY}"}, timeout=30
            ) as http,
        ):
            ids = []
            for sid in (HOSTILE_ID, "s2"):
                body = {"inputs": {"shop.id": sid}, "outputs": ["shop.name", "shop.blurb"]}
                answer = http.post("/v1/query/online", json=body)
                assert answer.status_code == 200, answer.text
                assert not answer.json()["errors"], answer.json()["errors"]
                ids.append(answer.json()["query_id"])
            client.log.flush()
            yield Served(server.url, ids)
            server.call(client.aclose())


def pages(served: Served) -> list[tuple[str, str]]:
    first = served.query_ids[0]
    return [
        ("features", "/ui/features"),
        ("feature", "/ui/features/shop.name"),
        ("decisions", "/ui/decisions"),
        ("decisions-search", "/ui/decisions?entity=" + quote(f"shop.id:{HOSTILE_ID}")),
        ("decision", f"/ui/decisions/{first}"),
        ("models", "/ui/models"),
        ("live", "/ui/live"),
        ("gateway", "/ui/gateway"),
    ]


def sign_in(tab: Page, url: str, key: str) -> None:
    tab.goto(f"{url}/ui/login")
    tab.fill("#key", key)
    tab.click("main form button[type=submit]")
    tab.wait_for_load_state()


def test_nothing_stored_runs_in_the_browser(served: Served) -> None:
    with chromium() as browser:
        context = browser.new_context(viewport={"width": 1360, "height": 900})
        tab = context.new_page()
        watch = Watch()
        watch.attach(tab)
        sign_in(tab, served.url, KEY)
        sign_in(tab, served.url, ADMIN)  # the gateway's pages
        shown: dict[str, str] = {}
        for name, path in pages(served):
            response = tab.goto(served.url + path)
            assert response is not None and response.status == 200, (path, response)
            csp = response.headers["content-security-policy"]
            assert "default-src 'none'" in csp and "script-src" not in csp, csp
            assert tab.evaluate("typeof window.__xss") == "undefined", path
            assert tab.locator("script").count() == 0, path
            assert tab.locator("img").count() == 0, path  # the dashboard draws no images
            assert tab.locator("svg[onload]").count() == 0, path
            shown[name] = tab.inner_text("main")
            shoot(tab, f"xss-{name}")
        context.close()
    assert not watch.dialogs, watch.dialogs
    # the markup is there, as text, where it was stored
    assert SCRIPT in shown["features"] and ATTRIBUTE in shown["features"]
    assert SVG in shown["feature"]
    assert HOSTILE_ID in shown["decisions"] and HOSTILE_ID in shown["decisions-search"]
    assert f"{ATTRIBUTE} {HOSTILE_ID} </td></tr></table>{SCRIPT}" in shown["decision"]
    assert "describe this shop. " + SCRIPT in shown["decision"]  # the rendered prompt
    assert SCRIPT + ATTRIBUTE in shown["gateway"]  # the key's name
