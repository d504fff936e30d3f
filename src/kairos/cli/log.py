"""`kairos log show` and `kairos log list`: the query log of a project from a shell.

kairos log show 0c4f5e1a --project examples/fraud
kairos log list --project examples/fraud --entity user.id=u0001 --since 1h --model risk
"""

from __future__ import annotations

import json
import sys
from datetime import datetime
from typing import Any

import click

from kairos.cli.options import Group, json_option, project_option
from kairos.cli.tables import cell, short, show
from kairos.client import Client
from kairos.errors import KairosError
from kairos.stores.query_log import LoggedQuery


@click.group("log", cls=Group)
def log_group() -> None:
    """Read the query log."""


@log_group.command("show")
@click.argument("query_id", help="the id a query answered with (query_id)")
@project_option
@json_option("the whole record")
def log_show(query_id: str, project: str, as_json: bool) -> int:
    """What one logged query saw."""
    with Client(project) as client:
        record = client.log.get(query_id)
    if record is None:
        raise KairosError(f"no logged query {query_id!r} in {project}")
    if as_json:  # the record as GET /v1/log/{query_id} answers it
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
    show(("feature (* asked)", "value", "source", "version", "observed_at", "age", "error"), rows)
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


@log_group.command("list")
@project_option
@click.option(
    "--entity", multiple=True, metavar="FEATURE=KEY", help="decisions about this entity: user.id=u1"
)
@click.option("--since", help="ISO time, or a duration back from now: 1h")
@click.option("--until", help="ISO time, or a duration back from now (exclusive)")
@click.option("--feature", help="decisions whose plan touched this feature")
@click.option("--model", help="decisions that called this model: risk@v2, or risk")
@click.option("--limit", type=int, default=100, show_default=True, help="at most this many")
@json_option("the whole records")
def log_list(
    project: str,
    entity: tuple[str, ...],
    since: str | None,
    until: str | None,
    feature: str | None,
    model: str | None,
    limit: int,
    as_json: bool,
) -> int:
    """Find logged decisions, newest first."""
    keys = {}
    for pair in entity:
        name, sep, key = pair.partition("=")
        if not sep or not name:
            raise KairosError(f"--entity {pair!r} needs a key: --entity {pair or 'user.id'}=KEY")
        keys[name] = key
    with Client(project) as client:
        records = client.log.search(
            entity=keys, since=since, until=until, feature=feature, model=model, limit=limit
        )
    if as_json:
        body = {"records": [record.to_dict() for record in records]}
        print(json.dumps(body, default=_json_value, indent=2))
    elif not records:
        print("no logged decision matches", file=sys.stderr)
    else:
        show(("query_id", "now", "duration", "outputs"), [_listed(r) for r in records])
    return 0


def _shown(value: Any) -> str:
    """A logged value in a table: a has-many as its row count, anything long cut short."""
    if isinstance(value, list) and value and all(isinstance(row, dict) for row in value):
        return f"[{len(value)} rows]"
    return short(" ".join(str(cell(value)).split()))


def _listed(record: LoggedQuery) -> tuple[str, str, str, str]:
    outputs = ", ".join(f"{name}={cell(v.value)}" for name, v in record.outputs.items())
    return (record.query_id, cell(record.now), f"{record.duration_ms:.2f} ms", short(outputs))


def _json_value(value: Any) -> Any:
    """What `json` cannot write itself: times in ISO 8601, anything else as text."""
    return value.isoformat() if isinstance(value, datetime) else str(value)
