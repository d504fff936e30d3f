"""The command line's tables: rich's on a styled terminal, the plain grid anywhere else."""

import io

from rich.console import Console

from kairos.cli.tables import grid, show

HEADERS = ("feature", "value")
ROWS = [("user.declines[7d]", "3"), ("user.name", "Ada"), ("user.notes", "[bold]x")]


def test_a_table_with_no_rows_is_its_header() -> None:
    assert grid(("a", "bb"), []) == "a  bb\n-  --"


def test_off_a_terminal_the_table_is_the_plain_grid() -> None:
    sink = io.StringIO()
    show(HEADERS, ROWS, Console(file=sink))  # a StringIO is no terminal
    assert sink.getvalue() == grid(HEADERS, ROWS) + "\n"
    assert sink.getvalue().splitlines()[2] == "user.declines[7d]  3"  # brackets are text


def test_on_a_terminal_the_table_is_styled_and_keeps_its_text() -> None:
    sink = io.StringIO()
    show(HEADERS, ROWS, Console(file=sink, force_terminal=True, color_system="standard"))
    drawn = sink.getvalue()
    assert "\x1b[" in drawn and "─" in drawn
    assert "user.declines[7d]" in drawn and "Ada" in drawn
    assert "[bold]x" in drawn  # cells are text, never rich markup
    plain = io.StringIO()  # a terminal without colour (NO_COLOR): the grid again
    show(HEADERS, ROWS, Console(file=plain, force_terminal=True, color_system=None))
    assert plain.getvalue() == grid(HEADERS, ROWS) + "\n"
