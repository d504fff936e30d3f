"""`kairos models ...`: the model registry from a shell.

kairos models list --project examples/fraud
kairos models show risk
kairos models register risk model.onnx --format onnx --alias canary
kairos models alias risk prod 2          # point prod at version 2
kairos models rollback risk prod         # and back
kairos models history risk
kairos models predict risk --rows '[{"user.txn_count[1d]": 3, ...}]' --alias prod
kairos models score risk --data features.parquet --output scores.parquet --alias prod
"""

from __future__ import annotations

import argparse
import getpass
import json
import sys
from pathlib import Path
from typing import Any

from kairos.client import Client
from kairos.errors import KairosError
from kairos.models import formats


def add_models_commands(commands: Any) -> None:
    models = commands.add_parser("models", help="register, version, alias and serve models")
    actions = models.add_subparsers(required=True, metavar="ACTION")

    def action(name: str, help: str, run: Any) -> argparse.ArgumentParser:
        parser: argparse.ArgumentParser = actions.add_parser(name, help=help)
        parser.add_argument("--project", default=".", help="project folder (default: .)")
        parser.set_defaults(run=run)
        return parser

    action("list", "registered models, their newest version and aliases", _list)
    show = action("show", "every version of a model: schema, sha256, aliases", _show)
    show.add_argument("name")

    register = action("register", "register an artifact file in a safe format", _register)
    register.add_argument("name")
    register.add_argument("file", help="the artifact: .onnx, .skops, .ubj/.json, .txt, .cbm")
    register.add_argument("--format", help="onnx | skops | xgboost-ubj | xgboost-json | "
                          "lightgbm-text | catboost-cbm (default: from the extension)")  # fmt: skip
    register.add_argument("--alias", action="append", default=[], dest="aliases")
    register.add_argument("--inputs", help="comma-separated input names, when the model has none")
    register.add_argument("--meta", action="append", default=[], metavar="KEY=VALUE")

    alias = action("alias", "point an alias at a version", _alias)
    alias.add_argument("name")
    alias.add_argument("alias")
    alias.add_argument("version", type=int)

    rollback = action("rollback", "point an alias back where it was before", _rollback)
    rollback.add_argument("name")
    rollback.add_argument("alias")

    history = action("history", "every alias change, with its time", _history)
    history.add_argument("name")

    predict = action("predict", "predict rows given as JSON", _predict)
    predict.add_argument("name")
    predict.add_argument("--rows", required=True, help="JSON list of objects or lists, or @file")
    _pick(predict)

    score = action("score", "batch-score a Parquet file into another", _score)
    score.add_argument("name")
    score.add_argument("--data", required=True, help="Parquet file with the model's inputs")
    score.add_argument("--output", required=True, help="Parquet file to write")
    score.add_argument("--column", default="prediction")
    _pick(score)


def _pick(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--version", type=int)
    parser.add_argument("--alias")


_EXTENSIONS = {
    ".onnx": "onnx",
    ".skops": "skops",
    ".ubj": "xgboost-ubj",
    ".json": "xgboost-json",
    ".txt": "lightgbm-text",
    ".cbm": "catboost-cbm",
}


def _list(args: argparse.Namespace) -> int:
    with Client(args.project) as client:
        names = client.models.names()
        if not names:
            print("no models registered (client.models.register or kairos models register)")
        for name in names:
            versions = client.models.versions(name)
            aliases = ", ".join(f"{a}=v{v}" for a, v in client.models.aliases(name).items())
            print(f"{name}  v{versions[-1].version}  ({len(versions)} versions)  {aliases}")
    return 0


def _show(args: argparse.Namespace) -> int:
    with Client(args.project) as client:
        for v in client.models.versions(args.name):
            schema = v.schema
            print(
                f"{v.label}  {v.framework}/{v.format}  sha256:{v.sha256[:16]}  {v.size} bytes  "
                f"{v.created_at.isoformat(timespec='seconds')}  aliases: "
                f"{', '.join(v.aliases) or '-'}"
            )
            print(f"  inputs ({schema.n_features}): {schema.describe()}")
            classes = "" if schema.classes is None else f", classes {list(schema.classes)}"
            print(f"  output: {schema.output}{classes}; metadata {json.dumps(dict(v.metadata))}")
    return 0


def _register(args: argparse.Namespace) -> int:
    path = Path(args.file)
    if not path.is_file():
        raise KairosError(f"no artifact file {args.file!r}")
    kind = args.format or _EXTENSIONS.get(path.suffix)
    if kind is None:
        raise KairosError(f"cannot tell the format of {path.name}; pass --format")
    metadata = {}
    for pair in args.meta:
        key, sep, value = pair.partition("=")
        if not sep:
            raise KairosError(f"--meta {pair!r} needs KEY=VALUE")
        metadata[key] = value
    inputs = args.inputs.split(",") if args.inputs else None
    model = formats.from_artifact(path.read_bytes(), kind)
    with Client(args.project) as client:
        version = client.models.register(
            args.name, model, aliases=args.aliases, metadata=metadata, inputs=inputs
        )
    print(f"registered {version.label} sha256:{version.sha256[:16]} inputs: "
          f"{version.schema.describe()}")  # fmt: skip
    return 0


def _alias(args: argparse.Namespace) -> int:
    with Client(args.project) as client:
        change = client.models.set_alias(args.name, args.alias, args.version, by=_user())
    print(f"{args.name}: {change.alias} -> v{change.version} (was "
          f"{'-' if change.previous is None else f'v{change.previous}'})")  # fmt: skip
    return 0


def _rollback(args: argparse.Namespace) -> int:
    with Client(args.project) as client:
        change = client.models.rollback(args.name, args.alias, by=_user())
    print(f"{args.name}: {change.alias} rolled back to v{change.version} (was v{change.previous})")
    return 0


def _history(args: argparse.Namespace) -> int:
    with Client(args.project) as client:
        for change in client.models.history(args.name):
            previous = "-" if change.previous is None else f"v{change.previous}"
            by = f"  by {change.changed_by}" if change.changed_by else ""
            print(f"{change.changed_at.isoformat(timespec='seconds')}  {change.action:<8}  "
                  f"{change.alias}: {previous} -> v{change.version}{by}")  # fmt: skip
    return 0


def _user() -> str | None:
    """The OS user moving an alias (kept in its history), or None when there is none."""
    try:
        return getpass.getuser() or None
    except (OSError, KeyError):  # no login name and no passwd entry (some containers)
        return None


def _predict(args: argparse.Namespace) -> int:
    text = args.rows
    if text.startswith("@"):
        text = Path(text[1:]).read_text()
    try:
        rows = json.loads(text)
    except json.JSONDecodeError as error:
        raise KairosError(f"--rows is not JSON ({error}); e.g. '[{{\"a\": 1.0}}]'") from None
    with Client(args.project) as client:
        record = client.models.get(args.name, args.version, args.alias)
        predictions = client.models.predict(args.name, rows, version=record.version)
    print(json.dumps({"model": record.label, "predictions": predictions.tolist()}))
    return 0


def _score(args: argparse.Namespace) -> int:
    with Client(args.project) as client:
        record = client.models.get(args.name, args.version, args.alias)
        table = client.models.score(
            args.name, args.data, version=record.version, column=args.column, output=args.output
        )
    print(f"scored {table.num_rows} rows with {record.label} -> {args.output}", file=sys.stderr)
    return 0
