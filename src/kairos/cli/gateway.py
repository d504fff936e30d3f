"""`kairos gateway ...`: serve the model gateway, manage its keys, read its ledger.

kairos gateway serve --project .
kairos gateway keys create --name billing --model chat --budget day:usd=5 --rpm 60
kairos gateway keys list
kairos gateway keys revoke 3f9a0c1d2e4b
kairos gateway usage --key 3f9a0c1d2e4b --since 2026-11-01

The key commands work on the registry named in `kairos.yaml` (the admin API does the same
over HTTP); a new key is printed once and never stored in plain text. The configuration is the
one the project's clients build (kairos.project.gateway): its `deployments:` are model
groups, and `gateway serve` runs them while it serves.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import click

from kairos.cli.options import PORT, Group, json_option, project_option
from kairos.cli.serve import freeze_heap, is_local
from kairos.cli.server_logging import configure_logging
from kairos.cli.tables import show
from kairos.errors import KairosError
from kairos.gateway import Gateway
from kairos.gateway.accounting.ledger import period_bound, summarize
from kairos.gateway.app import create_gateway_app
from kairos.http.server import serve
from kairos.project.config import LoggingConfig
from kairos.project.deployments import LocalDeployments
from kairos.project.gateway import (
    gateway_providers,
    project_deployments,
    project_gateway_config,
)
from kairos.ui import UI
from kairos.ui.gateway import with_dashboard

T = TypeVar("T")


@click.group("gateway", cls=Group)
def gateway_group() -> None:
    """The model gateway (LLM keys, budgets, ledger)."""


@gateway_group.group("keys")
def keys_group() -> None:
    """Create, list and revoke gateway keys."""


def _with_gateway(project: str, work: Callable[[Any], Awaitable[T]]) -> T:
    async def main() -> T:
        # keys and usage call no provider, so they need no provider credentials
        gateway = Gateway(project_gateway_config(Path(project)), providers={})
        try:
            return await work(gateway)
        finally:
            await gateway.close()

    return asyncio.run(main())


def _budget(text: str) -> dict[str, Any]:
    period, _, rest = text.partition(":")
    unit, _, amount = rest.partition("=")
    try:
        value = float(amount) if unit == "usd" else int(amount)
    except ValueError:
        value = None
    if not period or unit not in ("usd", "tokens") or value is None:
        raise KairosError(
            f"--budget {text!r}: write PERIOD:usd=N or PERIOD:tokens=N, e.g. day:usd=5"
        )
    return {"period": period, unit: value}


@keys_group.command("create")
@project_option
@click.option("--name", required=True, help="what the key is for, e.g. billing")
@click.option(
    "--model", "models", multiple=True, metavar="GROUP",
    help="a model group the key may call (repeatable; default: every one)",
)  # fmt: skip
@click.option("--rpm", type=int, help="requests per minute")
@click.option("--tpm", type=int, help="tokens per minute")
@click.option(
    "--budget", "budgets", multiple=True, metavar="PERIOD:usd=N|tokens=N",
    help="e.g. day:usd=5, month:tokens=1000000, total:usd=100 (repeatable)",
)  # fmt: skip
@click.option("--expires", help="ISO time after which the key stops working")
@json_option("the key and its fields")
def create_command(
    project: str,
    name: str,
    models: tuple[str, ...],
    rpm: int | None,
    tpm: int | None,
    budgets: tuple[str, ...],
    expires: str | None,
    as_json: bool,
) -> int:
    """Create a key (printed once)."""
    spec: dict[str, Any] = {"name": name, "budgets": [_budget(b) for b in budgets]}
    if models:
        spec["models"] = list(models)
    for field, limit in (("rpm", rpm), ("tpm", tpm)):
        if limit is not None:
            spec[field] = limit
    if expires:
        spec["expires_at"] = expires
    plain, record = _with_gateway(project, lambda g: g.create_key(**spec))
    if as_json:
        print(json.dumps({**record.public(), "key": plain}, indent=2))
    else:
        print(f"created key {record.id} ({record.name}); it is shown only this once:\n{plain}")
    return 0


@keys_group.command("list")
@project_option
@json_option("the keys")
def list_command(project: str, as_json: bool) -> int:
    """List keys (never their secrets)."""
    records = _with_gateway(project, lambda g: g.list_keys())
    if as_json:
        print(json.dumps([r.public() for r in records], indent=2))
        return 0
    rows = [
        (
            r.id, r.name, ",".join(r.models), str(r.rpm or "-"), str(r.tpm or "-"),
            " ".join(_budget_text(b.as_dict()) for b in r.budgets) or "-",
            "revoked" if r.revoked_at else (r.expires_at.isoformat() if r.expires_at else "-"),
        )
        for r in records
    ]  # fmt: skip
    if rows:
        show(("id", "name", "models", "rpm", "tpm", "budgets", "expires"), rows)
    else:
        print("no keys yet; create one with: kairos gateway keys create --name NAME")
    return 0


def _budget_text(budget: dict[str, Any]) -> str:
    parts = []
    if budget["usd_micros"] is not None:
        parts.append(f"${budget['usd_micros'] / 1_000_000:g}")
    if budget["tokens"] is not None:
        parts.append(f"{budget['tokens']} tok")
    return f"{budget['period']}:{'+'.join(parts)}"


@keys_group.command("revoke")
@click.argument("key_id", help="the key's id, as `kairos gateway keys list` shows")
@project_option
def revoke_command(key_id: str, project: str) -> int:
    """Revoke a key by id."""
    if not _with_gateway(project, lambda g: g.revoke_key(key_id)):
        raise KairosError(f"no active key {key_id!r}; `kairos gateway keys list` shows them")
    print(f"revoked key {key_id}")
    return 0


def _time(value: str | None, name: str) -> datetime | None:
    try:
        return period_bound(value)
    except ValueError:
        raise KairosError(f"--{name} {value!r} is not an ISO time, e.g. 2026-11-01") from None


@gateway_group.command("usage")
@project_option
@click.option("--key", help="one key's id (default: every key)")
@click.option("--since", help="ISO time (default: the start of this month, UTC)")
@click.option("--until", help="ISO time (default: now)")
@json_option("the summary")
def usage_command(
    project: str, key: str | None, since: str | None, until: str | None, as_json: bool
) -> int:
    """Spend and tokens from the ledger."""
    now = datetime.now(UTC)
    start = _time(since, "since") or now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    end = _time(until, "until")
    rows = _with_gateway(project, lambda g: g.usage(key, start, end))
    summary = summarize(rows)
    if as_json:
        print(json.dumps(summary, indent=2))
        return 0
    table = [
        (e["key_id"], e["model"], str(e["requests"]), str(e["tokens_in"]), str(e["tokens_out"]),
         f"${e['cost_micros'] / 1_000_000:.6f}")
        for e in summary["by_key_and_model"]
    ]  # fmt: skip
    if table:
        show(("key", "model", "requests", "tokens in", "tokens out", "cost"), table)
    print(
        f"{summary['requests']} requests since {start.isoformat(timespec='seconds')}, "
        f"${summary['cost_micros'] / 1_000_000:.6f} in all"
    )
    return 0


@gateway_group.command("serve")
@project_option
@click.option("--host", help="the address to listen on (default: gateway.host in kairos.yaml)")
@click.option("--port", type=PORT, help="the port to listen on (default: gateway.port)")
def serve_command(project: str, host: str | None, port: int | None) -> int:
    """Run the gateway's HTTP server."""
    config = project_gateway_config(Path(project))
    host, port = host or config.host, port or config.port
    if not config.pepper:
        raise KairosError("set gateway.pepper_env in kairos.yaml: keys are hashed with it")
    if not is_local(host) and not config.admin_key:
        raise KairosError(
            f"refusing to serve on {host} without an admin key; set gateway.admin_key_env"
        )
    deployments = LocalDeployments(project_deployments(Path(project)), Path(project))
    gateway = Gateway(config, providers=gateway_providers(config, deployments))
    app = with_dashboard(
        create_gateway_app(gateway, close_gateway=True),
        UI(gateway=gateway, admin_key=config.admin_key),
    )
    # kairos.yaml `logging:`, to stderr, once the gateway is built: a command that fails
    # before (a missing credential) leaves the process's logging as it was
    configure_logging(LoggingConfig.load(project))
    freeze_heap()  # unfrozen at exit: DuckDB's objects are freed, not reported leaked

    def started() -> None:
        models = len(config.models)
        print(f"kairos gateway on http://{host}:{port} ({models} model groups); its dashboard "
              f"at http://{host}:{port}/ui (sign in with the admin key)", flush=True)  # fmt: skip

    deployments.start_all()  # the project's replicas load while the gateway starts
    try:
        serve(app, host, port, on_start=started)
    finally:
        deployments.close()
    return 0
