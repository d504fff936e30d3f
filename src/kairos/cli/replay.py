"""`kairos replay`: logged decisions re-run with another model version, printed as a summary
(and written as a Markdown report with `--output`).

    kairos replay --since 1d --model risk@v2 --output report.md
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import click

from kairos.cli.options import Command, json_option, project_option
from kairos.client.client import Client
from kairos.errors import KairosError


@click.command("replay", cls=Command)
@project_option
@click.option("--since", help="decisions from this ISO time or duration ago (1d)")
@click.option("--until", help="decisions before this ISO time or duration ago")
@click.option(
    "--entity", multiple=True, metavar="FEATURE=KEY", help="decisions about this entity: user.id=u1"
)
@click.option(
    "--id", "query_ids", multiple=True, metavar="QUERY_ID",
    help="this logged decision (repeatable), instead of --since",
)  # fmt: skip
@click.option(
    "--model", multiple=True, metavar="NAME@VERSION",
    help="run this model version (risk@v2) or alias (risk@prod)",
)  # fmt: skip
@click.option(
    "--recompute", multiple=True, metavar="FEATURE",
    help="recompute a feature from the logged values",
)  # fmt: skip
@click.option(
    "--limit", type=int, default=100_000, show_default=True, help="re-run at most this many"
)
@click.option("--output", help="write the report (Markdown) to this file")
@json_option("the summary")
def replay_command(
    project: str,
    since: str | None,
    until: str | None,
    entity: tuple[str, ...],
    query_ids: tuple[str, ...],
    model: tuple[str, ...],
    recompute: tuple[str, ...],
    limit: int,
    output: str | None,
    as_json: bool,
) -> int:
    """Re-run logged decisions with another model version."""
    keys = {}
    for pair in entity:
        name, sep, key = pair.partition("=")
        if not sep:
            raise KairosError(f"--entity {pair!r} needs a key: --entity {pair}=KEY")
        keys[name] = key
    if not query_ids and since is None:
        raise KairosError("say which decisions: --since 1d (and --until, --entity) or --id ID")
    with Client(project) as client:
        result = client.replay(
            list(query_ids) or None,
            since=since,
            until=until,
            entity=keys or None,
            limit=limit,
            models=model_pins(model),
            recompute=list(recompute),
            keep=0,  # the report is the summary: hold its sums, not every row
        )
    report = result.to_markdown()
    if output:
        with open(output, "w", encoding="utf-8") as out:
            out.write(report)
    if as_json:
        print(json.dumps(result.summary(), default=str, indent=2))
    else:
        print(report, end="")
        if output:
            print(f"report written to {output}")
    return 0


def model_pins(specs: Sequence[str]) -> dict[str, int | str]:
    """`["risk@v2", "fraud@prod"]` -> `{"risk": 2, "fraud": "prod"}`."""
    pins: dict[str, int | str] = {}
    for spec in specs:
        name, sep, at = spec.partition("@")
        if not sep or not name or not at:
            raise KairosError(f"--model {spec!r}: use NAME@vN for a version or NAME@ALIAS")
        version = at[1:] if at[:1] == "v" else ""
        pins[name] = int(version) if version.isascii() and version.isdigit() else at
    return pins
