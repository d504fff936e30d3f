"""`kairos offline` and `kairos materialize`: the offline half from a shell, with a progress
bar on a terminal; `--engine ray [--address ray://...]` recomputes on Ray workers (progress per
part done)."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.csv as pa_csv
import pyarrow.parquet as pq

from kairos.cli.console import progress
from kairos.client import Client
from kairos.errors import KairosError

CHUNK = 20_000


def _time(text: str, flag: str) -> datetime:
    try:
        return datetime.fromisoformat(text)
    except ValueError:
        raise KairosError(
            f"{flag} {text!r} is not an ISO time, e.g. 2026-06-01T12:00:00Z"
        ) from None


def read_spine(path: str) -> pa.Table:
    file = Path(path)
    if not file.exists():
        raise KairosError(f"spine file {path!r} does not exist")
    try:
        if file.suffix == ".csv":
            return pa_csv.read_csv(file)
        return pq.read_table(file)
    except (pa.ArrowInvalid, OSError) as error:
        raise KairosError(f"cannot read spine {path!r}: {error}; use Parquet or CSV") from None


def offline(
    project: str,
    spine_path: str,
    outputs: list[str],
    output: str,
    timestamp: str,
    stored: bool,
    engine: str = "local",
    address: str | None = None,
) -> int:
    if not outputs:
        raise KairosError("name at least one output: --out user.risk")
    spine = read_spine(spine_path)
    parts = []
    errors = 0
    with Client(project) as client, progress("offline") as show:
        total = spine.num_rows
        if engine != "local" and not stored:  # one query: the engine splits it into parts
            whole = client.offline_query(
                spine, outputs, timestamp=timestamp, engine=engine, address=address, progress=show
            )
            parts, errors = [whole.table], len(whole.errors)
        else:
            for start in range(0, max(total, 1), CHUNK):
                part = spine.slice(start, CHUNK)
                result = client.offline_query(
                    part, outputs, timestamp=timestamp, recompute=not stored
                )
                parts.append(result.table)
                errors += len(result.errors)
                show(min(start + CHUNK, total), total)
    table = pa.concat_tables(parts) if parts else pa.table({})
    pq.write_table(table, output)
    print(f"wrote {table.num_rows} rows to {output} ({errors} feature errors)")
    return 0


def materialize(
    project: str,
    features: list[str],
    start: str,
    end: str,
    every: str,
    keys: str | None,
    keys_sql: str | None,
    source: str | None,
    online: bool,
    engine: str = "local",
    address: str | None = None,
) -> int:
    with Client(project) as client, progress("materialize") as show:
        if keys is not None:
            key_list: list[Any] = [k for k in keys.split(",") if k]
        elif keys_sql is not None:
            if source is None:
                raise KairosError(
                    f"--keys-sql needs --source, one of: {', '.join(client.sources) or 'none'}"
                )
            _, rows = client.fetch(source, keys_sql)
            key_list = [row[0] for row in rows]
        else:
            raise KairosError("say which entities: --keys u1,u2 or --keys-sql 'select id ...'")
        report = client.materialize(
            keys=key_list,
            start=_time(start, "--start"),
            end=_time(end, "--end"),
            every=every,
            features=features,
            online=online,
            progress=show,
            engine=engine,
            address=address,
        )
    documents = (
        f", {report.documents} document versions into vector indexes" if report.documents else ""
    )
    print(
        f"backfilled {report.rows} rows: {report.values} values into the offline store, "
        f"{report.online} into the online store{documents}, {report.errors} errors"
    )
    return 0
