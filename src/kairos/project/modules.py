"""Load a project: a folder of Python modules declaring feature classes and resolvers.

Every `*.py` file in the folder (and its sub-folders, except hidden ones, `tests` and names
starting with `_`) is imported as part of one package, so modules import each other with
relative imports (`from .features import User`). Keep scripts behind
`if __name__ == "__main__":`; importing a project must do no I/O.
"""

from __future__ import annotations

import fnmatch
import hashlib
import importlib
import importlib.util
import os
import re
import sys
import traceback
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from kairos.definitions.feature import class_spec
from kairos.errors import ProjectError
from kairos.resolvers.python import Resolver
from kairos.resolvers.sql import SqlResolver

_SKIP_DIRS = {"tests", "test", "data", "node_modules", "build", "dist"}


@dataclass(frozen=True)
class Project:
    """The definitions a client serves: feature classes and resolvers (Python and SQL)."""

    root: Path | None
    feature_classes: tuple[type, ...]
    resolvers: tuple[Resolver[..., Any] | SqlResolver, ...]

    @classmethod
    def from_objects(cls, objects: Iterable[Any], root: Path | None = None) -> Project:
        """Pick feature classes and resolvers out of any objects (e.g. a module's values)."""
        classes: dict[int, type] = {}
        resolvers: dict[int, Resolver[..., Any] | SqlResolver] = {}
        for obj in objects:
            if isinstance(obj, ModuleType):
                cls._collect(vars(obj).values(), classes, resolvers)
            else:
                cls._collect([obj], classes, resolvers)
        return cls(root, tuple(classes.values()), tuple(resolvers.values()))

    @staticmethod
    def _collect(
        objects: Iterable[Any],
        classes: dict[int, type],
        resolvers: dict[int, Resolver[..., Any] | SqlResolver],
    ) -> None:
        for obj in objects:
            if class_spec(obj) is not None:
                classes.setdefault(id(obj), obj)
            elif isinstance(obj, Resolver | SqlResolver):
                resolvers.setdefault(id(obj), obj)

    @classmethod
    def load(cls, path: str | Path) -> Project:
        """Import every module of the project folder (or one `.py` file)."""
        root = Path(path).expanduser().resolve()
        if not root.exists():
            raise ProjectError(
                f"project folder {str(path)!r} does not exist; pass a folder "
                "containing your feature and resolver modules"
            )
        files = [root] if root.is_file() else _module_files(root)
        if root.is_file() and root.suffix != ".py":
            raise ProjectError(f"{str(path)!r} is not a folder or a .py file")
        folder = root.parent if root.is_file() else root
        package = _package(folder)
        modules = [_import(package, folder, file) for file in files]
        queries = (
            [SqlResolver.from_file(p) for p in _files(folder, "*.sql")] if root.is_dir() else []
        )
        return cls.from_objects([*modules, *queries], root)


def _files(root: Path, pattern: str) -> list[Path]:
    """The project's files matching `pattern`. Hidden, private and skipped folders are never
    entered (`.kairos/` holds stores whose writers rename folders while a client loads: a walk
    into it could meet a folder that just vanished), and a folder that vanishes is skipped."""
    files = []
    for folder, folders, names in os.walk(root):  # os.walk skips what it cannot list
        folders[:] = [f for f in folders if not f.startswith((".", "_")) and f not in _SKIP_DIRS]
        for name in names:
            if not fnmatch.fnmatchcase(name, pattern):
                continue
            if name.startswith(("_", "test_")) or name.endswith("_test.py"):
                continue
            files.append(Path(folder) / name)
    return sorted(files)


def _module_files(root: Path) -> list[Path]:
    files = _files(root, "*.py")
    if not files:
        raise ProjectError(
            f"project folder {str(root)!r} has no Python modules; add e.g. "
            "features.py with your @features classes"
        )
    return files


def _package(folder: Path) -> str:
    digest = hashlib.sha256(str(folder).encode()).hexdigest()[:8]
    name = "kairos_project_" + re.sub(r"\W", "_", folder.name) + "_" + digest
    if name not in sys.modules:
        init = folder / "__init__.py"
        if init.exists():
            spec = importlib.util.spec_from_file_location(
                name, init, submodule_search_locations=[str(folder)]
            )
        else:
            spec = importlib.machinery.ModuleSpec(name, None, is_package=True)
        if spec is None:  # pragma: no cover - spec_from_file_location on an existing file
            raise ProjectError(f"cannot load {folder}")
        module = importlib.util.module_from_spec(spec)
        module.__path__ = [str(folder)]
        sys.modules[name] = module
        if spec.loader is not None:
            _run(lambda: spec.loader.exec_module(module), init)
    return name


def _import(package: str, folder: Path, file: Path) -> ModuleType:
    relative = file.relative_to(folder).with_suffix("")
    name = ".".join((package, *relative.parts))
    return _run(lambda: importlib.import_module(name), file)  # type: ignore[no-any-return]


def _run(action: Any, file: Path) -> Any:
    try:
        return action()
    except SyntaxError as error:
        raise ProjectError(
            f"{error.filename or file}:{error.lineno}: syntax error: {error.msg}; fix the file"
        ) from None
    except ProjectError:
        raise
    except Exception as error:
        frames = [f for f in traceback.extract_tb(error.__traceback__) if f.filename == str(file)]
        where = f"{file}:{frames[-1].lineno}" if frames else str(file)
        raise ProjectError(
            f"{where}: importing the project failed with {type(error).__name__}: {error}"
        ) from error
