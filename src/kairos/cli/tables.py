"""Tables of the command line: rich's on a terminal (bold headers, columns fitted to the
window), a plain grid of left-aligned columns when piped or captured (what scripts and tests
read), how a value reads in one of its cells, and long text cut to fit one.

    >>> print(grid(("feature", "value"), [("user.risk", cell(0.25)), ("user.name", cell(None))]))
    feature    value
    ---------  -----
    user.risk  0.25
    user.name  -
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from kairos.cli.console import console, styled


def show(headers: Sequence[str], rows: Sequence[Sequence[str]], out: Console | None = None) -> None:
    """Print a table on `out` (stdout): rich's on a styled terminal, else `grid`'s text."""
    out = out or console()
    if not styled(out):
        print(grid(headers, rows), file=out.file, flush=True)
        return
    table = Table(box=box.SIMPLE_HEAD, header_style="bold cyan", show_edge=False, pad_edge=False)
    for header in headers:
        table.add_column(Text(header), overflow="fold")
    for row in rows:
        table.add_row(*(Text(text) for text in row))  # as given: `[rows]` is no markup
    out.print(table)


def grid(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A plain text table (its header alone when there are no rows)."""
    widths = [max([len(h), *(len(r[i]) for r in rows)]) for i, h in enumerate(headers)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip()]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    return "\n".join(lines)


def cell(value: Any) -> str:
    """A value as a table shows it: `-` for none, times to the second, floats to 6 digits."""
    if value is None:
        return "-"
    if isinstance(value, datetime):
        return value.isoformat(timespec="seconds")
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)


def short(text: str, width: int = 60) -> str:
    """`text` cut to `width` characters, ending in `...` when cut.

    >>> short("user.risk=0.25, user.name=Ada", 20)
    'user.risk=0.25, u...'
    """
    return text if len(text) <= width else text[: max(width - 3, 0)] + "..."
