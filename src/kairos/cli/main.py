"""`kairos query`, `kairos explain` and `kairos log` over a project folder, on embedded defaults.

kairos query --project examples/fraud --in user.id=u0001 --out user.risk --out user.name
kairos explain --project examples/fraud --in user.id --out user.risk
kairos log list --project examples/fraud --entity user.id=u0001 --since 1h --model risk
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import urllib.error
import urllib.request
from collections.abc import Sequence
from datetime import datetime
from importlib import metadata
from typing import Any

from kairos.cli.consume import add_consume_command
from kairos.cli.deploy import add_deploy_commands
from kairos.cli.gateway import add_gateway_commands
from kairos.cli.history import materialize, offline
from kairos.cli.llm_path import breakdown, token_table
from kairos.cli.models import add_models_commands
from kairos.cli.replay import add_replay_command
from kairos.cli.scaffold import init
from kairos.cli.serve import serve
from kairos.cli.tables import cell, grid, short
from kairos.client import Client
from kairos.engine.result import QueryResult
from kairos.errors import KairosError
from kairos.stores.query_log import LoggedQuery


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        return int(args.run(args))
    except KairosError as error:
        print(f"kairos: {error}", file=sys.stderr)
        return 2


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kairos", description="Real-time features and models.")
    parser.add_argument(
        "--version", action="version", version=f"kairos {metadata.version('kairos-inference')}",
        help="print the installed kairos's version and exit",
    )  # fmt: skip
    commands = parser.add_subparsers(required=True, metavar="COMMAND")

    init_command = commands.add_parser("init", help="create a small working project")
    init_command.add_argument("folder", nargs="?", default=".")
    init_command.set_defaults(run=lambda a: init(a.folder))

    serve_command = commands.add_parser("serve", help="run the HTTP server")
    serve_command.add_argument("project", nargs="?", default=".")
    serve_command.add_argument("--host")
    serve_command.add_argument("--port", type=int)
    serve_command.add_argument(
        "--workers", type=int, default=1, help="processes answering on the port (default 1)"
    )
    serve_command.set_defaults(run=lambda a: serve(a.project, a.host, a.port, a.workers))

    off = commands.add_parser("offline", help="compute features for a spine file (Parquet/CSV)")
    off.add_argument("--project", default=".")
    off.add_argument("--spine", required=True, help="Parquet or CSV with keys and a time column")
    off.add_argument("--out", dest="outputs", action="append", default=[], metavar="FEATURE")
    off.add_argument("--output", required=True, help="Parquet file to write")
    off.add_argument("--timestamp", default="ts")
    off.add_argument("--stored", action="store_true", help="read the offline store as of each row")
    _engine_flags(off)
    off.set_defaults(
        run=lambda a: offline(
            a.project, a.spine, a.outputs, a.output, a.timestamp, a.stored, a.engine, a.address
        )
    )

    mat = commands.add_parser("materialize", help="backfill features over a time range")
    mat.add_argument("features", nargs="+", metavar="FEATURE")
    mat.add_argument("--project", default=".")
    mat.add_argument("--start", required=True)
    mat.add_argument("--end", required=True)
    mat.add_argument("--every", default="1d")
    mat.add_argument("--keys", help="comma-separated primary keys")
    mat.add_argument("--keys-sql", help="a query returning the keys in its first column")
    mat.add_argument("--source", help="the source --keys-sql runs on")
    mat.add_argument("--online", action="store_true", help="also update the online store")
    _engine_flags(mat)
    mat.set_defaults(
        run=lambda a: materialize(
            a.project, a.features, a.start, a.end, a.every, a.keys, a.keys_sql, a.source,
            a.online, a.engine, a.address,
        )
    )  # fmt: skip

    log = commands.add_parser("log", help="read the query log")
    log_commands = log.add_subparsers(required=True, metavar="ACTION")
    show = log_commands.add_parser("show", help="what one logged query saw")
    show.add_argument("query_id")
    show.add_argument("--project", default=".")
    show.add_argument("--json", action="store_true")
    show.set_defaults(run=_log_show)
    found = log_commands.add_parser("list", help="find logged decisions, newest first")
    found.add_argument("--project", default=".")
    found.add_argument(
        "--entity", action="append", default=[], metavar="FEATURE=KEY", help="e.g. user.id=u1"
    )
    found.add_argument("--since", help="ISO time, or a duration back from now: 1h")
    found.add_argument("--until", help="ISO time, or a duration back from now (exclusive)")
    found.add_argument("--feature", help="decisions whose plan touched this feature")
    found.add_argument("--model", help="decisions that called this model: risk@v2, or risk")
    found.add_argument("--limit", type=int, default=100)
    found.add_argument("--json", action="store_true", help="print the whole records as JSON")
    found.set_defaults(run=_log_list)

    query = commands.add_parser("query", help="compute features for one entity")
    query.add_argument("--project", default=".", help="project folder (default: .)")
    query.add_argument("--url", help="query a running server instead (token: $KAIROS_API_KEY)")
    query.add_argument("--in", dest="inputs", action="append", default=[], metavar="FEATURE=VALUE")
    query.add_argument("--out", dest="outputs", action="append", default=[], metavar="FEATURE")
    query.add_argument("--now", help="ISO time to query as of (default: now)")
    query.add_argument("--explain", action="store_true", help="print the plan first")
    query.add_argument("--json", action="store_true", help="print JSON instead of a table")
    query.set_defaults(run=_query)

    explain = commands.add_parser("explain", help="print the plan for inputs and outputs")
    explain.add_argument("--project", default=".")
    explain.add_argument("--in", dest="inputs", action="append", default=[], metavar="FEATURE")
    explain.add_argument("--out", dest="outputs", action="append", default=[], metavar="FEATURE")
    explain.add_argument(
        "--tokens",
        action="store_true",
        help="run the query (--in FEATURE=VALUE) and show which features fill each prompt",
    )
    explain.set_defaults(run=_explain)

    add_gateway_commands(commands)
    add_deploy_commands(commands)
    add_models_commands(commands)
    add_replay_command(commands)
    add_consume_command(commands)
    return parser


def _engine_flags(command: argparse.ArgumentParser) -> None:
    command.add_argument(
        "--engine",
        choices=["local", "ray"],
        default="local",
        help="what recomputes: this process (local) or Ray workers "
        "(pip install 'kairos-inference[ray]')",
    )
    command.add_argument(
        "--address", help="the Ray cluster, e.g. ray://head:10001 (default: Ray on this machine)"
    )


def _inputs(pairs: list[str]) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for pair in pairs:
        name, sep, text = pair.partition("=")
        if not sep:
            raise KairosError(f"--in {pair!r} needs a value: --in {pair}=VALUE")
        try:
            values[name] = json.loads(text)  # numbers, booleans, null, quoted strings
        except json.JSONDecodeError:
            values[name] = text
    return values


def _log_show(args: argparse.Namespace) -> int:
    with Client(args.project) as client:
        record = client.log.get(args.query_id)
    if record is None:
        raise KairosError(f"no logged query {args.query_id!r} in {args.project}")
    if args.json:  # the record as GET /v1/log/{query_id} answers it
        print(json.dumps(record.to_dict(), default=_json_value, indent=2))
        return 0
    print(f"query {record.query_id} at {record.now.isoformat()} ({record.duration_ms:.2f} ms)")
    print("inputs: " + ", ".join(f"{k}={v!r}" for k, v in record.inputs.items()))
    rows = [
        (name + (" *" if name in record.outputs else ""), _shown(v.value), v.source or "-",
         v.version or "-", cell(v.observed_at),
         "-" if v.age_s is None else f"{v.age_s:g}s", v.error_code or "")
        for name, v in record.values.items()
    ]  # fmt: skip
    print(grid(("feature (* asked)", "value", "source", "version", "observed_at", "age", "error"),
               rows))  # fmt: skip
    for call in record.model_calls:
        print(f"model {call['version']} -> {call['feature']}: {call['vector']}")
    for call in record.llm_calls:
        cost = call.get("cost_usd")
        print(
            f"llm {call.get('model')} ({call.get('deployment') or '-'}) -> {call.get('feature')}: "
            f"{call.get('prompt_tokens')}+{call.get('completion_tokens')} tokens, "
            f"TTFT {cell(call.get('ttft_ms'))} ms" + ("" if cost is None else f", ${cost:.6f}")
        )
    if record.plan is not None:
        print(f"plan {record.plan.fingerprint}, definitions {record.plan.definitions}")
    return 0


def _shown(value: Any) -> str:
    """A logged value in a table: a has-many as its row count, anything long cut short."""
    if isinstance(value, list) and value and all(isinstance(row, dict) for row in value):
        return f"[{len(value)} rows]"
    return short(" ".join(str(cell(value)).split()))


def _log_list(args: argparse.Namespace) -> int:
    entity = {}
    for pair in args.entity:
        name, sep, key = pair.partition("=")
        if not sep or not name:
            raise KairosError(f"--entity {pair!r} needs a key: --entity {pair or 'user.id'}=KEY")
        entity[name] = key
    with Client(args.project) as client:
        records = client.log.search(
            entity=entity,
            since=args.since,
            until=args.until,
            feature=args.feature,
            model=args.model,
            limit=args.limit,
        )
    if args.json:
        body = {"records": [record.to_dict() for record in records]}
        print(json.dumps(body, default=_json_value, indent=2))
    elif not records:
        print("no logged decision matches", file=sys.stderr)
    else:
        print(grid(("query_id", "now", "duration", "outputs"), [_listed(r) for r in records]))
    return 0


def _listed(record: LoggedQuery) -> tuple[str, str, str, str]:
    outputs = ", ".join(f"{name}={cell(v.value)}" for name, v in record.outputs.items())
    return (record.query_id, cell(record.now), f"{record.duration_ms:.2f} ms", short(outputs))


def _json_value(value: Any) -> Any:
    """What `json` cannot write itself: times in ISO 8601, anything else as text."""
    return value.isoformat() if isinstance(value, datetime) else str(value)


def _remote(url: str, inputs: dict[str, Any], outputs: list[str], now: datetime | None) -> Any:
    body: dict[str, Any] = {"inputs": inputs, "outputs": outputs}
    if now is not None:
        body["now"] = now.isoformat()
    request = urllib.request.Request(
        url.rstrip("/") + "/v1/query/online",
        data=json.dumps(body).encode(),
        headers={"content-type": "application/json"},
    )
    token = os.environ.get("KAIROS_API_KEY")
    if token:
        request.add_header("authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as error:
        detail = json.loads(error.read() or b"{}").get("error", {})
        raise KairosError(
            f"server said {error.code}: {detail.get('message', error.reason)}"
        ) from None
    except urllib.error.URLError as error:
        raise KairosError(f"cannot reach {url}: {error.reason}") from None


def _query(args: argparse.Namespace) -> int:
    if not args.outputs:
        raise KairosError("name at least one output: --out user.risk")
    try:
        now = datetime.fromisoformat(args.now) if args.now else None
    except ValueError:
        raise KairosError(
            f"--now {args.now!r} is not an ISO time, e.g. 2026-06-01T12:00:00Z"
        ) from None
    inputs = _inputs(args.inputs)
    if args.url:
        body = _remote(args.url, inputs, args.outputs, now)
        if args.json:
            print(json.dumps(body, indent=2))
        else:
            rows = [
                (name, cell(f["value"]), f["source"] or "-", str(f["observed_at"] or "-"))
                for name, f in body["features"].items()
            ]
            print(grid(("feature", "value", "source", "observed_at"), rows))
            for error in body["errors"]:
                print(f"error {error['feature']}: {error['code']}: {error['message']}")
            for line in breakdown(body["meta"].get("llm") or []):
                print(line)
            print(f"query {body['query_id']} in {body['meta']['duration_ms']:.2f} ms")
        return 1 if body["errors"] else 0
    with Client(args.project) as client:
        if args.explain:
            print(client.explain(list(inputs), args.outputs), end="\n\n")
        result = client.query(_typed(client, inputs, args.outputs), args.outputs, now=now)
    print(_json(result) if args.json else _table(result))
    return 1 if result.errors else 0


def _typed(client: Client, inputs: dict[str, Any], outputs: list[str]) -> dict[str, Any]:
    """Command-line values are text read as JSON; a str feature keeps `123` as "123"."""
    plan = client.plan(list(inputs), outputs)
    typed = {}
    for name, value in inputs.items():
        column = plan.columns[client.name(name)]
        kind = column.info.type.kind if column.info.type else "any"
        typed[name] = str(value) if kind == "str" and not isinstance(value, str) else value
    return typed


def _explain(args: argparse.Namespace) -> int:
    with Client(args.project) as client:
        print(client.explain([i.partition("=")[0] for i in args.inputs], args.outputs))
        if args.tokens:
            inputs = _inputs(args.inputs)
            result = client.query(_typed(client, inputs, args.outputs), args.outputs)
            print()
            print(token_table(result.meta.llm))
            for error in result.errors:
                print(f"error {error.feature}: {error.code}: {error.message}")
    return 0


def _json(result: QueryResult) -> str:
    body = {
        "query_id": result.meta.query_id,
        "now": result.meta.now.isoformat(),
        "values": result.values,
        "features": {
            fv.feature: {
                "value": fv.value,
                "observed_at": fv.observed_at.isoformat() if fv.observed_at else None,
                "source": fv.source,
            }
            for fv in result
        },
        "errors": [
            {"feature": e.feature, "code": e.code, "message": e.message} for e in result.errors
        ],
        "trace": [
            {"node": t.node, "kind": t.kind, "label": t.label, "duration_ms": t.duration_ms}
            for t in result.trace
        ],
        "llm": list(result.meta.llm),
    }
    return json.dumps(body, default=str, indent=2)


def _table(result: QueryResult) -> str:
    rows = [(fv.feature, cell(fv.value), fv.source or "-", cell(fv.observed_at)) for fv in result]
    lines = [grid(("feature", "value", "source", "observed_at"), rows)]
    lines += [f"error {e.feature}: {e.code}: {e.message}" for e in result.errors]
    lines += breakdown(result.meta.llm)
    lines.append(f"query {result.meta.query_id} in {result.meta.duration_ms:.2f} ms")
    return "\n".join(lines)
