"""`kairos replay`: logged decisions re-run with another model version, printed as a summary
(and written as a Markdown report with `--output`).

    kairos replay --since 1d --model risk@v2 --output report.md
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from kairos.client.client import Client
from kairos.errors import KairosError


def add_replay_command(commands: Any) -> None:
    replay = commands.add_parser(
        "replay", help="re-run logged decisions with another model version"
    )
    replay.add_argument("--project", default=".", help="project folder (default: .)")
    replay.add_argument("--since", help="decisions from this ISO time or duration ago (1d)")
    replay.add_argument("--until", help="decisions before this ISO time or duration ago")
    replay.add_argument(
        "--entity", action="append", default=[], metavar="FEATURE=KEY", help="e.g. user.id=u1"
    )
    replay.add_argument("--id", dest="query_ids", action="append", metavar="QUERY_ID")
    replay.add_argument(
        "--model",
        action="append",
        default=[],
        metavar="NAME@VERSION",
        help="run this model version (risk@v2) or alias (risk@prod)",
    )
    replay.add_argument(
        "--recompute", action="append", default=[], metavar="FEATURE",
        help="recompute a feature from the logged values",
    )  # fmt: skip
    replay.add_argument("--limit", type=int, default=100_000)
    replay.add_argument("--output", help="write the report (Markdown) to this file")
    replay.add_argument("--json", action="store_true", help="print the summary as JSON")
    replay.set_defaults(run=_replay)


def model_pins(specs: list[str]) -> dict[str, int | str]:
    """`["risk@v2", "fraud@prod"]` -> `{"risk": 2, "fraud": "prod"}`."""
    pins: dict[str, int | str] = {}
    for spec in specs:
        name, sep, at = spec.partition("@")
        if not sep or not name or not at:
            raise KairosError(f"--model {spec!r}: use NAME@vN for a version or NAME@ALIAS")
        version = at[1:] if at[:1] == "v" else ""
        pins[name] = int(version) if version.isdigit() else at
    return pins


def _replay(args: argparse.Namespace) -> int:
    entity = {}
    for pair in args.entity:
        name, sep, key = pair.partition("=")
        if not sep:
            raise KairosError(f"--entity {pair!r} needs a key: --entity {pair}=KEY")
        entity[name] = key
    if args.query_ids is None and args.since is None:
        raise KairosError("say which decisions: --since 1d (and --until, --entity) or --id ID")
    with Client(args.project) as client:
        result = client.replay(
            args.query_ids,
            since=args.since,
            until=args.until,
            entity=entity or None,
            limit=args.limit,
            models=model_pins(args.model),
            recompute=args.recompute,
        )
    report = result.to_markdown()
    if args.output:
        with open(args.output, "w", encoding="utf-8") as out:
            out.write(report)
    if args.json:
        print(json.dumps(result.summary(), default=str, indent=2))
    else:
        print(report, end="")
        if args.output:
            print(f"report written to {args.output}")
    return 0
