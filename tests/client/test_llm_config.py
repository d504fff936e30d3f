"""The embedded LLM by configuration: `deployments:` checked at load (errors name the setting),
a deployment served through the project's own gateway with the tokenizer and context it was
started with, /readyz reporting it, the features' own `kairos-features` key (its allow-list,
budgets, re-issue and revocation) and the local pepper file."""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import os
import signal
import stat
import threading
import time
from pathlib import Path

import httpx
import pytest

import kairos as kr
from kairos.cli.main import main
from kairos.errors import KairosError, ProjectError
from kairos.gateway import Gateway, GatewayConfig
from kairos.gateway.errors import GatewayConfigError
from kairos.project.config import Config, ServerConfig
from kairos.project.deployments import DeploymentUnavailable
from kairos.project.gateway import (
    FEATURES_KEY,
    current_features_key,
    features_key,
    local_pepper,
)
from kairos.server import create_app
from tests.serving.tiny_gguf import write_tiny_gguf

FEATURES = """\
import kairos as kr
from kairos.cli.main import main
from kairos import features


@features
class User:
    id: str
    note: str = kr.completion(
        model="local/tiny",
        messages=[kr.message("user", "hello {{ id }}")],
        max_tokens=3,
        temperature=0,
        timeout="60s",
    )
"""

CONFIG = """\
deployments:
  tiny: {model: models/tiny.gguf, ctx: 256, threads: 1, ready_timeout: 60s}
gateway:
  registry: sqlite:///.kairos/gateway.db
  counters: sqlite:///.kairos/gateway.db
  key_cache: 0s
  aliases: {local/tiny: tiny}
"""


def write_project(folder: Path, config: str = CONFIG, features: str = FEATURES) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "kairos.yaml").write_text(config)
    (folder / "features.py").write_text(features)
    return folder


@pytest.fixture(scope="module")
def tiny_project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = write_project(tmp_path_factory.mktemp("tiny") / "project")
    (folder / "models").mkdir()
    write_tiny_gguf(folder / "models" / "tiny.gguf")
    return folder


# --- the deployments section is checked when the project loads ------------------------------


@pytest.mark.parametrize(
    ("section", "named"),
    [
        ("[gemma]", "`deployments` maps names to replica groups"),
        ("{gemma: small}", "deployments.gemma is a mapping of settings"),
        ("{gemma: {engine: tpu}}", "deployments.gemma.engine is one of llamacpp, vllm"),
        ("{gemma: {modle: x.gguf}}", "deployments.gemma: unknown setting(s) modle"),
        ("{gemma: {model: ''}}", "deployments.gemma.model is 'gemma3-270m'"),
        ("{gemma: {threads: 0}}", "deployments.gemma.threads is a whole number >= 1, got 0"),
        ("{gemma: {ctx: big}}", "deployments.gemma.ctx is a whole number >= 16, got 'big'"),
        ("{gemma: {replicas: true}}", "deployments.gemma.replicas is a whole number"),
        ("{gemma: {replicas: 2, max_replicas: 1}}", "deployments.gemma.replicas: replicas"),
        ("{gemma: {cpus: [[-1]]}}", "deployments.gemma.cpus lists each replica's cores"),
        ("{gemma: {engine: vllm, model: m, cpus: [0]}}", "deployments.gemma.cpus: cpus="),
        ("{gemma: {ready_timeout: soon}}", "deployments.gemma.ready_timeout"),
    ],
)
def test_a_bad_deployment_names_its_setting(tmp_path: Path, section: str, named: str) -> None:
    write_project(tmp_path, f"deployments: {section}\n")
    with pytest.raises(ProjectError) as raised:
        Config.load(tmp_path)
    assert named in str(raised.value)
    assert str(tmp_path / "kairos.yaml") in str(raised.value)


def test_the_client_refuses_a_bad_deployment_before_anything_starts(tmp_path: Path) -> None:
    write_project(tmp_path, "deployments:\n  gemma: {engine: llamacpp, threads: -2}\n")
    with pytest.raises(ProjectError, match=r"deployments\.gemma\.threads is a whole number >= 1"):
        kr.Client(tmp_path)


def test_a_good_deployment_keeps_every_setting(tmp_path: Path) -> None:
    write_project(
        tmp_path,
        "deployments:\n  g: {model: gemma3-270m, replicas: 1, max_replicas: 2, threads: 2, "
        "ctx: 4096, seed: 7, cpus: [0, 1], ready_timeout: 2m}\n",
    )
    (spec,) = Config.load(tmp_path).deployments.values()
    assert (spec.name, spec.engine, spec.model, spec.replicas, spec.highest) == (
        "g", "llamacpp", "gemma3-270m", 1, 2,
    )  # fmt: skip
    assert (spec.threads, spec.ctx, spec.seed, spec.cpus) == (2, 4096, 7, ((0,), (1,)))
    assert spec.ready_timeout == 120.0


