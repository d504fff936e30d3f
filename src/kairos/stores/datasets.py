"""Datasets: offline results saved by name as numbered, immutable Parquet files.

    >>> store = DatasetStore(Path(".kairos/datasets"))
    >>> store.save("training", result.table, query=query, definitions_hash=fp).version
    3
    >>> store.get("training").to_pandas()  # the latest; get("training", 2) for another

Each version is `<root>/<name>/v<N>.parquet` with a sidecar `v<N>.json`; both hold the same
metadata (name, version, created_at, the query, the definitions' hash, the row count), in the
Parquet file under the schema metadata key `kairos.dataset`. A version is written to a temp
file in the same folder and renamed into place, so readers never see half a file; saves of
one name take an OS lock on `<root>/<name>/.lock`, so two never get the same number, and an
existing version is never overwritten. Only `v<N>.parquet` files count: leftover temp files
from a crash are ignored.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import sys
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, BinaryIO, Final

import pyarrow as pa
import pyarrow.parquet as pq

from kairos.errors import InvalidInput, KairosError, did_you_mean

METADATA_KEY: Final = b"kairos.dataset"
_NAME = re.compile(r"[A-Za-z0-9_.-]{1,100}")
_NAME_RULE = (
    "1 to 100 letters, digits, '_', '.' or '-', not starting with '.' and without '..' "
    "(no path separators)"
)
_VERSION_FILE = re.compile(r"v([1-9][0-9]*)\.parquet")


class UnknownDataset(KairosError, KeyError):
    """A dataset name, or a version of one, that was never saved."""

    def __str__(self) -> str:  # KeyError would quote the whole message
        return str(self.args[0]) if self.args else ""


@dataclass(frozen=True, slots=True)
class DatasetVersion:
    """What is known about one saved version, without reading its rows."""

    name: str
    version: int
    created_at: datetime
    query: dict[str, Any]
    definitions_hash: str
    rows: int
    path: Path

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "version": self.version,
            "created_at": self.created_at.isoformat(),
            "query": self.query,
            "definitions_hash": self.definitions_hash,
            "rows": self.rows,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any], path: Path) -> DatasetVersion:
        return cls(
            name=str(data["name"]),
            version=int(data["version"]),
            created_at=datetime.fromisoformat(data["created_at"]),
            query=dict(data["query"]),
            definitions_hash=str(data["definitions_hash"]),
            rows=int(data["rows"]),
            path=path,
        )


@dataclass(frozen=True, slots=True)
class Dataset:
    """One saved version with its rows."""

    info: DatasetVersion
    table: pa.Table

    @property
    def name(self) -> str:
        return self.info.name

    @property
    def version(self) -> int:
        return self.info.version

    @property
    def created_at(self) -> datetime:
        return self.info.created_at

    @property
    def query(self) -> dict[str, Any]:
        return self.info.query

    @property
    def definitions_hash(self) -> str:
        return self.info.definitions_hash

    def __len__(self) -> int:
        return int(self.table.num_rows)

    def to_pandas(self) -> Any:
        return self.table.to_pandas()

    def to_polars(self) -> Any:
        import polars as pl  # optional: `pip install kairos-inference[polars]`

        return pl.from_arrow(self.table)


class DatasetStore:
    """Named, versioned Parquet datasets under one folder."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    def save(
        self, name: str, table: pa.Table, *, query: Mapping[str, Any], definitions_hash: str
    ) -> DatasetVersion:
        """Save `table` as the next version of `name` (1 for a new name) and return it."""
        check_name(name)
        if not isinstance(table, pa.Table):
            raise InvalidInput(
                f"dataset {name!r}: expected a pyarrow.Table, got {type(table).__name__}; pass "
                "an offline result's .table",
                field="table",
            )
        try:
            query_json = json.loads(json.dumps(dict(query), sort_keys=True))
        except (TypeError, ValueError) as error:
            raise InvalidInput(
                f"dataset {name!r}: the query must be plain JSON (names, numbers, lists): {error}",
                field="query",
            ) from None
        folder = self.root / name
        folder.mkdir(parents=True, exist_ok=True)
        with _exclusive(folder / ".lock"):
            version = max((v for v, _ in _version_files(folder)), default=0) + 1
            target = folder / f"v{version}.parquet"
            info = DatasetVersion(
                name=name,
                version=version,
                created_at=datetime.now(UTC),
                query=query_json,
                definitions_hash=definitions_hash,
                rows=int(table.num_rows),
                path=target,
            )
            text = json.dumps(info.to_json(), sort_keys=True, indent=2).encode()
            schema_metadata = {**(table.schema.metadata or {}), METADATA_KEY: text}
            tagged = table.replace_schema_metadata(schema_metadata)
            if target.exists():  # only another writer ignoring the lock could get here
                raise KairosError(f"dataset {name!r} version {version} already exists at {target}")
            # The sidecar first: a crash between the two renames leaves a JSON file that no
            # listing counts (only .parquet files are versions) and the next save replaces.
            _write_atomic(folder / f"v{version}.json", lambda f: f.write(text))
            _write_atomic(target, lambda f: pq.write_table(tagged, f))
        return info

    def get(self, name: str, version: int | None = None) -> Dataset:
        """Version `version` of `name`, or the latest when None."""
        info = self.version(name, version)
        return Dataset(info, pq.read_table(info.path))

    def version(self, name: str, version: int | None = None) -> DatasetVersion:
        """The metadata of one version (the latest when None), without reading the rows."""
        if version is not None and (isinstance(version, bool) or not isinstance(version, int)):
            raise InvalidInput(
                f"dataset {name!r}: version must be an int such as 1, got {version!r}",
                field="version",
            )
        found = self.versions(name)
        if version is None:
            return found[-1]
        for info in found:
            if info.version == version:
                return info
        raise UnknownDataset(
            f"dataset {name!r} has no version {version}; versions: "
            + ", ".join(str(info.version) for info in found)
        )

    def versions(self, name: str) -> list[DatasetVersion]:
        """Every saved version of `name`, oldest first."""
        check_name(name)
        files = _version_files(self.root / name)
        if not files:
            existing = self.names()
            hint = did_you_mean(name, existing)
            raise UnknownDataset(
                f"unknown dataset {name!r}{hint}; "
                + (f"datasets: {', '.join(existing)}" if existing else f"none saved in {self.root}")
            )
        return [_read_info(path) for _, path in files]

    def names(self) -> list[str]:
        """The names that have at least one saved version, sorted."""
        if not self.root.is_dir():
            return []
        return sorted(
            entry.name
            for entry in self.root.iterdir()
            if entry.is_dir() and _valid_name(entry.name) and _version_files(entry)
        )


