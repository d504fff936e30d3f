"""What each query leaves behind: its id, its decision records in the query log and its
values in the offline history. The client hands every query's outcome here; this is the
only code that writes either.

    session.new_query_id()  # doctest: +SKIP
    await session.record(snapshot, plan, columns, outcome, result, calls, t0)  # doctest: +SKIP
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import re
import uuid
from typing import Any

from kairos.engine.execution import RunOutcome
from kairos.engine.result import BulkResult, ColumnData
from kairos.errors import InvalidInput
from kairos.planner.plan import Plan
from kairos.project.decisions import DecisionLog, decision_records, snapshot_values
from kairos.project.fingerprint import definitions_fingerprint
from kairos.project.snapshot import Snapshot
from kairos.resolvers.calls import Calls
from kairos.stores.query_log import LoggedQuery, NullQueryLog, PlanInfo

# A query id a caller may choose: readable back as a URL path segment, at most 128 chars.
QUERY_ID = re.compile(r"[A-Za-z0-9._~:-]{1,128}")


class Session:
    """Query ids, decision records and the offline-history write of one client."""

    def __init__(self, log: DecisionLog) -> None:
        self.log = log
        self.logging = not isinstance(log.store, NullQueryLog)
        self.id_prefix = uuid.uuid4().hex[:16]
        self._id_counter = itertools.count(1)
        self._plans: dict[str, tuple[Snapshot, PlanInfo]] = {}

    def new_query_id(self) -> str:
        """Unique without a syscall per query: a random 64-bit prefix per client, then a
        counter, so one client's ids sort in the order its queries finished."""
        return f"{self.id_prefix}{next(self._id_counter):016x}"

    async def check_query_id(self, query_id: str) -> None:
        """A caller's query id names one decision: it must be readable back and unused."""
        if not isinstance(query_id, str) or not QUERY_ID.fullmatch(query_id):
            raise InvalidInput(
                f"query_id {query_id!r} must be 1-128 letters, digits or . _ ~ : -",
                field="query_id",
            )
        if self.logging and await asyncio.to_thread(self.log.get, query_id) is not None:
            raise InvalidInput(
                f"query_id {query_id!r} was already used; each query id names one decision",
                field="query_id",
            )

    async def record(
        self,
        runtime: Snapshot,
        plan: Plan,
        columns: dict[str, list[Any]],
        outcome: RunOutcome,
        result: BulkResult,
        calls: Calls,
        started: float,
    ) -> None:
        """Keep the values the query observed in the offline history and queue its
        decision records (the log's writer thread builds and encodes them)."""
        writer = runtime.offline.writer
        if writer is not None and outcome.observed:
            writer.add(outcome.observed)
        if self.logging:
            served = snapshot_values(outcome.values)
            inputs = {name: served[name].values for name in columns}
            build = functools.partial(
                self._records, runtime, plan, inputs, result, served, calls, started
            )
            await self.log.store.append_later(build, result.meta.rows)

    def _records(
        self,
        runtime: Snapshot,
        plan: Plan,
        inputs: dict[str, list[Any]],
        result: BulkResult,
        values: dict[str, ColumnData],
        calls: Calls,
        started: float,
    ) -> list[LoggedQuery]:
        """Each entity's decision record, with its plan as `_plan_info` names it."""
        info = self._plan_info(runtime, plan)
        return decision_records(info, plan, inputs, result, values, calls, started)

    def _plan_info(self, runtime: Snapshot, plan: Plan) -> PlanInfo:
        """The plan as a decision record names it (built once per plan and runtime; the
        writer thread calls this)."""
        found = self._plans.get(plan.fingerprint)
        if found is not None and found[0] is runtime:
            return found[1]
        definitions = definitions_fingerprint(runtime.graph, runtime.resolvers)
        info = PlanInfo(
            plan.fingerprint,
            definitions,
            plan.inputs,
            plan.outputs,
            {name: plan.versions.get(name) for name in plan.columns},
            plan.models,
        )
        if len(self._plans) >= 1024:  # plans of runtimes long replaced: let them go
            self._plans.clear()
        self._plans[plan.fingerprint] = (runtime, info)
        return info