@pytest.mark.parametrize(
    ("budgets", "named"),
    [
        ("{day: 5}", "llm.budgets is a list"),
        ("[{period: week, tokens: 5}]", "llm.budgets: budgets[0].period must be day, month"),
        ("[{period: day}]", "llm.budgets: budgets[0]: give usd and/or tokens"),
    ],
)
def test_bad_llm_budgets_name_the_budget(tmp_path: Path, budgets: str, named: str) -> None:
    write_project(tmp_path, f"llm:\n  budgets: {budgets}\n")
    with pytest.raises(ProjectError, match=named.replace("[", r"\[").replace("]", r"\]")):
        Config.load(tmp_path)


def test_a_deployment_named_like_a_gateway_group_is_refused(tmp_path: Path) -> None:
    config = CONFIG + "  models:\n    tiny: {deployments: [{provider: up, model: m}]}\n"
    config += "  providers:\n    up: {base_url: 'http://127.0.0.1:9/v1'}\n"
    with (
        kr.Client(write_project(tmp_path, config)) as client,
        pytest.raises(GatewayConfigError, match="already has a provider or model group 'tiny'"),
    ):
        client.llm.gateway()


# --- a deployment served through the gateway, started on first use -------------------------


def test_the_deployment_serves_the_feature_with_its_own_tokenizer_and_context(
    tiny_project: Path,
) -> None:
    with kr.Client(tiny_project) as client:
        assert client.llm.deployments.status()["tiny"].state == "idle"
        result = client.query({"user.id": "u1"}, ["user.note"])
        assert result.errors == []
        assert isinstance(result.get_value("user.note"), str)
        (call,) = result.meta.llm
        assert call["deployment"] == "tiny" and call["exact"]  # the GGUF's own vocabulary
        assert call["tokenizer"] == "gguf:tiny.gguf"
        assert client.llm.context("local/tiny", client.llm.tokenizer("local/tiny")) == 256
        (pid,) = client.llm.deployments.pids()
        (log,) = (tiny_project / ".kairos" / "deployments").glob("tiny-*.log")
        assert log.stat().st_size > 0  # replica logs are kept in the project
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_readyz_reports_a_deployment_starting_then_ready(tiny_project: Path) -> None:
    async def probe() -> list[tuple[int, dict[str, object]]]:
        with kr.Client(tiny_project) as client:
            transport = httpx.ASGITransport(app=create_app(client))
            async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as http:
                client.llm.deployments.start_all()  # as kairos serve's start does
                seen = []
                deadline = time.monotonic() + 60
                while time.monotonic() < deadline:
                    answer = await http.get("/readyz")
                    seen.append((answer.status_code, answer.json()))
                    if answer.status_code == 200:
                        break
                    await asyncio.sleep(0.05)
                return seen

    seen = asyncio.run(probe())
    assert seen[0] == (503, {"status": "starting", "deployments": {"tiny": "starting"}})
    assert seen[-1] == (200, {"status": "ready", "deployments": {"tiny": "ready"}})


def test_readyz_says_restarting_while_a_dead_replica_comes_back(tiny_project: Path) -> None:
    async def probe() -> list[str]:
        with kr.Client(tiny_project) as client:
            await client.llm.deployments.ready("tiny")
            (pid,) = client.llm.deployments.pids()
            os.kill(pid, signal.SIGKILL)
            transport = httpx.ASGITransport(app=create_app(client))
            async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as http:
                seen: list[str] = []
                deadline = time.monotonic() + 60
                while time.monotonic() < deadline:
                    answer = await http.get("/readyz")
                    state = answer.json()["deployments"]["tiny"]
                    seen.append(f"{answer.status_code} {state}")
                    if seen[-1] == "200 ready" and "503 restarting" in seen:
                        break
                    await asyncio.sleep(0.05)
                return seen

    seen = asyncio.run(probe())
    assert "503 restarting" in seen
    assert seen[-1] == "200 ready"  # the supervisor started it again


