"""The Gateway page over a real gateway (SQLite registry and counters, the fake OpenAI
upstream on a localhost port): after a few calls it lists the keys without secrets, its spend
equals the ledger's, budgets, errors, failovers and TTFT show per model group, revoking takes
the CSRF token, non-admins are sent to the login form; `with_dashboard` routes /ui to the
dashboard and everything else (lifespan too) to the gateway's app; `kairos gateway serve`
serves the page."""

from __future__ import annotations

import html
import re
from collections.abc import AsyncIterator, MutableMapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

import kairos as kr
from kairos.gateway import Gateway, KeyRecord, ModelNotAllowed, Unauthenticated, UpstreamError
from kairos.gateway.app import create_gateway_app
from kairos.server import create_app
from kairos.ui import UI
from kairos.ui.app import fmt_usd
from kairos.ui.gateway import with_dashboard
from tests.gateway.conftest import (
    ADMIN_KEY,
    ENVIRON,
    _reset,
    config,
    deployment,
    registry_url,
    upstream,
)
from tests.gateway.fake_upstream import FakeUpstream
from tests.ui.cells import cells

__all__ = ["_reset", "registry_url", "upstream"]  # the gateway tests' fixtures
pytestmark = pytest.mark.anyio
HI = [{"role": "user", "content": "hi"}]
EVIL = '<script>alert(1)</script>"><img src=x onerror=alert(2)>'
MODELS = {
    "chat": {"deployments": [deployment("echo")]},
    "flaky": {"deployments": [deployment("fail"), deployment("echo", priority=1)]},
    "broken": {"deployments": [deployment("fail")]},
}


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@dataclass
class World:
    gateway: Gateway
    keys: dict[str, tuple[str, KeyRecord]]  # name -> (the full key, its record)


@pytest.fixture
async def world(upstream: FakeUpstream, tmp_path: Path) -> AsyncIterator[World]:
    """Keys alice (a day USD and a month token budget), bob (chat only) and one named with
    markup; alice makes 3 chat calls, one that fails over and one that fails; bob 2 chat
    calls and one to a group he may not use."""
    gateway = Gateway(config(upstream, tmp_path, models=MODELS))
    keys = {
        "alice": await gateway.create_key(
            name="alice", budgets=[{"period": "day", "usd": 1}, {"period": "month", "tokens": 500}]
        ),
        "bob": await gateway.create_key(name="bob", models=["chat"], rpm=100),
        "evil": await gateway.create_key(name=EVIL),
    }
    alice, bob = keys["alice"][0], keys["bob"][0]
    for _ in range(3):
        await gateway.chat(alice, {"model": "chat", "messages": HI, "max_tokens": 5})
    await gateway.chat(alice, {"model": "flaky", "messages": HI, "max_tokens": 3})
    with pytest.raises(UpstreamError):
        await gateway.chat(alice, {"model": "broken", "messages": HI, "max_tokens": 3})
    for _ in range(2):
        await gateway.chat(bob, {"model": "chat", "messages": HI, "max_tokens": 2})
    with pytest.raises(ModelNotAllowed, match="may not use"):
        await gateway.chat(bob, {"model": "flaky", "messages": HI})
    await gateway.drain()
    yield World(gateway, keys)
    await gateway.close()


def app_of(world: World, admin_key: str = ADMIN_KEY) -> Any:
    ui = UI(gateway=world.gateway, admin_key=admin_key)
    return with_dashboard(create_gateway_app(world.gateway), ui)


@pytest.fixture
async def http(world: World) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=app_of(world))
    async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as http:
        login = await http.get("/ui/login?admin=1")
        signed = await http.post(
            "/ui/login",
            data={"csrf": csrf_of(login.text), "key": ADMIN_KEY, "next": "/gateway", "admin": "1"},
        )
        assert signed.status_code == 303 and signed.headers["location"] == "/ui/gateway"
        yield http


def csrf_of(page: str) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', page)
    assert found, "the page has no CSRF field"
    return found.group(1)


def section(page: str, css: str) -> str:
    return page.split(f'class="{css}"', 1)[1].split("</table>", 1)[0]


def stat(page: str, name: str) -> str:
    found = re.search(rf'id="{name}">(.*?)</div>', page, re.S)
    assert found, name
    return html.unescape(found.group(1)).strip()


