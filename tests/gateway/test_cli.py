"""`kairos gateway keys|usage|serve` on a project folder whose kairos.yaml has a gateway."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import openai
import pytest
import yaml

from kairos.cli.main import main
from kairos.gateway import Gateway, GatewayConfig
from tests.gateway.conftest import ADMIN_KEY, ENVIRON, deployment
from tests.gateway.fake_upstream import FakeUpstream, free_port


@pytest.fixture
def project(upstream: FakeUpstream, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for name, value in ENVIRON.items():
        monkeypatch.setenv(name, value)
    gateway = {
        "admin_key_env": "GW_ADMIN",
        "pepper_env": "GW_PEPPER",
        "providers": {
            "fake": {
                "kind": "openai",
                "base_url": f"{upstream.url}/v1",  # type: ignore[attr-defined]
                "api_key_env": "FAKE_KEY",
            }
        },
        "models": {"chat": {"deployments": [deployment("echo")]}},
    }
    (tmp_path / "kairos.yaml").write_text(yaml.safe_dump({"gateway": gateway}))
    return tmp_path


def test_keys_and_usage(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["--project", str(project)]
    assert main(["gateway", "keys", "create", "--name", "ops", "--model", "chat",
                 "--budget", "day:usd=5", "--rpm", "10", "--json", *args]) == 0  # fmt: skip
    created = json.loads(capsys.readouterr().out)
    assert created["budgets"] == [{"period": "day", "usd_micros": 5_000_000, "tokens": None}]

    async def call() -> None:
        gateway = Gateway(GatewayConfig.load(project))
        try:
            await gateway.chat(
                created["key"], {"model": "chat", "messages": [{"role": "user", "content": "x"}]}
            )
        finally:
            await gateway.close()

    asyncio.run(call())
    assert main(["gateway", "keys", "list", *args]) == 0
    listing = capsys.readouterr().out
    assert created["id"] in listing and "day:$5" in listing and created["key"] not in listing
    assert main(["gateway", "usage", "--key", created["id"], *args]) == 0
    usage = capsys.readouterr().out
    assert "1 requests" in usage and "$0.000015" in usage
    assert main(["gateway", "keys", "revoke", created["id"], *args]) == 0
    assert main(["gateway", "keys", "revoke", created["id"], *args]) == 2
    assert "no active key" in capsys.readouterr().err
    assert main(["gateway", "keys", "create", "--name", "x", "--budget", "day:euros=3", *args]) == 2
    assert "PERIOD:usd=N" in capsys.readouterr().err


@pytest.mark.slow
def test_gateway_serve_runs_its_own_deployment(project: Path) -> None:
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-c", "from kairos.cli import main; raise SystemExit(main())",
         "gateway", "serve", "--project", str(project), "--port", str(port)],
        env={**os.environ, **ENVIRON}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                if httpx.get(f"{url}/healthz").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline and process.poll() is None, process.stderr
            time.sleep(0.1)
        admin = {"authorization": f"Bearer {ADMIN_KEY}"}
        made = httpx.post(f"{url}/admin/keys", json={"name": "svc"}, headers=admin).json()
        key = made["key"]
        with openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0) as sdk:
            reply = sdk.chat.completions.create(
                model="chat", messages=[{"role": "user", "content": "x"}], max_tokens=2
            )
        assert reply.choices[0].message.content == "tok tok "
        usage = httpx.get(f"{url}/admin/usage?rows=1", headers=admin).json()
        assert usage["requests"] == 1 and usage["rows"][0]["cost_micros"] == 12
        page = httpx.get(f"{url}/ui/gateway", headers=admin)  # its dashboard, admin only
        assert page.status_code == 200, page.text
        assert f'data-key="{made["id"]}"' in page.text and key not in page.text
        assert httpx.get(f"{url}/ui/gateway").status_code == 303  # not signed in
    finally:
        process.terminate()
        out, err = process.communicate(timeout=20)
    assert b"/ui" in out
    # stopped cleanly: its access lines on stderr, and no DuckDB object reported leaked at exit
    assert b"POST /v1/chat/completions 200" in err
    assert b"nanobind" not in err and b"leaked" not in err
