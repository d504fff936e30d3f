"""A query's trace: one `kairos.query` span, a child per plan node that ran (nested in time
inside it), SQL nodes named by their statement with no parameter value in any span."""

from __future__ import annotations

import asyncio
import sqlite3
import textwrap
from collections.abc import Iterator
from contextlib import closing
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest
import yaml
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF
from opentelemetry.trace import SpanKind, StatusCode

import kairos as kr
from kairos import features, online, telemetry
from kairos.server import create_app
from tests.telemetry.conftest import attribute_values, children, named, one

PRIVATE_ID = "acct-7f3c-private"  # the key a SQL statement is bound to: in no span

FEATURES = """\
from kairos import _, features, online


@features
class Account:
    id: str
    name: str
    tier: str
    score: float
    doubled: float = _.score * 2
    flagged: bool


@online
def score(aid: Account.id) -> Account.score:
    return 1.5


@online
def flagged(aid: Account.id) -> Account.flagged:
    raise LookupError("the flag service is down")
"""

ACCOUNT_SQL = """\
-- resolves: Account
-- source: bank
select id, name, level as tier from accounts where id = :id
"""


@pytest.fixture
def bank(tmp_path: Path) -> Iterator[kr.Client]:
    folder = tmp_path / "bank"
    folder.mkdir()
    (folder / "features.py").write_text(FEATURES)
    (folder / "account.sql").write_text(textwrap.dedent(ACCOUNT_SQL))
    with closing(sqlite3.connect(tmp_path / "bank.db")) as db:
        db.execute("create table accounts (id text primary key, name text, level text)")
        db.executemany(
            "insert into accounts values (?, ?, ?)",
            [(PRIVATE_ID, "Ada", "gold"), ("acct-2", "Bob", "silver")],
        )
        db.commit()
    settings = {"sources": {"bank": f"sqlite:///{tmp_path / 'bank.db'}"}}
    (folder / "kairos.yaml").write_text(yaml.safe_dump(settings))
    with kr.Client(folder, query_log="none://", offline_store="none://") as client:
        yield client


OUTPUTS = ["account.name", "account.tier", "account.doubled"]


def test_a_query_is_a_root_span_with_one_child_per_plan_node(
    bank: kr.Client, spans: InMemorySpanExporter
) -> None:
    result = bank.query({"account.id": PRIVATE_ID}, OUTPUTS)
    assert result.errors == []
    plan = bank.plan(["account.id"], OUTPUTS)

    query = one(spans, "kairos.query")
    assert query.parent is None  # nothing around it: the trace's root
    assert query.attributes is not None
    assert query.attributes["kairos.query.id"] == result.meta.query_id
    assert query.attributes["kairos.query.kind"] == "online"
    assert query.attributes["kairos.query.outputs"] == 3
    assert query.attributes["kairos.query.status"] == "ok"
    nodes = children(spans, query)
    node_ids = [(n.attributes or {}).get("kairos.node.id") for n in nodes]
    assert sorted(int(str(i)) for i in node_ids) == sorted(node.id for node in plan.nodes)
    assert {n.name for n in nodes} == {
        "kairos.resolver account",
        "kairos.resolver score",
        "kairos.expression account.doubled",
    }
    # each node's span lies inside the query's, as it ran
    assert query.start_time is not None and query.end_time is not None
    for node in nodes:
        assert node.start_time is not None and node.end_time is not None
        assert query.start_time <= node.start_time <= node.end_time <= query.end_time
        assert node.attributes is not None and node.attributes["kairos.node.status"] == "ok"
        assert node.status.status_code is StatusCode.UNSET
    # the engine's own trace times the same nodes
    traced = {t.node for t in result.trace if t.node is not None}
    assert traced == {node.id for node in plan.nodes}


def test_a_sql_nodes_span_names_its_statement_and_holds_no_parameter(
    bank: kr.Client, spans: InMemorySpanExporter
) -> None:
    bank.query({"account.id": PRIVATE_ID}, ["account.name"])

    sql = one(spans, "kairos.resolver account")
    attributes = dict(sql.attributes or {})
    assert attributes["db.query.summary"] == "account"
    assert attributes["db.system.name"] == "sqlite"
    assert attributes["db.namespace"] == "bank"
    assert str(attributes["code.file.path"]).endswith("account.sql")
    assert attributes["kairos.node.kind"] == "sql"
    assert "db.query.text" not in attributes and "db.statement" not in attributes
    every = attribute_values(spans.get_finished_spans())
    assert not [v for v in every if PRIVATE_ID in v]
    assert not [v for v in every if "accounts" in v or "where id" in v]


def test_a_failed_resolver_fails_its_span_and_the_query_is_partial(
    bank: kr.Client, spans: InMemorySpanExporter
) -> None:
    result = bank.query({"account.id": "acct-2"}, ["account.name", "account.flagged"])
    assert [e.feature for e in result.errors] == ["account.flagged"]

    failed = one(spans, "kairos.resolver flagged")
    assert failed.status.status_code is StatusCode.ERROR
    assert failed.attributes is not None and failed.attributes["error.type"] == "error"
    assert one(spans, "kairos.resolver account").status.status_code is StatusCode.UNSET
    query = one(spans, "kairos.query")
    assert query.attributes is not None
    assert query.attributes["kairos.query.status"] == "partial"
    assert query.attributes["kairos.query.errors"] == 1
    # the resolver's message is in the result, not in the trace
    assert not [v for v in attribute_values([failed, query]) if "flag service" in v]


