"""Where the command line writes: rich consoles on stdout and stderr that colour and animate
only on a terminal (piped or captured output is plain text, and `NO_COLOR` turns every style
off), a progress bar shown only there, and the one-line `kairos: <message>` of an error.

    with progress("materialize") as advance:
        client.materialize(..., progress=advance)
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskProgressColumn,
    TextColumn,
    TimeElapsedColumn,
)
from rich.text import Text

Advance = Callable[[int, int], None]  # (items done, items in all)


def console(stderr: bool = False) -> Console:
    """A console on stdout (or stderr) as it is now: made per command, so a test's captured
    stream is the one written to. Text is written as given: no markup (`[7d]` is text), no
    highlighting, no wrapping."""
    made = Console(stderr=stderr, markup=False, emoji=False, highlight=False, soft_wrap=True)
    if made.no_color:  # rich drops colours only; NO_COLOR means no styling at all
        made = Console(
            stderr=stderr,
            markup=False,
            emoji=False,
            highlight=False,
            soft_wrap=True,
            color_system=None,
        )
    return made


def styled(out: Console) -> bool:
    """Whether `out` may carry styles: a terminal, and colour not turned off (NO_COLOR)."""
    return out.is_terminal and out.color_system is not None


def fail(message: str) -> None:
    """`kairos: <message>` on stderr, the prefix in red on a terminal."""
    err = console(stderr=True)
    err.print(Text.assemble(("kairos:", "bold red"), f" {message}"))


@contextmanager
def progress(label: str) -> Iterator[Advance]:
    """A progress bar on stderr while the block runs, on a terminal only; elsewhere the
    callback does nothing (a log file gets no bar redrawn a thousand times)."""
    err = console(stderr=True)
    if not err.is_interactive:
        yield _nothing
        return
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        TaskProgressColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
    )
    # stdout is left alone: what a command prints there must not move to stderr's console
    with Progress(*columns, console=err, redirect_stdout=False, redirect_stderr=False) as bar:
        task = bar.add_task(label, total=None)

        def advance(done: int, total: int) -> None:
            bar.update(task, completed=done, total=total)

        yield advance


def _nothing(done: int, total: int) -> None:
    """No bar: the output is not a terminal."""