def test_a_deployment_that_cannot_start_names_the_setting(tmp_path: Path) -> None:
    project = write_project(tmp_path / "p", CONFIG.replace("models/tiny.gguf", "missing.gguf"))

    async def run() -> tuple[object, httpx.Response, httpx.Response]:
        with kr.Client(project) as client:
            result = await client.query_async({"user.id": "u1"}, ["user.note"])
            app = create_app(client, ServerConfig(keys=("server-key",)))
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as http:
                anonymous = await http.get("/readyz")
                insider = await http.get("/readyz", headers={"Authorization": "Bearer server-key"})
            return result, anonymous, insider

    result, anonymous, insider = asyncio.run(run())
    (error,) = result.errors  # type: ignore[attr-defined]
    assert "deployments.tiny.model: no GGUF file" in error.message
    assert str(project / "missing.gguf") in error.message
    assert (anonymous.status_code, anonymous.json()) == (
        503, {"status": "unavailable", "deployments": {"tiny": "failed"}},
    )  # fmt: skip
    assert insider.json()["deployments"]["tiny"].startswith("failed: deployments.tiny.model")


def test_an_engine_not_installed_leaves_the_server_ready(
    tiny_project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("kairos.project.deployments._installed", lambda module: False)

    async def run() -> httpx.Response:
        with kr.Client(tiny_project) as client:
            with pytest.raises(DeploymentUnavailable, match="kairos-inference\\[llm\\]"):
                await client.llm.deployments.ready("tiny")
            transport = httpx.ASGITransport(app=create_app(client))
            async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as http:
                return await http.get("/readyz")

    ready = asyncio.run(run())
    assert (ready.status_code, ready.json()["status"]) == (200, "ready")
    # without server keys the caller is local, so it is shown why
    assert ready.json()["deployments"]["tiny"].startswith(
        "unavailable: deployments.tiny: the llamacpp engine needs llama-cpp-python"
    )


# --- the key the features spend ----------------------------------------------------------


def gateway_of(folder: Path, **section: object) -> Gateway:
    raw = {
        "pepper_env": "PEPPER",
        "registry": f"sqlite:///{folder / 'gw.db'}",
        "counters": f"sqlite:///{folder / 'gw.db'}",
        "providers": {"up": {"base_url": "http://127.0.0.1:9/v1"}},
        "models": {
            "chat": {"deployments": [{"provider": "up", "model": "a"}], "fallbacks": ["big"]},
            "big": {"deployments": [{"provider": "up", "model": "b"}]},
            "other": {"deployments": [{"provider": "up", "model": "c"}]},
        },
        "aliases": {"fast": "chat"},
        **section,
    }
    return Gateway(GatewayConfig.from_mapping(raw, base_dir=folder, environ={"PEPPER": "p" * 20}))


def test_the_features_key_is_kept_and_changed_in_place(tmp_path: Path) -> None:
    async def run() -> None:
        gateways = [gateway_of(tmp_path), gateway_of(tmp_path)]  # two processes of a project
        try:
            # at once, as two `kairos serve --workers` processes start: one key survives,
            # and each process's next check moves it to that one
            await asyncio.gather(*(features_key(g, ["fast"], []) for g in gateways))
            (kept,) = [k for k in await gateways[0].list_keys() if k.revoked_at is None]
            for gateway in gateways:
                current = await current_features_key(gateway)
                assert current is not None and current.id == kept.id
            assert kept.name == FEATURES_KEY
            assert kept.models == ("big", "chat")  # the alias's group and its fallback
            assert (await features_key(gateways[0], ["fast"], [])).id == kept.id  # a restart
            # new budgets and another model: the same key, changed in place, so what its
            # budget counters hold (keyed by its id) goes on counting
            day = [{"period": "day", "tokens": 1000}]
            budgeted = await features_key(gateways[0], ["fast", "other"], day)
            assert budgeted.id == kept.id
            assert [(b.period, b.tokens) for b in budgeted.budgets] == [("day", 1000)]
            assert budgeted.models == ("big", "chat", "other")
            stored = await gateways[1].registry.get_key(kept.id)  # what the others read
            assert stored is not None and stored.models == budgeted.models
            assert stored.budgets == budgeted.budgets
            active = [k for k in await gateways[0].list_keys() if k.revoked_at is None]
            assert [k.id for k in active] == [kept.id]
        finally:
            for gateway in gateways:
                await gateway.close()

    asyncio.run(run())


def test_a_shared_registry_without_a_pepper_is_refused(tmp_path: Path) -> None:
    gateway = gateway_of(
        tmp_path, pepper_env=None, registry="postgresql://kairos@127.0.0.1:5432/test"
    )
    with pytest.raises(KairosError, match=r"set gateway\.pepper_env"):
        asyncio.run(features_key(gateway, ["fast"], []))


def test_a_revoked_features_key_stops_the_features(tiny_project: Path, tmp_path: Path) -> None:
    with kr.Client(tiny_project) as client:
        assert client.query({"user.id": "u1"}, ["user.note"]).errors == []
        gateway = client.llm.gateway()
        (key,) = [k for k in asyncio.run(gateway.list_keys()) if k.revoked_at is None]
        assert key.name == FEATURES_KEY and key.models == ("tiny",)
        asyncio.run(gateway.revoke_key(key.id))  # the dashboard's revoke
        (error,) = client.query({"user.id": "u2"}, ["user.note"]).errors
    assert f"{FEATURES_KEY!r} ({key.id}), was revoked" in error.message
    with kr.Client(tiny_project) as restarted:  # a restart issues a new one
        assert restarted.query({"user.id": "u3"}, ["user.note"]).errors == []


def test_the_pepper_file_is_made_once_and_private(tmp_path: Path) -> None:
    path = tmp_path / ".kairos" / "gateway.pepper"
    pepper = local_pepper(path)
    assert len(pepper) >= 32 and local_pepper(path) == pepper
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert (path.parent / ".gitignore").read_text() == "*\n"  # never committed
    path.chmod(0o644)
    with pytest.raises(KairosError, match=r"others may read it .*chmod 600"):
        local_pepper(path)


def _pepper_after(start: threading.Barrier, path: Path, _: int) -> str:
    start.wait()
    return local_pepper(path)


def test_processes_making_the_pepper_at_once_agree(tmp_path: Path) -> None:
    """Workers starting together: none reads a half-made file, all get the same pepper."""
    for attempt in range(20):
        path = tmp_path / str(attempt) / ".kairos" / "gateway.pepper"
        make = functools.partial(_pepper_after, threading.Barrier(8), path)
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            peppers = set(pool.map(make, range(8)))
        assert len(peppers) == 1 and len(peppers.pop()) >= 32
        assert sorted(p.name for p in path.parent.iterdir()) == [".gitignore", "gateway.pepper"]


def test_a_missing_tokenizer_file_names_its_setting_and_the_server_still_starts(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """kairos serve's start loads llm.tokenizers ahead: a missing file is one warning line
    (it used to end the start with llama.cpp's ValueError traceback), and the setting's
    error is what the feature reports."""
    project = write_project(tmp_path / "p", "llm:\n  tokenizers: {local/tiny: nothere.gguf}\n")

    async def start() -> int:
        with kr.Client(project) as client:
            app = create_app(client)
            async with app.router.lifespan_context(app):  # kairos serve's start
                transport = httpx.ASGITransport(app=app)
                async with httpx.AsyncClient(
                    transport=transport, base_url="http://127.0.0.1"
                ) as http:
                    return (await http.get("/readyz")).status_code

    assert asyncio.run(start()) == 200
    (warning,) = [r for r in caplog.records if r.name == "kairos.project.llm"]
    assert warning.levelname == "WARNING"
    assert "llm.tokenizers.local/tiny: no GGUF file" in warning.getMessage()
    assert str(project / "nothere.gguf") in warning.getMessage()
    with kr.Client(project) as client, pytest.raises(ProjectError, match=r"llm\.tokenizers"):
        client.llm.tokenizer("local/tiny")


def test_a_gateway_given_in_keeps_its_own_key_rule(tmp_path: Path) -> None:
    """Client(gateway=...) is the caller's wiring: no key is issued, deployments are not run."""
    project = write_project(tmp_path / "p")
    gateway = gateway_of(tmp_path)
    with kr.Client(project, gateway=gateway) as client:
        assert not client.llm.deployments
        (error,) = client.query({"user.id": "u1"}, ["user.note"]).errors
    assert "llm.key_env" in error.message


def test_kairos_init_writes_a_project_whose_settings_load(tmp_path: Path) -> None:
    from_init = tmp_path / "init"
    assert main(["init", str(from_init)]) == 0
    config = Config.load(from_init)
    assert set(config.deployments) == {"gemma-270m"}
    assert config.deployments["gemma-270m"].ctx == 4096
    assert [dict(b) for b in config.llm.budgets] == [{"period": "day", "tokens": 200000}]
    text = (from_init / "kairos.yaml").read_text()
    for key in ("engine:", "model:", "replicas:", "threads:", "ctx:", "registry:", "counters:"):
        (line,) = [line for line in text.splitlines() if line.strip().startswith(key)]
        assert "#" in line  # each setting says what it is
