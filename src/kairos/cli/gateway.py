"""`kairos gateway ...`: serve the model gateway, manage its keys, read its ledger.

kairos gateway serve --project .
kairos gateway keys create --name billing --model chat --budget day:usd=5 --rpm 60
kairos gateway keys list
kairos gateway keys revoke 3f9a0c1d2e4b
kairos gateway usage --key 3f9a0c1d2e4b --since 2026-11-01

The key commands work on the registry named in `kairos.yaml` (the admin API does the same
over HTTP); a new key is printed once and never stored in plain text.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any, TypeVar

from kairos.cli.serve import is_local
from kairos.cli.tables import grid
from kairos.errors import KairosError
from kairos.gateway import Gateway, GatewayConfig
from kairos.gateway.app import create_gateway_app
from kairos.gateway.ledger import period_bound, summarize
from kairos.http.server import serve
from kairos.ui import UI
from kairos.ui.gateway import with_dashboard

T = TypeVar("T")


def add_gateway_commands(commands: Any) -> None:
    """Add `gateway` and its subcommands to the top-level parser's subparsers."""
    gateway = commands.add_parser("gateway", help="the model gateway (LLM keys, budgets, ledger)")
    actions = gateway.add_subparsers(required=True, metavar="ACTION")

    serve = actions.add_parser("serve", help="run the gateway's HTTP server")
    serve.add_argument("--project", default=".")
    serve.add_argument("--host")
    serve.add_argument("--port", type=int)
    serve.set_defaults(run=_serve)

    keys = actions.add_parser("keys", help="create, list and revoke gateway keys")
    key_actions = keys.add_subparsers(required=True, metavar="ACTION")
    create = key_actions.add_parser("create", help="create a key (printed once)")
    create.add_argument("--project", default=".")
    create.add_argument("--name", required=True)
    create.add_argument("--model", dest="models", action="append", default=[], metavar="GROUP")
    create.add_argument("--rpm", type=int, help="requests per minute")
    create.add_argument("--tpm", type=int, help="tokens per minute")
    create.add_argument(
        "--budget", dest="budgets", action="append", default=[], metavar="PERIOD:usd=N|tokens=N",
        help="e.g. day:usd=5, month:tokens=1000000, total:usd=100 (repeatable)",
    )  # fmt: skip
    create.add_argument("--expires", help="ISO time after which the key stops working")
    create.add_argument("--json", action="store_true")
    create.set_defaults(run=_create)
    listing = key_actions.add_parser("list", help="list keys (never their secrets)")
    listing.add_argument("--project", default=".")
    listing.add_argument("--json", action="store_true")
    listing.set_defaults(run=_list)
    revoke = key_actions.add_parser("revoke", help="revoke a key by id")
    revoke.add_argument("key_id")
    revoke.add_argument("--project", default=".")
    revoke.set_defaults(run=_revoke)

    usage = actions.add_parser("usage", help="spend and tokens from the ledger")
    usage.add_argument("--project", default=".")
    usage.add_argument("--key", help="one key's id")
    usage.add_argument("--since", help="ISO time (default: the start of this month, UTC)")
    usage.add_argument("--until", help="ISO time (default: now)")
    usage.add_argument("--json", action="store_true")
    usage.set_defaults(run=_usage)


def _with_gateway(project: str, work: Callable[[Any], Awaitable[T]]) -> T:
    async def main() -> T:
        # keys and usage call no provider, so they need no provider credentials
        gateway = Gateway(GatewayConfig.load(project), providers={})
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


def _create(args: argparse.Namespace) -> int:
    spec: dict[str, Any] = {"name": args.name, "budgets": [_budget(b) for b in args.budgets]}
    if args.models:
        spec["models"] = args.models
    for name in ("rpm", "tpm"):
        if getattr(args, name) is not None:
            spec[name] = getattr(args, name)
    if args.expires:
        spec["expires_at"] = args.expires
    plain, record = _with_gateway(args.project, lambda g: g.create_key(**spec))
    if args.json:
        print(json.dumps({**record.public(), "key": plain}, indent=2))
    else:
        print(f"created key {record.id} ({record.name}); it is shown only this once:\n{plain}")
    return 0


def _list(args: argparse.Namespace) -> int:
    records = _with_gateway(args.project, lambda g: g.list_keys())
    if args.json:
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
        print(grid(("id", "name", "models", "rpm", "tpm", "budgets", "expires"), rows))
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


def _revoke(args: argparse.Namespace) -> int:
    if not _with_gateway(args.project, lambda g: g.revoke_key(args.key_id)):
        raise KairosError(f"no active key {args.key_id!r}; `kairos gateway keys list` shows them")
    print(f"revoked key {args.key_id}")
    return 0


def _time(value: str | None, name: str) -> datetime | None:
    try:
        return period_bound(value)
    except ValueError:
        raise KairosError(f"--{name} {value!r} is not an ISO time, e.g. 2026-11-01") from None


def _usage(args: argparse.Namespace) -> int:
    now = datetime.now(UTC)
    since = _time(args.since, "since") or now.replace(
        day=1, hour=0, minute=0, second=0, microsecond=0
    )
    until = _time(args.until, "until")
    rows = _with_gateway(args.project, lambda g: g.usage(args.key, since, until))
    summary = summarize(rows)
    if args.json:
        print(json.dumps(summary, indent=2))
        return 0
    table = [
        (e["key_id"], e["model"], str(e["requests"]), str(e["tokens_in"]), str(e["tokens_out"]),
         f"${e['cost_micros'] / 1_000_000:.6f}")
        for e in summary["by_key_and_model"]
    ]  # fmt: skip
    if table:
        print(grid(("key", "model", "requests", "tokens in", "tokens out", "cost"), table))
    print(
        f"{summary['requests']} requests since {since.isoformat(timespec='seconds')}, "
        f"${summary['cost_micros'] / 1_000_000:.6f} in all"
    )
    return 0


def _serve(args: argparse.Namespace) -> int:
    config = GatewayConfig.load(args.project)
    host, port = args.host or config.host, args.port or config.port
    if not config.pepper:
        raise KairosError("set gateway.pepper_env in kairos.yaml: keys are hashed with it")
    if not is_local(host) and not config.admin_key:
        raise KairosError(
            f"refusing to serve on {host} without an admin key; set gateway.admin_key_env"
        )
    gateway = Gateway(config)
    app = with_dashboard(
        create_gateway_app(gateway, close_gateway=True),
        UI(gateway=gateway, admin_key=config.admin_key),
    )
    gc.collect()
    gc.freeze()

    def started() -> None:
        models = len(config.models)
        print(f"kairos gateway on http://{host}:{port} ({models} model groups); its dashboard "
              f"at http://{host}:{port}/ui (sign in with the admin key)", flush=True)  # fmt: skip

    serve(app, host, port, on_start=started)
    return 0
