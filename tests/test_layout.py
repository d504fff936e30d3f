"""The tree keeps the shape README's Layout section describes, and the rules DESIGN.md sets for
it: kairos modules imported at module level only, no module over 600 code lines. The README
stays a front page (at most 350 lines) and docs/architecture.md names only files that exist.
(The layers and the absence of import cycles are import-linter's contracts in `make check`.)"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path
from typing import TypeGuard

import click

import kairos
from kairos.cli.main import cli

SRC = Path(kairos.__file__).parent
README = Path(__file__).parents[1] / "README.md"
ARCHITECTURE = Path(__file__).parents[1] / "docs" / "architecture.md"


def _layout() -> str:
    return README.read_text().split("\n## Layout\n", 1)[1].split("\n## ", 1)[0]


def _modules() -> list[Path]:
    return sorted(SRC.rglob("*.py"))


def _imports_kairos(node: ast.AST) -> TypeGuard[ast.Import | ast.ImportFrom]:
    if isinstance(node, ast.ImportFrom):
        return node.level > 0 or (node.module or "").split(".")[0] == "kairos"
    if isinstance(node, ast.Import):
        return any(alias.name.split(".")[0] == "kairos" for alias in node.names)
    return False


def test_kairos_modules_are_imported_at_module_level_only() -> None:
    # a function-local import that dodges an import cycle is the cycle, only hidden
    found = []
    for path in _modules():
        tree = ast.parse(path.read_text(), str(path))
        for scope in ast.walk(tree):
            if isinstance(scope, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                found += [
                    f"{path.relative_to(SRC.parent)}:{node.lineno}"
                    for node in ast.walk(scope)
                    if _imports_kairos(node)
                ]
    assert not found, f"import these at the top of the module: {sorted(set(found))}"


def test_the_check_sees_a_local_import() -> None:
    tree = ast.parse("def f():\n    from kairos.errors import KairosError\n")
    assert any(_imports_kairos(node) for node in ast.walk(tree.body[0]))


def _code_lines(text: str) -> int:
    return sum(1 for line in text.splitlines() if line.strip() and line.strip()[0] != "#")


def test_no_module_is_over_600_code_lines() -> None:
    sizes = {str(p.relative_to(SRC.parent)): _code_lines(p.read_text()) for p in _modules()}
    assert {path: n for path, n in sizes.items() if n > 600} == {}


def test_the_readme_is_a_front_page_of_at_most_350_lines() -> None:
    lines = len(README.read_text().splitlines())
    assert lines <= 350, f"README.md has {lines} lines: move a section into docs/ and link it"


def test_the_architecture_page_names_real_modules() -> None:
    named = set(re.findall(r"\bsrc/kairos/[\w/]+\.py\b", ARCHITECTURE.read_text()))
    root = SRC.parents[1]
    assert len(named) >= 8, f"docs/architecture.md names {len(named)} modules, fewer than 8"
    assert sorted(p for p in named if not (root / p).is_file()) == []


# the query log's stores: the faces above the client read decisions through DecisionLog
_LOG_STORES = {"QueryLog", "NullQueryLog", "BatchedQueryLog", "query_log_from_url"}


def _touches_a_log_store(text: str) -> bool:
    if re.search(r"\.log\.store\b", text):
        return True
    imports = [n for n in ast.walk(ast.parse(text)) if isinstance(n, ast.ImportFrom)]
    for node in imports:
        module = node.module or ""
        if module.startswith("kairos.stores.query_log"):
            if module != "kairos.stores.query_log" and not module.endswith(".records"):
                return True  # base, batched, sqlite, postgres: the stores themselves
            if {alias.name for alias in node.names} & _LOG_STORES:
                return True
    return False


def test_server_ui_and_cli_never_touch_the_decision_logs_store() -> None:
    faces = [p for part in ("server", "ui", "cli") for p in (SRC / part).rglob("*.py")]
    found = [str(p.relative_to(SRC.parent)) for p in faces if _touches_a_log_store(p.read_text())]
    assert not found, f"read decisions through DecisionLog (client.log), not its store: {found}"


def test_the_check_sees_a_store_touched() -> None:
    assert _touches_a_log_store("rows = client.log.store.recent(5)\n")
    assert _touches_a_log_store("from kairos.stores.query_log import LoggedQuery, QueryLog\n")
    assert _touches_a_log_store("from kairos.stores.query_log import (\n    QueryLog,\n)\n")
    assert _touches_a_log_store("from kairos.stores.query_log.sqlite import sqlite_query_log\n")
    assert not _touches_a_log_store("from kairos.stores.query_log import LoggedQuery, Search\n")


def _context_vars(text: str) -> list[str]:
    """Each ContextVar a module declares: its name, its annotation and its arguments."""
    found = []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Assign | ast.AnnAssign) and isinstance(node.value, ast.Call):
            called = node.value.func
            name = called.attr if isinstance(called, ast.Attribute) else getattr(called, "id", "")
            annotation = node.annotation if isinstance(node, ast.AnnAssign) else None
            if name == "ContextVar" or "ContextVar" in ast.unparse(annotation or node.value):
                found.append(ast.unparse(node))
    return found


def _carries_calls(declared: str) -> bool:
    return re.search(r"calls|\brows\b|\bcall\b", declared, re.I) is not None


def test_no_context_var_carries_model_or_llm_calls() -> None:
    # the engine returns the calls it made (RunOutcome.calls); a side channel around a layer
    # is what issue 28 took out. No other ContextVar is declared in kairos today.
    found = {
        str(p.relative_to(SRC.parent)): declared
        for p in _modules()
        for declared in _context_vars(p.read_text())
        if _carries_calls(declared)
    }
    assert found == {}, f"return model and LLM calls from the engine instead: {found}"


def test_the_check_sees_a_context_var_of_calls() -> None:
    text = (
        "CALLS: contextvars.ContextVar[Calls | None] = contextvars.ContextVar('kairos_calls')\n"
        "ROWS = ContextVar('kairos_rows', default=None)\n"
        "TRACE = ContextVar('trace')\n"
    )
    assert [_carries_calls(d) for d in _context_vars(text)] == [True, True, False]


def test_the_layout_names_every_package_and_top_level_module() -> None:
    layout = _layout()
    named = set(re.findall(r"^\s+([a-z_]+/|[a-z_]+\.py)\s", layout, re.M))
    packages = {
        f"{p.parent.name}/" for p in SRC.rglob("__init__.py") if p.parent != SRC
    }  # stores/online/ is named as online/ under stores/
    modules = {p.name for p in SRC.glob("*.py") if p.name != "__init__.py"}
    assert packages | modules <= named, f"not in README's Layout: {packages | modules - named}"
    assert named <= packages | modules, f"not in the tree: {named - packages - modules}"


def _commands(command: click.Command, prefix: str = "") -> Iterator[str]:
    if not isinstance(command, click.Group):
        yield prefix
        return
    for name, sub in command.commands.items():
        yield from _commands(sub, f"{prefix} {name}".strip())


def _listed_commands(layout: str) -> set[str]:
    """`kairos a | b c` and `kairos group: a | b c` lines, continued on indented lines."""
    block = layout.split("cli/", 1)[1].split("\nexamples/", 1)[0]
    lines: list[str] = []
    for line in block.splitlines():
        stripped = line.strip()
        if stripped.startswith("kairos "):
            lines.append(stripped.removeprefix("kairos "))
        elif lines and lines[-1].endswith("|"):
            lines[-1] += " " + stripped
    listed = set()
    for line in lines:
        group, colon, items = line.partition(": ")
        if not colon:
            group, items = "", line
        listed |= {f"{group} {item.strip()}".strip() for item in items.split("|")}
    return listed


def test_the_layout_lists_every_cli_command() -> None:
    assert _listed_commands(_layout()) == set(_commands(cli))