async def test_the_page_shows_spend_equal_to_the_ledger(
    http: httpx.AsyncClient, world: World
) -> None:
    response = await http.get("/ui/gateway")
    assert response.status_code == 200, response.text
    page = response.text
    rows = await world.gateway.usage()
    assert len(rows) == 8
    assert stat(page, "gw-requests") == "8"
    assert stat(page, "gw-spend") == fmt_usd(sum(r.cost_micros for r in rows) / 1e6)
    assert stat(page, "gw-tokens") == (
        f"{sum(r.tokens_in for r in rows):,} / {sum(r.tokens_out for r in rows):,}"
    )
    for name in ("alice", "bob"):
        record = world.keys[name][1]
        mine = [r for r in rows if r.key_id == record.id]
        usage = cells(section(page, "gateway-usage"), f'data-key="{record.id}"')
        assert usage[0] == f"{name} {record.id}"
        assert usage[1] == str(len(mine))
        assert usage[2] == f"{sum(r.tokens_in for r in mine):,}"
        assert usage[3] == f"{sum(r.tokens_out for r in mine):,}"
        assert usage[4] == fmt_usd(sum(r.cost_micros for r in mine) / 1e6)
        assert usage[5] == str(sum(r.status != "ok" for r in mine))
    # the charts: a line with a point off the axis (some spend in the range)
    lines = re.findall(r'<polyline class="line" points="([^"]+)"', page)
    assert len(lines) == 2
    heights = {float(p.split(",")[1]) for p in lines[0].split()}
    assert len(heights) > 1


async def test_groups_show_errors_failovers_and_ttft(http: httpx.AsyncClient, world: World) -> None:
    page = (await http.get("/ui/gateway?since=1h")).text
    groups = section(page, "gateway-groups")
    chat = cells(groups, 'data-group="chat"')
    assert chat[1] == "5" and chat[2] == "0" and chat[4] == "0"  # calls, errors, failovers
    assert chat[5].endswith("ms") and chat[6].endswith("ms")  # TTFT p50, p99
    flaky = cells(groups, 'data-group="flaky"')
    assert flaky[1] == "2" and flaky[4] == "1"  # alice's failed over; bob's was refused
    assert flaky[2] == "1" and "model_not_allowed 1" in flaky[3]
    broken = cells(groups, 'data-group="broken"')
    assert broken[2] == "1" and "upstream_error 1" in broken[3]
    assert stat(page, "gw-failovers") == "1" and stat(page, "gw-errors") == "2"


async def test_budgets_show_what_the_ledger_used_against_the_limit(
    http: httpx.AsyncClient, world: World
) -> None:
    page = (await http.get("/ui/gateway")).text
    alice = world.keys["alice"][1]
    mine = await world.gateway.usage(alice.id)
    cost, tokens = sum(r.cost_micros for r in mine), sum(r.tokens_in + r.tokens_out for r in mine)
    budgets = section(page, "gateway-budgets")
    day = cells(budgets, 'data-budget="day-usd"')
    assert day[2:5] == [fmt_usd(cost / 1e6), "$1.00", f"{cost / 1e6 * 100:.1f}%"]
    month = cells(budgets, 'data-budget="month-tokens"')
    assert month[2:5] == [str(tokens), "500", f"{tokens / 500 * 100:.1f}%"]
    # the counters hold at least what the ledger charged (they add reserved budget shares)
    assert int(month[5].replace(",", "")) >= tokens
    assert "budgets used against their limits" in page and 'class="limit"' in page


async def test_keys_are_listed_without_secrets_and_escaped(
    http: httpx.AsyncClient, world: World
) -> None:
    page = (await http.get("/ui/gateway")).text
    keys = section(page, "gateway-keys")
    for plain, record in world.keys.values():
        assert plain not in page and plain.split("-", 2)[2] not in page  # kgw-<id>-<secret>
        assert record.secret_hash not in page
        assert f'data-key="{record.id}"' in keys
    bob = cells(keys, f'data-key="{world.keys["bob"][1].id}"')
    assert bob[:5] == ["bob", world.keys["bob"][1].id, "chat", "100", "–"]
    alice = cells(keys, f'data-key="{world.keys["alice"][1].id}"')
    assert alice[5] == "day $1.00month 500 tokens"
    # the name with markup is text: escaped in the table and the key picker, never markup
    assert EVIL not in page and "<img src=x" not in page
    evil = cells(keys, f'data-key="{world.keys["evil"][1].id}"')
    assert evil[0] == EVIL
    assert (
        "&lt;script&gt;alert(1)&lt;/script&gt;&#34;&gt;&lt;img src=x onerror=alert(2)&gt;" in page
    )
    assert ADMIN_KEY not in page
    csp = (await http.get("/ui/gateway")).headers["content-security-policy"]
    assert "default-src 'none'" in csp and "script-src" not in csp