def test_a_bulk_query_is_one_span_of_kind_bulk(
    bank: kr.Client, spans: InMemorySpanExporter
) -> None:
    bank.query_bulk({"account.id": [PRIVATE_ID, "acct-2"]}, ["account.name"])

    query = one(spans, "kairos.query")
    assert query.attributes is not None
    assert (query.attributes["kairos.query.kind"], query.attributes["kairos.query.rows"]) == (
        "bulk",
        2,
    )
    [sql] = children(spans, query)
    assert sql.name == "kairos.resolver account"
    assert sql.attributes is not None and sql.attributes["kairos.node.rows"] == 2


def test_an_offline_query_is_a_span_of_kind_offline(
    bank: kr.Client, spans: InMemorySpanExporter
) -> None:
    spine = {"account.id": [PRIVATE_ID], "ts": [datetime(2026, 6, 1, tzinfo=UTC)]}
    result = bank.offline_query(spine, ["account.name"])
    assert result.column("account.name") == ["Ada"]

    query = one(spans, "kairos.query")
    assert query.attributes is not None
    assert query.attributes["kairos.query.kind"] == "offline"
    assert query.attributes["kairos.query.rows"] == 1
    assert query.kind is SpanKind.INTERNAL


def test_tracing_off_makes_no_span(bank: kr.Client, spans: InMemorySpanExporter) -> None:
    provider_tracer = telemetry.TRACER
    telemetry.configure(None)
    try:
        result = bank.query({"account.id": PRIVATE_ID}, OUTPUTS)
    finally:
        telemetry.TRACER = provider_tracer
    assert result.errors == []
    assert named(spans, "") == []


def test_a_replay_is_one_span_its_recomputed_nodes_nest_under(
    bank: kr.Client, tmp_path: Path, spans: InMemorySpanExporter
) -> None:
    with kr.Client(
        bank.project, query_log=f"sqlite:///{tmp_path / 'log.db'}", offline_store="none://"
    ) as logged:
        served = logged.query({"account.id": PRIVATE_ID}, ["account.name"])
        logged.log.flush()
        spans.clear()
        replayed = logged.replay([served.meta.query_id], recompute=["account.name"])
    assert {row.feature: row.replayed for row in replayed.rows}["account.name"] == "Ada"

    batch = one(spans, "kairos.replay")
    assert batch.parent is None
    assert batch.attributes is not None and batch.attributes["kairos.replay.records"] == 1
    [sql] = named(spans, "kairos.resolver account")
    assert sql.parent is not None and sql.parent.span_id == batch.context.span_id


def test_a_plan_run_outside_a_traced_operation_makes_no_orphan_spans(
    bank: kr.Client, spans: InMemorySpanExporter
) -> None:
    """A backfill runs the engine thousands of times: its nodes are not each a trace."""
    plan = bank.plan(["account.id"], ["account.name"])
    run = bank.engine.run(plan, {"account.id": [PRIVATE_ID]}, 1, datetime.now(UTC), {})
    outcome = bank._sync(run)
    assert outcome.columns["account.name"].values == ["Ada"]
    assert spans.get_finished_spans() == ()


def test_server_spans_are_named_by_route_templates_never_by_ids(
    bank: kr.Client, spans: InMemorySpanExporter
) -> None:
    async def ask() -> list[int]:
        transport = httpx.ASGITransport(app=create_app(bank))
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as http:
            paths = ["/healthz", f"/v1/log/{PRIVATE_ID}", "/ui/login", "/no/such/page"]
            return [(await http.get(path)).status_code for path in paths]

    statuses = asyncio.run(ask())
    assert statuses[0] == 200 and statuses[3] == 404
    served = [s for s in spans.get_finished_spans() if s.kind is SpanKind.SERVER]
    assert [s.name for s in sorted(served, key=lambda s: s.start_time or 0)] == [
        "GET /healthz",
        "GET /v1/log/{query_id}",
        "GET /ui/login",
        "GET",
    ]
    routes = [dict(s.attributes or {}).get("http.route") for s in served]
    assert not [r for r in routes if PRIVATE_ID in str(r)]  # the path is in url.path only
    codes = [dict(s.attributes or {}).get("http.response.status_code") for s in served]
    assert sorted(c for c in codes if isinstance(c, int)) == sorted(statuses)


@features
class Probe:
    id: str
    seen: int


SEEN: list[int] = []  # the span id current in the resolver's thread


@online
def probe_seen(pid: Probe.id) -> Probe.seen:
    SEEN.append(trace.get_current_span().get_span_context().span_id)
    return len(pid)


def test_a_sync_resolvers_code_runs_inside_its_nodes_span(spans: InMemorySpanExporter) -> None:
    SEEN.clear()
    with kr.Client(definitions=[Probe, probe_seen], query_log="none://") as client:
        assert client.query({"probe.id": "abc"}, ["probe.seen"]).get_value("probe.seen") == 3
    node = one(spans, "kairos.resolver probe_seen")
    assert [node.context.span_id] == SEEN  # a span the user's code makes is the node's child


def test_a_query_the_sampler_leaves_out_records_nothing(bank: kr.Client) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider(sampler=ALWAYS_OFF)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    before = (telemetry.TRACER, telemetry._configured)
    telemetry.configure(provider)
    try:
        result = bank.query({"account.id": PRIVATE_ID}, OUTPUTS)
    finally:
        telemetry.TRACER, telemetry._configured = before
        provider.shutdown()
    assert result.errors == [] and result.get_value("account.doubled") == 3.0
    assert exporter.get_finished_spans() == ()
