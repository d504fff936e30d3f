"""`kairos query` and `kairos explain` over a project folder, on embedded defaults (or, with
`--url`, against a running server).

kairos query --project examples/fraud --in user.id=u0001 --out user.risk --out user.name
kairos explain --project examples/fraud --in user.id --out user.risk
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from datetime import datetime
from typing import Any

import click
from rich.text import Text

from kairos.cli.console import console
from kairos.cli.llm_path import breakdown, token_table
from kairos.cli.options import Command, json_option, project_option
from kairos.cli.tables import cell, show
from kairos.client import Client
from kairos.engine.result import QueryResult
from kairos.errors import KairosError


def parse_inputs(pairs: Sequence[str]) -> dict[str, Any]:
    """`--in` values: `["user.id=u1", "n=3"]` -> `{"user.id": "u1", "n": 3}`."""
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


_OUT = click.option(
    "--out",
    "outputs",
    multiple=True,
    metavar="FEATURE",
    help="a feature to compute (repeatable), e.g. --out user.risk",
)


@click.command("query", cls=Command)
@project_option
@click.option("--url", help="query a running server instead (token: $KAIROS_API_KEY)")
@click.option(
    "--in",
    "inputs",
    multiple=True,
    metavar="FEATURE=VALUE",
    help="an input value (repeatable), e.g. --in user.id=u1; read as JSON, else as text",
)
@_OUT
@click.option("--now", help="ISO time to query as of (default: now)")
@click.option("--explain", is_flag=True, help="print the plan first")
@json_option("the result")
def query_command(
    project: str,
    url: str | None,
    inputs: tuple[str, ...],
    outputs: tuple[str, ...],
    now: str | None,
    explain: bool,
    as_json: bool,
) -> int:
    """Compute features for one entity."""
    if not outputs:
        raise KairosError("name at least one output: --out user.risk")
    try:
        moment = datetime.fromisoformat(now) if now else None
    except ValueError:
        raise KairosError(f"--now {now!r} is not an ISO time, e.g. 2026-06-01T12:00:00Z") from None
    values = parse_inputs(inputs)
    if url:  # the same calls over HTTP, answered as the same types
        with Client(url=url, key=os.environ.get("KAIROS_API_KEY") or None) as remote:
            if explain:
                print(remote.explain(list(values), list(outputs)), end="\n\n")
            result = remote.query(values, list(outputs), now=moment)
    else:
        with Client(project) as client:
            if explain:
                print(client.explain(list(values), list(outputs)), end="\n\n")
            result = client.query(typed(client, values, outputs), list(outputs), now=moment)
    if as_json:
        print(_json(result))
    else:
        _print_result(result)
    return 1 if result.errors else 0


@click.command("explain", cls=Command)
@project_option
@click.option(
    "--in",
    "inputs",
    multiple=True,
    metavar="FEATURE",
    help="an input feature (repeatable); with --tokens, FEATURE=VALUE",
)
@_OUT
@click.option(
    "--tokens",
    is_flag=True,
    help="run the query (--in FEATURE=VALUE) and show which features fill each prompt",
)
def explain_command(
    project: str, inputs: tuple[str, ...], outputs: tuple[str, ...], tokens: bool
) -> int:
    """Print the plan for inputs and outputs."""
    with Client(project) as client:
        print(client.explain([i.partition("=")[0] for i in inputs], list(outputs)))
        if tokens:
            values = parse_inputs(inputs)
            result = client.query(typed(client, values, outputs), list(outputs))
            print()
            print(token_table(result.meta.llm))
            for error in result.errors:
                _error_line(error.feature, error.code, error.message)
    return 0


def typed(client: Client, inputs: dict[str, Any], outputs: Sequence[str]) -> dict[str, Any]:
    """Command-line values are text read as JSON; a str feature keeps `123` as "123"."""
    plan = client.plan(list(inputs), list(outputs))
    converted = {}
    for name, value in inputs.items():
        column = plan.columns[client.name(name)]
        kind = column.info.type.kind if column.info.type else "any"
        converted[name] = str(value) if kind == "str" and not isinstance(value, str) else value
    return converted


def _print_result(result: QueryResult) -> None:
    rows = [(fv.feature, cell(fv.value), fv.source or "-", cell(fv.observed_at)) for fv in result]
    show(("feature", "value", "source", "observed_at"), rows)
    for error in result.errors:
        _error_line(error.feature, error.code, error.message)
    for line in breakdown(result.meta.llm):
        print(line)
    _took(result.meta.query_id, result.meta.duration_ms)


def _error_line(feature: str, code: str, message: str) -> None:
    console().print(Text(f"error {feature}: {code}: {message}", style="red"))


def _took(query_id: str, duration_ms: float) -> None:
    console().print(Text(f"query {query_id} in {duration_ms:.2f} ms", style="dim"))


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
