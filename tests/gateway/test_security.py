"""Keys are stored as peppered hashes, never echoed; allow-lists cannot be bypassed; the
admin API takes only the admin key; no credential reaches a log line, error body or ledger."""

from __future__ import annotations

import asyncio
import logging
import sqlite3
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from kairos.gateway import Gateway, Unauthenticated
from kairos.gateway.keys import hash_secret
from tests.gateway.conftest import ADMIN_KEY, PROVIDER_SECRET, config, deployment, new_key
from tests.gateway.fake_upstream import FakeUpstream, ServerThread

HI = [{"role": "user", "content": "hi"}]


def post(server: ServerThread, path: str, key: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{server.url}{path}", json=body, headers={"authorization": f"Bearer {key}"})


def test_keys_are_stored_as_peppered_hashes(served: ServerThread, tmp_path: Path) -> None:
    key = new_key(served)
    secret = key.split("-", 2)[2]
    with sqlite3.connect(tmp_path / "gateway.db") as connection:
        [(stored,)] = connection.execute("select secret_hash from gateway_keys").fetchall()
        dump = "\n".join(connection.iterdump())
    assert secret not in dump and key not in dump
    assert stored == hash_secret("pepper-1", secret) != hash_secret("other pepper", secret)


@pytest.mark.parametrize("state", ["revoked", "expired", "wrong secret"])
def test_bad_keys_are_refused_without_echo(served: ServerThread, state: str) -> None:
    gateway: Gateway = served.gateway  # type: ignore[attr-defined]
    past = (datetime.now(UTC) - timedelta(seconds=1)).isoformat()
    key = new_key(served, expires_at=past) if state == "expired" else new_key(served)
    if state == "revoked":
        assert served.call(gateway.revoke_key(key.split("-")[1]))
    if state == "wrong secret":
        key = key[:-4] + ("aaaa" if not key.endswith("aaaa") else "bbbb")
    response = post(served, "/v1/chat/completions", key, {"model": "chat", "messages": HI})
    assert response.status_code == 401
    assert key not in response.text and key.split("-", 2)[2] not in response.text
    assert response.json()["error"]["type"] == "authentication_error"


def test_allow_list_cannot_be_bypassed(upstream: FakeUpstream, tmp_path: Path) -> None:
    models = {
        "chat": {"deployments": [deployment("echo")]},
        "secret": {"deployments": [deployment("echo")]},
    }
    gateway = Gateway(config(upstream, tmp_path, models=models, aliases={"fast": "secret"}))
    from kairos.gateway.app import create_gateway_app

    with ServerThread(create_gateway_app(gateway), kairos=True) as server:
        server.gateway = gateway  # type: ignore[attr-defined]
        key = new_key(server, models=["chat", "fast"])  # an alias name grants nothing
        body = {"model": "secret", "messages": HI}
        for path in ("/v1/chat/completions?model=chat", "/v1/chat/completions"):
            response = post(server, path, key, body)
            assert response.status_code == 403, path
            assert response.json()["error"]["code"] == "model_not_allowed"
        response = post(server, "/v1/chat/completions", key, {**body, "model": "fast"})
        assert response.status_code == 403
        response = post(server, "/v1/messages", key, {**body, "max_tokens": 5})
        assert response.status_code == 403
        assert response.json()["error"]["type"] == "permission_error"
        listed = httpx.get(f"{server.url}/v1/models", headers={"authorization": f"Bearer {key}"})
        assert [m["id"] for m in listed.json()["data"]] == ["chat"]
        assert upstream.received == []
        server.call(gateway.close())


def test_admin_api_takes_only_the_admin_key(served: ServerThread) -> None:
    user_key = new_key(served)
    for key in (user_key, "x", "wrong"):
        response = post(served, "/admin/keys", key, {"name": "x"})
        assert response.status_code == 401
    admin = {"authorization": f"Bearer {ADMIN_KEY}"}
    created = httpx.post(
        f"{served.url}/admin/keys",
        json={"name": "team", "models": ["chat"], "budgets": [{"period": "day", "usd": 2.5}]},
        headers=admin,
    )
    assert created.status_code == 201
    body = created.json()
    assert body["key"].startswith("kgw-") and body["budgets"][0]["usd_micros"] == 2_500_000
    listed = httpx.get(f"{served.url}/admin/keys", headers=admin)
    assert body["key"] not in listed.text and "secret_hash" not in listed.text
    assert {k["name"] for k in listed.json()["keys"]} == {"test", "team"}
    bad = httpx.post(f"{served.url}/admin/keys", json={"name": "x", "rpm": -1}, headers=admin)
    assert bad.status_code == 422 and bad.json()["error"]["param"] == "rpm"
    revoked = httpx.delete(f"{served.url}/admin/keys/{body['id']}", headers=admin)
    assert revoked.status_code == 200
    response = post(served, "/v1/chat/completions", body["key"], {"model": "chat", "messages": HI})
    assert response.status_code == 401


def test_no_credential_in_logs_errors_or_ledger(
    upstream: FakeUpstream, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    upstream.behaviour["leaky"] = "bad"
    models = {
        "chat": {"deployments": [deployment("echo")]},
        "leaky": {"deployments": [deployment("leaky")]},
    }
    caplog.set_level(logging.DEBUG)
    gateway = Gateway(config(upstream, tmp_path, models=models))
    assert PROVIDER_SECRET not in repr(gateway.config) and ADMIN_KEY not in repr(gateway.config)

    async def scenario() -> tuple[str, str, list[Any]]:
        plain, key = await gateway.create_key(name="t")
        await gateway.chat(plain, {"model": "chat", "messages": HI})
        try:
            await gateway.chat(key, {"model": "leaky", "messages": HI})
        except Exception as error:
            message = str(error)
        with pytest.raises(Unauthenticated) as refused:
            await gateway.authenticate(plain + "x")
        rows = await gateway.usage()
        await gateway.close()
        return plain, message + str(refused.value), [r.as_dict() for r in rows]

    plain, text, rows = asyncio.run(scenario())
    assert "scripted 400" in text and "***" in text  # the provider's quote, scrubbed
    assert len(rows) == 2
    everything = text + repr(rows) + caplog.text
    for secret in (PROVIDER_SECRET, plain, plain.split("-", 2)[2]):
        assert secret not in everything


def test_a_key_in_use_is_refused_right_after_revocation(served: ServerThread) -> None:
    """Keys that matched are remembered for `key_cache` (no peppered hash per call): a revoke
    forgets them at once, and a near miss of a remembered key is still refused."""
    key = new_key(served)
    body = {"model": "chat", "messages": HI, "max_tokens": 1}
    assert post(served, "/v1/chat/completions", key, body).status_code == 200
    assert post(served, "/v1/chat/completions", key, body).status_code == 200  # remembered
    near = key[:-1] + ("a" if not key.endswith("a") else "b")
    assert post(served, "/v1/chat/completions", near, body).status_code == 401
    admin = {"authorization": f"Bearer {ADMIN_KEY}"}
    assert httpx.delete(f"{served.url}/admin/keys/{key.split('-')[1]}", headers=admin).is_success
    assert post(served, "/v1/chat/completions", key, body).status_code == 401


def test_a_key_revoked_by_another_gateway_is_refused_within_key_cache(
    upstream: FakeUpstream, tmp_path: Path
) -> None:
    """A key in use is checked again in the background once its entry is half `key_cache`
    old, so calls never wait for the check; a revoke through another gateway (process) that
    shares the registry is still seen within `key_cache`."""
    body = {"model": "chat", "messages": HI, "max_tokens": 1}

    async def scenario() -> list[str]:
        here, there = (Gateway(config(upstream, tmp_path, key_cache="0.4s")) for _ in range(2))
        outcomes = []
        try:
            plain, record = await here.create_key(name="app")
            started = asyncio.get_running_loop().time()
            revoked = False
            while asyncio.get_running_loop().time() - started < 1.6:
                if not revoked and asyncio.get_running_loop().time() - started > 0.5:
                    assert await there.revoke_key(record.id)
                    revoked = True
                    outcomes.append("revoked")
                try:
                    await here.chat(plain, body)
                    outcomes.append("ok")
                except Unauthenticated:
                    outcomes.append("refused")
                await asyncio.sleep(0.05)
        finally:
            await here.close()
            await there.close()
        return outcomes

    outcomes = asyncio.run(scenario())
    cut = outcomes.index("revoked")
    assert set(outcomes[:cut]) == {"ok"}  # kept serving while rechecked in the background
    after = outcomes[cut + 1 :]
    assert "ok" not in after[8:]  # 8 calls × 50 ms > key_cache: refused from then on
    assert after[-1] == "refused"
