"""Backfills: compute features over a time range, as of a grid of times, into the offline
store (and optionally the online store, where a backfilled value never replaces a newer one).
A class a `kr.nearest` searches also gets its vector indexes kept current: the backfill
computes its vectors and scalar features too, and each row becomes a document version.

    client.materialize(keys=["u1", "u2"], start=t0, end=t1, every="1d",
                       features=[User.txn_count["7d"]], online=True)
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from kairos.definitions.durations import DurationLike, parse_duration
from kairos.definitions.types import ValueType
from kairos.engine.execution import FUTURE_SKEW
from kairos.engine.values import to_utc
from kairos.errors import InvalidInput, KairosError, PlanError
from kairos.project.offline import Progress, Recompute, offline_query
from kairos.project.snapshot import Snapshot
from kairos.project.vectors import BackfillVersions, VectorFeatures
from kairos.stores.online import StoredValue

ANY = ValueType("any", True)
# Spine rows per offline query when another engine (Ray) recomputes: each call ships its
# rows to the workers and waits for all of them, so fewer, larger calls keep them busy.
ENGINE_CHUNK = 100_000


@dataclass(frozen=True)
class BackfillReport:
    rows: int  # spine rows computed (keys x times)
    values: int  # feature values written to the offline store
    online: int  # latest values offered to the online store
    errors: int  # feature values that failed (null, with an error)
    documents: int = 0  # document versions written to vector indexes (kr.nearest)


def time_grid(start: datetime, end: datetime, every: timedelta) -> list[datetime]:
    """start, start + every, ... up to and including end."""
    if every <= timedelta(0):
        raise InvalidInput("every must be a positive duration, e.g. '1h'", field="every")
    start, end = to_utc(start), to_utc(end)
    if end < start:
        raise InvalidInput(f"end {end.isoformat()} is before start {start.isoformat()}")
    times = []
    moment = start
    while moment <= end:
        times.append(moment)
        moment += every
    return times


async def materialize(
    runtime: Snapshot,
    *,
    keys: Sequence[Any],
    start: datetime,
    end: datetime,
    every: DurationLike,
    features: Sequence[Any],
    online: bool = False,
    chunk: int = 5000,
    progress: Progress | None = None,
    engine: Recompute | None = None,
    vectors: VectorFeatures | None = None,
) -> BackfillReport:
    names = [runtime.name(f) for f in features]
    if not names:
        raise InvalidInput("name at least one feature to backfill", field="features")
    refs = [runtime.graph.ref(n) for n in names]
    roots = {ref.root for ref in refs}
    if len(roots) != 1 or any(ref.path for ref in refs):
        raise InvalidInput(
            "backfill features of one class, without relations (e.g. user.txn_count[7d])",
            field="features",
        )
    root = roots.pop()
    info = runtime.graph.cls(root)
    key_name = f"{root}.{info.primary}"
    versions = None
    if vectors is not None and vectors.searched(root):
        # a searched class: its rows become whole document versions in its indexes
        wanted = vectors.backfilled(info, lambda name: _plan_error(runtime, key_name, name))
        names += [name for name in wanted if name not in names]
        refs = [runtime.graph.ref(n) for n in names]
        versions = BackfillVersions(info, vectors.searched(root))
    key_type = info.features[info.primary].type or ANY
    types = {n: runtime.graph.info(r).type or ANY for n, r in zip(names, refs, strict=True)}
    times = time_grid(start, end, parse_duration(every, field="every"))
    if runtime.offline.writer is None:
        raise KairosError(
            "this client keeps no offline store to backfill into; set offline_store in "
            "kairos.yaml (e.g. duckdb:///.kairos/offline.duckdb)"
        )
    spine = [(key, moment) for moment in times for key in keys]
    total = len(spine)
    written = errors = 0
    latest: dict[tuple[Any, str], StoredValue] = {}
    store = runtime.offline.store()
    horizon = datetime.now(UTC) + FUTURE_SKEW
    if engine is not None:
        chunk = max(chunk, ENGINE_CHUNK)
    for begin in range(0, total, chunk):
        part = spine[begin : begin + chunk]
        result = await offline_query(
            runtime,
            {key_name: [k for k, _ in part], "ts": [t for _, t in part]},
            names,
            engine=engine,
            progress=_within(progress, begin, total) if engine is not None else None,
        )
        errors += len(result.errors)
        failed = {(e.row, e.feature) for e in result.errors}
        stored_as = {name: runtime.graph.info(runtime.graph.ref(name)).name for name in names}
        columns = {name: result.column(name) for name in names}
        # rows where every feature has its value are written together (one table, read back
        # in one join); a row with a failed value keeps only the values that did not fail
        whole = [row for row in range(len(part)) if not any((row, n) in failed for n in names)]
        broken = sorted({row for row, _ in failed if row is not None})
        batches = [(whole, names)] + [
            ([row], [n for n in names if (row, n) not in failed]) for row in broken
        ]
        for rows, written_names in batches:
            if not rows or not written_names:
                continue
            # Written here, synchronously: a backfill must not outrun the writer's buffer.
            await asyncio.to_thread(
                store.write_many,
                root,
                key_type,
                [part[row][0] for row in rows],
                [part[row][1] for row in rows],
                {
                    stored_as[n]: (types[n], [columns[n][row] for row in rows])
                    for n in written_names
                },
            )
            written += len(rows) * len(written_names)
            for row in rows:
                key, moment = part[row]
                for name in written_names:
                    feature = stored_as[name]
                    stored = latest.get((key, feature))
                    if moment <= horizon and (stored is None or stored.observed_at <= moment):
                        latest[(key, feature)] = StoredValue(columns[name][row], moment)
        if versions is not None and vectors is not None:
            await vectors.write(
                versions.rows([k for k, _ in part], [t for _, t in part], columns, failed)
            )
        if progress is not None:
            progress(min(begin + chunk, total), total)
    if online and latest:
        # The store keeps the newest observed_at: a backfill never replaces a newer value,
        # and nothing stamped in the future reaches it.
        await runtime.store.put([((root, key, f), v) for (key, f), v in latest.items()])
    return BackfillReport(
        total,
        written,
        len(latest) if online else 0,
        errors,
        versions.written if versions is not None else 0,
    )


def _plan_error(runtime: Snapshot, key_name: str, name: str) -> PlanError | None:
    """Why `name` cannot be computed offline from the key alone, or None when it can."""
    try:
        runtime.planner.plan([key_name], [name], mode="offline")
    except PlanError as error:
        return error
    return None


def _within(progress: Progress | None, begin: int, total: int) -> Progress | None:
    """Progress inside one part of a backfill (the part's rows done so far), short of the
    end: the backfill reports its last rows once they are written."""
    if progress is None:
        return None
    report = progress
    return lambda done, _rows: report(begin + done, total) if begin + done < total else None
