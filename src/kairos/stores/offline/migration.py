"""A DuckDB offline store from before segments (one DuckDB file at the store's path), moved
into a folder of Parquet segments the first time it is opened; the file is kept beside it as
`<name>.old`."""

from __future__ import annotations

import logging
import os
import shutil
import time
from pathlib import Path

import duckdb

from kairos.errors import KairosError
from kairos.stores.offline.segment_sql import quoted, stored_sql
from kairos.stores.offline.segments import Layout, TableInfo, _flock

logger = logging.getLogger(__name__)

COMPLETE = ".complete"  # in a migrating folder: every table was exported


def opened_root(path: Path) -> Path:
    """The store's folder at `path`. An older store, one DuckDB file at `path`, is moved into
    segments first: exported to `<name>.migrating`, the file renamed to `<name>.old`, the
    folder renamed into place; a crash at any step leaves the file or the finished folder."""
    staging = path.with_name(path.name + ".migrating")
    if path.is_dir() or not (path.exists() or staging.exists()):
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    with _flock(path.with_name(f".{path.name}.lock")):
        if path.is_dir():
            return path  # another process migrated it while this one waited
        if not path.exists():
            if (staging / COMPLETE).exists():
                os.rename(staging, path)  # a crash after the file was moved away
                (path / COMPLETE).unlink()
            else:
                shutil.rmtree(staging, ignore_errors=True)
            return path
        shutil.rmtree(staging, ignore_errors=True)  # a crash mid-export: export again
        _export(path, staging)
        old = path.with_name(path.name + ".old")
        if old.exists():
            old = path.with_name(f"{path.name}.old-{time.strftime('%Y%m%dT%H%M%S')}")
        os.rename(path, old)
        wal = path.with_name(path.name + ".wal")
        if wal.exists():
            os.rename(wal, old.with_name(old.name + ".wal"))
        os.rename(staging, path)
        (path / COMPLETE).unlink()
    logger.warning("offline store %s moved into Parquet segments; the old file is %s", path, old)
    return path


def _export(path: Path, staging: Path) -> None:
    """Every table of the DuckDB file at `path` as one segment each in a new store folder."""
    try:
        connection = duckdb.connect(str(path), read_only=True)
    except duckdb.Error as error:
        raise KairosError(
            f"cannot open the offline store file {str(path)!r} to move it into segments: "
            f"{error} (stop the process that holds it, e.g. an older kairos serve)"
        ) from None
    layout = Layout(staging)
    try:
        connection.execute("set TimeZone = 'UTC'")
        for order, (table, namespace, key_kind, columns, ties) in enumerate(
            _old_catalog(connection)
        ):
            info = layout.create(TableInfo(table, namespace, key_kind, columns, order))
            listed = ["key", "observed_at", "inserted_at", "1::bigint as seq"]
            for column, kind in columns.values():
                if kind == "timedelta":
                    listed.append(f"epoch_us({quoted(column)}) as {quoted(column)}")
                else:
                    listed.append(f"{quoted(column)}::{stored_sql(kind)} as {quoted(column)}")
            if ties:
                layout.mark_ties(table)
            count, earliest, latest = connection.sql(
                f"select count(*), epoch_us(min(observed_at)), epoch_us(max(observed_at)) "
                f"from {quoted(table)}"
            ).fetchall()[0]
            if not count:
                continue
            reader = connection.sql(
                f"select {', '.join(listed)} from {quoted(table)} order by rowid"
            ).to_arrow_reader(65536)
            layout.add(info, (1, 1), (int(earliest), int(latest)), reader)
    except duckdb.Error as error:
        raise KairosError(f"cannot move the offline store {str(path)!r}: {error}") from None
    finally:
        connection.close()
    (staging / COMPLETE).touch()


def _old_catalog(
    connection: duckdb.DuckDBPyConnection,
) -> list[tuple[str, str, str, dict[str, tuple[str, str]], bool]]:
    """(table, namespace, key kind, feature -> (column, value kind), ties) of each table, from
    either catalog a DuckDB file had: one table per feature, or per set of features."""
    present = {
        str(name)
        for (name,) in connection.execute(
            "select table_name from information_schema.tables"
        ).fetchall()
    }
    found: list[tuple[str, str, str, dict[str, tuple[str, str]], bool]] = []
    if "kairos_offline_features" in present:
        for namespace, feature, table, kind, key_kind, ties in connection.execute(
            "select namespace, feature, table_name, value_kind, key_kind, ties "
            "from kairos_offline_features"
        ).fetchall():
            found.append(
                (
                    str(table),
                    str(namespace),
                    str(key_kind),
                    {str(feature): ("value", str(kind))},
                    bool(ties),
                )
            )
    if "kairos_offline_segments" in present:
        columns: dict[str, dict[str, tuple[str, str]]] = {}
        for table, feature, column, kind in connection.execute(
            "select table_name, feature, column_name, value_kind from kairos_offline_columns"
        ).fetchall():
            columns.setdefault(str(table), {})[str(feature)] = (str(column), str(kind))
        for table, namespace, key_kind, ties in connection.execute(
            "select table_name, namespace, key_kind, ties from kairos_offline_segments"
        ).fetchall():
            found.append(
                (str(table), str(namespace), str(key_kind), columns.get(str(table), {}), bool(ties))
            )
    return found
