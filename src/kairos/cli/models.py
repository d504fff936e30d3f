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

import getpass
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from kairos.cli.options import Group, project_option
from kairos.client import Client
from kairos.errors import KairosError
from kairos.models import formats

F = TypeVar("F", bound=Callable[..., Any])


@click.group("models", cls=Group)
def models_group() -> None:
    """Register, version, alias and serve models."""


_NAME = click.argument("name", help="the model's name, e.g. risk")


def _pick(function: F) -> F:
    """`--version N` or `--alias NAME`: which version of the model runs (default: newest)."""
    function = click.option("--alias", help="run the version this alias points at")(function)
    return click.option("--version", type=int, help="run this version number")(function)


@models_group.command("list")
@project_option
def list_command(project: str) -> int:
    """Registered models, their newest version and aliases."""
    with Client(project) as client:
        names = client.models.names()
        if not names:
            print("no models registered (client.models.register or kairos models register)")
        for name in names:
            versions = client.models.versions(name)
            aliases = ", ".join(f"{a}=v{v}" for a, v in client.models.aliases(name).items())
            print(f"{name}  v{versions[-1].version}  ({len(versions)} versions)  {aliases}")
    return 0


@models_group.command("show")
@_NAME
@project_option
def show_command(name: str, project: str) -> int:
    """Every version of a model: schema, sha256, aliases."""
    with Client(project) as client:
        for v in client.models.versions(name):
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


@models_group.command("register")
@_NAME
@click.argument("file", help="the artifact: .onnx, .skops, .ubj/.json, .txt, .cbm")
@project_option
@click.option("--format", "kind", help="onnx | skops | xgboost-ubj | xgboost-json | "
              "lightgbm-text | catboost-cbm (default: from the extension)")  # fmt: skip
@click.option(
    "--alias", "aliases", multiple=True, help="point this alias at the new version (repeatable)"
)
@click.option("--inputs", help="comma-separated input names, when the model has none")
@click.option(
    "--meta", multiple=True, metavar="KEY=VALUE", help="metadata kept with it (repeatable)"
)
def register_command(
    name: str,
    file: str,
    project: str,
    kind: str | None,
    aliases: tuple[str, ...],
    inputs: str | None,
    meta: tuple[str, ...],
) -> int:
    """Register an artifact file in a safe format."""
    path = Path(file)
    if not path.is_file():
        raise KairosError(f"no artifact file {file!r}")
    kind = kind or _EXTENSIONS.get(path.suffix)
    if kind is None:
        raise KairosError(f"cannot tell the format of {path.name}; pass --format")
    metadata = {}
    for pair in meta:
        key, sep, value = pair.partition("=")
        if not sep:
            raise KairosError(f"--meta {pair!r} needs KEY=VALUE")
        metadata[key] = value
    names = inputs.split(",") if inputs else None
    model = formats.from_artifact(path.read_bytes(), kind)
    with Client(project) as client:
        version = client.models.register(
            name, model, aliases=list(aliases), metadata=metadata, inputs=names
        )
    print(f"registered {version.label} sha256:{version.sha256[:16]} inputs: "
          f"{version.schema.describe()}")  # fmt: skip
    return 0


@models_group.command("alias")
@_NAME
@click.argument("alias", help="the alias to move, e.g. prod")
@click.argument("version", type=int, help="the version it points at from now")
@project_option
def alias_command(name: str, alias: str, version: int, project: str) -> int:
    """Point an alias at a version."""
    with Client(project) as client:
        change = client.models.set_alias(name, alias, version, by=_user())
    print(f"{name}: {change.alias} -> v{change.version} (was "
          f"{'-' if change.previous is None else f'v{change.previous}'})")  # fmt: skip
    return 0


@models_group.command("rollback")
@_NAME
@click.argument("alias", help="the alias to move back, e.g. prod")
@project_option
def rollback_command(name: str, alias: str, project: str) -> int:
    """Point an alias back where it was before."""
    with Client(project) as client:
        change = client.models.rollback(name, alias, by=_user())
    print(f"{name}: {change.alias} rolled back to v{change.version} (was v{change.previous})")
    return 0


@models_group.command("history")
@_NAME
@project_option
def history_command(name: str, project: str) -> int:
    """Every alias change, with its time."""
    with Client(project) as client:
        for change in client.models.history(name):
            previous = "-" if change.previous is None else f"v{change.previous}"
            by = f"  by {change.changed_by}" if change.changed_by else ""
            print(f"{change.changed_at.isoformat(timespec='seconds')}  {change.action:<8}  "
                  f"{change.alias}: {previous} -> v{change.version}{by}")  # fmt: skip
    return 0


@models_group.command("predict")
@_NAME
@project_option
@click.option("--rows", required=True, help="JSON list of objects or lists, or @file")
@_pick
def predict_command(
    name: str, project: str, rows: str, version: int | None, alias: str | None
) -> int:
    """Predict rows given as JSON."""
    text = Path(rows[1:]).read_text() if rows.startswith("@") else rows
    try:
        parsed = json.loads(text)
    except json.JSONDecodeError as error:
        raise KairosError(f"--rows is not JSON ({error}); e.g. '[{{\"a\": 1.0}}]'") from None
    with Client(project) as client:
        record = client.models.get(name, version, alias)
        predictions = client.models.predict(name, parsed, version=record.version)
    print(json.dumps({"model": record.label, "predictions": predictions.tolist()}))
    return 0


@models_group.command("score")
@_NAME
@project_option
@click.option("--data", required=True, help="Parquet file with the model's inputs")
@click.option("--output", required=True, help="Parquet file to write")
@click.option("--column", default="prediction", show_default=True, help="the predictions' column")
@_pick
def score_command(
    name: str,
    project: str,
    data: str,
    output: str,
    column: str,
    version: int | None,
    alias: str | None,
) -> int:
    """Batch-score a Parquet file into another."""
    with Client(project) as client:
        record = client.models.get(name, version, alias)
        table = client.models.score(
            name, data, version=record.version, column=column, output=output
        )
    print(f"scored {table.num_rows} rows with {record.label} -> {output}", file=sys.stderr)
    return 0


_EXTENSIONS = {
    ".onnx": "onnx",
    ".skops": "skops",
    ".ubj": "xgboost-ubj",
    ".json": "xgboost-json",
    ".txt": "lightgbm-text",
    ".cbm": "catboost-cbm",
}


def _user() -> str | None:
    """The OS user moving an alias (kept in its history), or None when there is none."""
    try:
        return getpass.getuser() or None
    except (OSError, KeyError):  # no login name and no passwd entry (some containers)
        return None