async def test_revoke_takes_the_csrf_token(http: httpx.AsyncClient, world: World) -> None:
    plain, bob = world.keys["bob"]
    page = (await http.get("/ui/gateway")).text
    path = f"/ui/gateway/keys/{bob.id}/revoke"
    refused = await http.post(path, data={})
    assert refused.status_code == 403 and "CSRF token" in refused.text
    assert (await world.gateway.authenticate(plain)).id == bob.id  # still active
    done = await http.post(path, data={"csrf": csrf_of(page)})
    assert done.status_code == 303 and done.headers["location"].endswith(f"revoked={bob.id}#keys")
    with pytest.raises(Unauthenticated, match="revoked"):
        await world.gateway.authenticate(plain)
    page = (await http.get(done.headers["location"])).text
    assert f"Key bob ({bob.id}) is revoked" in page
    row = cells(section(page, "gateway-keys"), f'data-key="{bob.id}"')
    assert row[8] != "–" and row[9] == ""  # a revoked time, no button
    again = await http.post(path, data={"csrf": csrf_of(page)})
    assert again.status_code == 404
    assert "no active key" in again.text and "<code>key</code>" in again.text


async def test_a_key_selector_and_bad_input(http: httpx.AsyncClient, world: World) -> None:
    bob = world.keys["bob"][1]
    page = (await http.get(f"/ui/gateway?since=7d&key={bob.id}")).text
    assert f"key bob ({bob.id})" in page
    assert f'<option value="{bob.id}" selected>' in page
    # the charts are bob's alone: the tokens line's top is his tokens (one 3.5 h bucket)
    tokens = sum(r.tokens_in + r.tokens_out for r in await world.gateway.usage(bob.id))
    chart = page.split("tokens over time, key bob", 1)[1].split("</svg>", 1)[0]
    assert f'text-anchor="end">{tokens}</text>' in chart
    for query, status, field in (
        ("?since=forever", 400, "since"),
        ("?since=2m", 400, "since"),
        ("?key=nope", 404, "key"),
    ):
        response = await http.get(f"/ui/gateway{query}")
        assert response.status_code == status, query
        assert f"<code>{field}</code>" in response.text and "Traceback" not in response.text


async def test_non_admins_are_sent_to_the_login_form(world: World) -> None:
    transport = httpx.ASGITransport(app=app_of(world))
    async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as http:
        response = await http.get("/ui/gateway")
        assert response.status_code == 303
        assert response.headers["location"] == "/ui/login?next=/ui/gateway&admin=1"
        keyed = await http.get(
            "/ui/gateway", headers={"Authorization": f"Bearer {ENVIRON['GW_PEPPER']}"}
        )
        assert keyed.status_code == 303  # not the admin key
        bob = world.keys["bob"][0]
        login = await http.get("/ui/login?admin=1")
        wrong = await http.post("/ui/login", data={"csrf": csrf_of(login.text), "key": bob})
        assert wrong.status_code == 401  # a gateway key is not the admin key
        revoke = await http.post(f"/ui/gateway/keys/{world.keys['alice'][1].id}/revoke")
        assert revoke.status_code == 303 and "/ui/login" in revoke.headers["location"]
    assert world.keys["alice"][1].id in {k.id for k in await world.gateway.list_keys()}
    no_admin = httpx.ASGITransport(app=app_of(world, admin_key=""))
    async with httpx.AsyncClient(transport=no_admin, base_url="http://localhost") as http:
        response = await http.get("/ui/gateway")
        assert response.status_code == 403 and "admin_key_env" in response.text


