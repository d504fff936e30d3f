"""The spans of a query (kairos.telemetry): `kairos.query` around a run, a child around each
plan node's execution (so concurrent nodes overlap as they ran, and a node's model or gateway
calls nest under it), and one per online-store read or write. Only called with tracing on.

Node spans are named by what runs: `kairos.resolver <name>` (Python and SQL resolvers),
`kairos.model <model>`, `kairos.llm <feature>`, `kairos.expression <feature>`... They carry
names, counts and statuses, never a value, a SQL parameter or a prompt.
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Any, TypeVar

from kairos import telemetry
from kairos.engine.result import BulkResult
from kairos.planner.plan import PlanNode, ResolverNode
from kairos.resolvers.llm import CompletionResolver, EmbeddingResolver
from kairos.resolvers.model import ModelResolver
from kairos.resolvers.sql import SqlResolver

# what OpenTelemetry's database conventions call each source dialect (`db.system.name`)
_DB_SYSTEMS = {"sqlite": "sqlite", "duckdb": "duckdb", "postgres": "postgresql"}
_FAILED = ("error", "timeout")
T = TypeVar("T")


async def traced_query(kind: str, work: Awaitable[BulkResult]) -> BulkResult:
    """`work` (a query's run) inside a `kairos.query` span; `kind` is online, bulk or offline."""
    return await telemetry.traced("kairos.query", {"kairos.query.kind": kind}, work, _answered)


def _answered(span: Any, result: BulkResult) -> None:
    meta = result.meta
    errors = sum(1 for c in result.columns.values() for e in c.errors if e is not None)
    span.set_attributes(
        {
            "kairos.query.id": meta.query_id,
            "kairos.query.outputs": len(result.columns),
            "kairos.query.rows": meta.rows,
            "kairos.query.cache_hits": meta.cache_hits,
            "kairos.query.computed": meta.computed,
            "kairos.query.errors": errors,
            "kairos.query.status": "ok" if not errors else "partial",
        }
    )


async def traced_offline(work: Awaitable[Any]) -> Any:
    """An offline query (an OfflineResult) inside a `kairos.query` span of kind offline."""

    def answered(span: Any, result: Any) -> None:
        errors = len(result.errors)
        span.set_attributes(
            {
                "kairos.query.rows": len(result),
                "kairos.query.outputs": len(result.query.get("outputs") or ()),
                "kairos.query.errors": errors,
                "kairos.query.status": "ok" if not errors else "partial",
            }
        )

    attributes = {"kairos.query.kind": "offline"}
    return await telemetry.traced("kairos.query", attributes, work, answered)


async def traced_batch(name: str, attributes: dict[str, Any], work: Awaitable[T]) -> T:
    """A replay's runs of many decisions, under one span of their own."""
    return await telemetry.traced(name, attributes, work)


async def traced_node(node: PlanNode, rows: int, work: Awaitable[str]) -> str:
    """One plan node's computation (its status for the trace) inside its span; none outside
    a traced query or replay (a backfill's thousands of runs are not each a trace of its
    own), nor under a span the sampler left out."""
    if not telemetry.recording():
        return await work
    name, attributes = node_span(node)
    attributes["kairos.node.rows"] = rows
    span = telemetry.start(name, attributes)
    with telemetry.current(span):
        try:
            status = await work
        except BaseException as error:  # a bug in a runner: the query fails with it
            telemetry.failed(span, error)
            span.end()
            raise
    span.set_attribute("kairos.node.status", status)
    if status in _FAILED:
        telemetry.failed(span, status)
    span.end()
    return status


async def traced_store(operation: str, entries: int, work: Awaitable[Any]) -> Any:
    """One online-store read (`get`) or write (`put`) of a query (as nodes: in a trace)."""
    if not telemetry.recording():
        return await work
    attributes = {"kairos.store.operation": operation, "kairos.store.entries": entries}
    return await telemetry.traced(f"kairos.online_store {operation}", attributes, work)


def node_span(node: PlanNode) -> tuple[str, dict[str, Any]]:
    """The name and attributes of a node's span."""
    attributes: dict[str, Any] = {
        "kairos.node.id": node.id,
        "kairos.node.kind": node.kind,
        "kairos.node.label": node.label,
    }
    if not isinstance(node, ResolverNode):
        return f"kairos.{node.kind} {node.label}", attributes
    bound = node.resolver
    resolver: Any = bound.resolver
    if isinstance(resolver, SqlResolver):
        source = getattr(bound.runner, "source", None)
        dialect = getattr(source, "dialect", None)
        attributes["db.query.summary"] = resolver.name  # the statement's name, never its text
        attributes["db.system.name"] = _DB_SYSTEMS.get(str(dialect), str(dialect))
        if resolver.source:
            attributes["db.namespace"] = resolver.source
        if resolver.path is not None:
            attributes["code.file.path"] = str(resolver.path)
            attributes["code.line.number"] = resolver.line
        return f"kairos.resolver {resolver.name}", attributes
    if isinstance(resolver, ModelResolver):
        attributes["kairos.model.name"] = resolver.options.model
        attributes["kairos.model.version"] = resolver.version
        return f"kairos.model {resolver.options.model}", attributes
    if isinstance(resolver, CompletionResolver | EmbeddingResolver):
        attributes["kairos.llm.model"] = resolver.options.model
        attributes["kairos.llm.version"] = resolver.version
        kind = "llm" if isinstance(resolver, CompletionResolver) else "embedding"
        return f"kairos.{kind} {resolver.output.fqn}", attributes
    name = getattr(resolver, "name", node.label)
    attributes["code.function.name"] = name
    if bound.kind != "python":  # kr.nearest's index search
        return f"kairos.{bound.kind} {node.label}", attributes
    return f"kairos.resolver {name}", attributes