def check_name(name: str) -> None:
    """Refuse names that are not plain file names: they would escape the store's folder."""
    if not isinstance(name, str) or not _valid_name(name):
        raise InvalidInput(f"invalid dataset name {name!r}: use {_NAME_RULE}", field="name")


def _valid_name(name: str) -> bool:
    return bool(_NAME.fullmatch(name)) and not name.startswith(".") and ".." not in name


def _version_files(folder: Path) -> list[tuple[int, Path]]:
    if not folder.is_dir():
        return []
    found = []
    for entry in folder.iterdir():
        match = _VERSION_FILE.fullmatch(entry.name)
        if match and entry.is_file():
            found.append((int(match.group(1)), entry))
    return sorted(found)


def _read_info(path: Path) -> DatasetVersion:
    sidecar = path.with_suffix(".json")
    try:
        return DatasetVersion.from_json(json.loads(sidecar.read_bytes()), path)
    except (OSError, ValueError, KeyError, TypeError):
        pass  # a missing or damaged sidecar: the Parquet file holds the same metadata
    try:
        metadata = pq.read_schema(path).metadata or {}
        return DatasetVersion.from_json(json.loads(metadata[METADATA_KEY]), path)
    except (OSError, ValueError, KeyError, TypeError, pa.ArrowException) as error:
        raise KairosError(f"dataset file {path} has no readable kairos metadata: {error}") from None


def _write_atomic(target: Path, write: Callable[[BinaryIO], object]) -> None:
    """Write through a temp file in the same folder, then rename it over `target`."""
    temp = target.with_name(f".{target.name}.{uuid.uuid4().hex}.tmp")
    try:
        with open(temp, "wb") as handle:
            write(handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temp, target)
    finally:
        with contextlib.suppress(FileNotFoundError):
            temp.unlink()


@contextlib.contextmanager
def _exclusive(path: Path) -> Iterator[None]:
    """Hold an OS lock on `path`: released by the OS if the process dies, so never stale."""
    with open(path, "a+b") as handle:
        if sys.platform == "win32":
            import msvcrt

            handle.seek(0)
            while True:
                try:
                    msvcrt.locking(handle.fileno(), msvcrt.LK_LOCK, 1)
                    break
                except OSError:  # LK_LOCK gives up after ~10 s; keep waiting
                    continue
            try:
                yield
            finally:
                handle.seek(0)
                msvcrt.locking(handle.fileno(), msvcrt.LK_UNLCK, 1)
        else:
            import fcntl

            fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle.fileno(), fcntl.LOCK_UN)