async def test_with_dashboard_routes_ui_and_passes_the_rest(world: World) -> None:
    app = app_of(world)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as http:
        assert (await http.get("/healthz")).json() == {"status": "ok"}  # the gateway's own
        listing = await http.get(
            "/v1/models", headers={"Authorization": f"Bearer {world.keys['bob'][0]}"}
        )
        assert listing.status_code == 200 and [m["id"] for m in listing.json()["data"]] == ["chat"]
        refused = await http.get("/v1/models")
        assert refused.status_code == 401 and refused.headers["content-type"].startswith(
            "application/json"
        )
        login = await http.get("/ui/login")
        assert login.status_code == 200 and "<form" in login.text
        css = await http.get("/ui/static/kairos.css")
        assert css.status_code == 200 and css.headers["content-type"].startswith("text/css")
        home = await http.get("/ui/")
        assert home.status_code == 303 and home.headers["location"] == "/ui/gateway"
        other = await http.get("/uix")  # not under /ui: the gateway's 404
        assert other.status_code == 404 and other.headers["content-type"].startswith(
            "application/json"
        )
    # lifespan goes to the gateway's app (which starts the gateway)
    fresh = Gateway(world.gateway.config)
    lifespan = with_dashboard(create_gateway_app(fresh), UI(gateway=fresh, admin_key=ADMIN_KEY))
    events = [{"type": "lifespan.startup"}, {"type": "lifespan.shutdown"}]
    sent: list[MutableMapping[str, Any]] = []

    async def receive() -> MutableMapping[str, Any]:
        return events.pop(0)

    async def send(message: MutableMapping[str, Any]) -> None:
        sent.append(message)

    await lifespan({"type": "lifespan", "asgi": {"version": "3.0"}}, receive, send)
    assert [m["type"] for m in sent] == ["lifespan.startup.complete", "lifespan.shutdown.complete"]
    assert fresh._started
    await fresh.close()


def project(folder: Path, upstream: FakeUpstream, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A project folder whose kairos.yaml has a `gateway:` section (the fake provider)."""
    for name, value in ENVIRON.items():
        monkeypatch.setenv(name, value)
    gateway = {
        "admin_key_env": "GW_ADMIN",
        "pepper_env": "GW_PEPPER",
        "providers": {
            "fake": {"kind": "openai", "base_url": f"{upstream.url}/v1", "api_key_env": "FAKE_KEY"}  # type: ignore[attr-defined]
        },
        "models": {"chat": {"deployments": [deployment("echo")]}},
    }
    (folder / "kairos.yaml").write_text(yaml.safe_dump({"gateway": gateway}))
    (folder / "features.py").write_text(
        "from kairos import features\n\n@features\nclass Item:\n    id: str\n    price: float\n"
    )
    return folder


async def test_kairos_serve_shows_the_page_of_the_projects_gateway(
    upstream: FakeUpstream, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with kr.Client(project(tmp_path, upstream, monkeypatch)) as client:
        gateway = client.llm.gateway()
        plain, record = await gateway.create_key(name="features")
        await gateway.chat(plain, {"model": "chat", "messages": HI, "max_tokens": 2})
        await gateway.drain()
        transport = httpx.ASGITransport(app=create_app(client))
        admin = {"Authorization": f"Bearer {ADMIN_KEY}"}
        async with httpx.AsyncClient(
            transport=transport, base_url="http://localhost", headers=admin
        ) as http:
            response = await http.get("/ui/gateway")
        await gateway.close()
    assert response.status_code == 200, response.text
    page = response.text
    assert 'href="/ui/models"' in page and 'href="/ui/gateway"' in page  # both in the nav
    assert stat(page, "gw-requests") == "1" and f'data-key="{record.id}"' in page


async def test_the_page_reads_either_registry(
    upstream: FakeUpstream, tmp_path: Path, registry_url: str
) -> None:
    """SQLite and PostgreSQL registries: the same totals, equal to the ledger's."""
    gateway = Gateway(config(upstream, tmp_path, models=MODELS, registry=registry_url))
    try:
        plain, record = await gateway.create_key(name="pg", budgets=[{"period": "total", "usd": 2}])
        for _ in range(3):
            await gateway.chat(plain, {"model": "chat", "messages": HI, "max_tokens": 4})
        await gateway.chat(plain, {"model": "flaky", "messages": HI, "max_tokens": 4})
        await gateway.drain()
        rows = await gateway.usage()
        ui = UI(gateway=gateway, admin_key=ADMIN_KEY)
        transport = httpx.ASGITransport(app=with_dashboard(create_gateway_app(gateway), ui))
        admin = {"Authorization": f"Bearer {ADMIN_KEY}"}
        async with httpx.AsyncClient(
            transport=transport, base_url="http://localhost", headers=admin
        ) as http:
            page = (await http.get("/ui/gateway?since=1h")).text
    finally:
        await gateway.close()
    spent = fmt_usd(sum(r.cost_micros for r in rows) / 1e6)
    assert stat(page, "gw-requests") == "4" and stat(page, "gw-spend") == spent
    assert cells(section(page, "gateway-usage"), f'data-key="{record.id}"')[4] == spent
    assert cells(section(page, "gateway-groups"), 'data-group="flaky"')[4] == "1"
    assert cells(section(page, "gateway-budgets"), 'data-budget="total-usd"')[2] == spent
