"""The click pieces every `kairos` command shares: commands that answer a mistyped flag or
subcommand with the closest one, arguments that carry help text, and `--project`.

    @click.command(cls=Command)
    @click.argument("name", help="the model's name")
    @project_option
    def show(name: str, project: str) -> int: ...
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

import click

F = TypeVar("F", bound=Callable[..., Any])


def did_you_mean(kind: str, name: str, known: Iterable[str]) -> str:
    """`No such option: --prot. Did you mean --port?`, or without a guess when none is close.

    >>> did_you_mean("command", "qurey", ["query", "explain"])
    'No such command: qurey. Did you mean query?'
    """
    close = difflib.get_close_matches(name, sorted(set(known)), n=1)
    return f"No such {kind}: {name}." + (f" Did you mean {close[0]}?" if close else "")


class _Suggesting:
    """Parsing that names the closest flag when one is mistyped (click's own message lists
    every near one, quoted, and is easy to misread)."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        try:
            return super().parse_args(ctx, args)  # type: ignore[misc, no-any-return]
        except click.NoSuchOption as error:
            flags = [
                flag
                for param in ctx.command.get_params(ctx)
                if isinstance(param, click.Option)
                for flag in (*param.opts, *param.secondary_opts)
            ]
            raise click.UsageError(did_you_mean("option", error.option_name, flags), ctx) from None


class Command(_Suggesting, click.Command):
    """A `kairos` command."""


class Group(_Suggesting, click.Group):
    """A `kairos` group of commands; a mistyped subcommand is answered with the closest."""

    command_class = Command
    group_class = type  # subgroups are of this class too

    def resolve_command(
        self, ctx: click.Context, args: list[str]
    ) -> tuple[str | None, click.Command | None, list[str]]:
        name = args[0]
        if self.get_command(ctx, name) is None and not name.startswith("-"):
            ctx.fail(did_you_mean("command", name, self.list_commands(ctx)))
        return super().resolve_command(ctx, args)


# `--port`: what a socket can bind (0, "any free port", would be announced as port 0)
PORT = click.IntRange(1, 65535)


def project_option(function: F) -> F:
    """`--project PATH`, the project folder every command that reads one takes."""
    return click.option(
        "--project",
        default=".",
        show_default=True,
        metavar="PATH",
        help="the project folder (where kairos.yaml is)",
    )(function)


def json_option(what: str) -> Callable[[F], F]:
    """`--json`: machine-readable output instead of text, as `as_json`."""
    return click.option("--json", "as_json", is_flag=True, help=f"print {what} as JSON")
