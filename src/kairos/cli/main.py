"""The `kairos` command: one click group whose commands live one module per group of them.

kairos init fresh && kairos serve fresh --port 8080
kairos query --project examples/fraud --in user.id=u0001 --out user.risk
kairos offline --project examples/fraud --spine spine.parquet --out user.risk --output out.parquet

`main(argv)` runs it and returns the exit code: 0, 1 when a query answered with feature
errors, 2 for a usage mistake (the command's usage and the closest flag or subcommand) or for a
`KairosError` (`kairos: <message>` on stderr, never a traceback).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any, TypeVar

import click

from kairos.cli.console import fail
from kairos.cli.consume import consume_command
from kairos.cli.deploy import deploy_group
from kairos.cli.gateway import gateway_group
from kairos.cli.history import materialize, offline
from kairos.cli.log import log_group
from kairos.cli.models import models_group
from kairos.cli.options import PORT, Group, project_option
from kairos.cli.query import explain_command, query_command
from kairos.cli.replay import replay_command
from kairos.cli.scaffold import init
from kairos.cli.serve import serve
from kairos.errors import KairosError

F = TypeVar("F", bound=Callable[..., Any])

# the distribution's name on PyPI (`kairos` there is another project)
DISTRIBUTION = "kairos-inference"


def version() -> str:
    """The installed kairos's version.

    >>> version()  # doctest: +SKIP
    '0.1.0'
    """
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        raise KairosError(
            f"kairos is not installed as a distribution; pip install {DISTRIBUTION}"
        ) from None


def main(argv: Sequence[str] | None = None) -> int:
    """Run `kairos` with `argv` (default: the process's arguments); the exit code.

    >>> main(["explain", "--project", "examples/fraud", "--in", "user.id", "--out", "user.risk"])
    ... # doctest: +SKIP
    """
    try:
        code = cli.main(
            args=None if argv is None else list(argv), prog_name="kairos", standalone_mode=False
        )
    except click.ClickException as error:
        error.show()
        return error.exit_code
    except click.Abort:  # Ctrl-C at a prompt or in a command click runs
        return 130
    except KairosError as error:
        fail(str(error))
        return 2
    return int(code or 0)


def _show_version(ctx: click.Context, _: click.Parameter, value: bool) -> None:
    if value and not ctx.resilient_parsing:
        click.echo(f"kairos {version()}")
        ctx.exit(0)


@click.group("kairos", cls=Group)
@click.option(
    "--version",
    is_flag=True,
    expose_value=False,
    is_eager=True,
    callback=_show_version,
    help="print the installed kairos's version and exit",
)
def cli() -> None:
    """Real-time features and models."""


@cli.command("init")
@click.argument("folder", default=".", required=False, help="where to write it (default: .)")
def init_command(folder: str) -> int:
    """Create a small working project."""
    return init(folder)


@cli.command("serve")
@click.argument(
    "path",
    required=False,
    help="the project folder, as --project says it (default: .)",
)
@click.option(
    "--project", metavar="PATH", help="the project folder (where kairos.yaml is; default: .)"
)
@click.option("--host", help="the address to listen on (default: server.host in kairos.yaml)")
@click.option("--port", type=PORT, help="the port to listen on (default: server.port)")
@click.option(
    "--workers", type=int, default=1, show_default=True, help="processes answering on the port"
)
def serve_command(
    path: str | None, project: str | None, host: str | None, port: int | None, workers: int
) -> int:
    """Run the HTTP server."""
    if path is not None and project is not None and Path(path).resolve() != Path(project).resolve():
        raise click.UsageError(
            f"give the project folder once: PATH {path!r} or --project {project!r}, not both"
        )
    return serve(path or project or ".", host, port, workers)


def _engine_options(function: F) -> F:
    function = click.option(
        "--address", help="the Ray cluster, e.g. ray://head:10001 (default: Ray on this machine)"
    )(function)
    return click.option(
        "--engine",
        type=click.Choice(["local", "ray"]),
        default="local",
        show_default=True,
        help="what recomputes: this process (local) or Ray workers "
        "(pip install 'kairos-inference[ray]')",
    )(function)


@cli.command("offline")
@project_option
@click.option("--spine", required=True, help="Parquet or CSV with keys and a time column")
@click.option(
    "--out", "outputs", multiple=True, metavar="FEATURE", help="a feature to compute (repeatable)"
)
@click.option("--output", required=True, help="Parquet file to write")
@click.option("--timestamp", default="ts", show_default=True, help="the spine's time column")
@click.option("--stored", is_flag=True, help="read the offline store as of each row")
@_engine_options
def offline_command(
    project: str,
    spine: str,
    outputs: tuple[str, ...],
    output: str,
    timestamp: str,
    stored: bool,
    engine: str,
    address: str | None,
) -> int:
    """Compute features for a spine file (Parquet/CSV)."""
    return offline(project, spine, list(outputs), output, timestamp, stored, engine, address)


@cli.command("materialize")
@click.argument(
    "features", nargs=-1, required=True, metavar="FEATURE...",
    help="the features to backfill, e.g. user.txn_count[1d]",
)  # fmt: skip
@project_option
@click.option("--start", required=True, help="ISO time the backfill starts at")
@click.option("--end", required=True, help="ISO time it ends at")
@click.option("--every", default="1d", show_default=True, help="the step between snapshots")
@click.option("--keys", help="comma-separated primary keys")
@click.option("--keys-sql", help="a query returning the keys in its first column")
@click.option("--source", help="the source --keys-sql runs on")
@click.option("--online", is_flag=True, help="also update the online store")
@_engine_options
def materialize_command(
    features: tuple[str, ...],
    project: str,
    start: str,
    end: str,
    every: str,
    keys: str | None,
    keys_sql: str | None,
    source: str | None,
    online: bool,
    engine: str,
    address: str | None,
) -> int:
    """Backfill features over a time range."""
    return materialize(
        project, list(features), start, end, every, keys, keys_sql, source, online, engine, address
    )


for _command in (
    query_command,
    explain_command,
    log_group,
    models_group,
    gateway_group,
    deploy_group,
    replay_command,
    consume_command,
):
    cli.add_command(_command)
