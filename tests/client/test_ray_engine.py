"""Offline recompute on Ray workers (`engine="ray"`): the same rows, values and errors as the
local engine, checked against brute force; failures per row, a dead worker named by its part,
and definitions a worker cannot import refused with the fix."""

import os
import random
import re
import sys
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest

import kairos as kr
from examples.fraud.generate import ANCHOR, generate
from kairos import features, online
from kairos.client import ray_engine
from tests.conftest import REDIS_URL, delete_redis_prefix, need_redis
from tests.engine.test_windows import WINDOWED, Account, Payment, brute, events, same
from tests.resolvers.test_nearest import Doc, Ticket, client_for, doc, unit
from tests.stores.test_vectors import pg_url as pg_url  # pgvector, a fixture

PROJECT = Path(__file__).parents[2] / "examples" / "fraud"
EXAMPLE_FEATURES = [
    "user.txn_count[1d]",
    "user.declines[7d]",
    "user.avg_ticket[90d]",
    "user.txn_count[7d]",
    "user.account_age_days",
    "user.risk",
]
T0 = datetime(2026, 4, 1, tzinfo=UTC)


@pytest.fixture(autouse=True)
def small_parts(monkeypatch: pytest.MonkeyPatch) -> None:
    """Parts of a few rows, so that even a small spine is split across both workers."""
    monkeypatch.setattr(ray_engine, "ROWS_PER_PART", 8)


@features
class Probe:
    id: str
    value: float


@online
def probe_value(pid: Probe.id, now: kr.Now) -> Probe.value:
    if str(pid) == "crash":
        os._exit(3)  # the worker process dies with its part
    if str(pid).endswith("7"):
        raise ValueError(f"no reading for {pid}")
    return float(str(pid)[1:]) + (now.timestamp() - T0.timestamp()) / 3600


@pytest.fixture
def probes() -> Iterator[kr.Client]:
    with kr.Client(definitions=[Probe, probe_value], query_log="none://") as client:
        yield client


def probe_spine(rows: int, seed: int) -> dict[str, list[object]]:
    rng = random.Random(seed)
    return {
        "probe.id": [f"p{rng.randint(0, 59)}" for _ in range(rows)],
        "ts": [T0 + timedelta(minutes=rng.randint(0, 10_000)) for _ in range(rows)],
    }


def test_the_fraud_example_gives_the_local_engines_rows(ray_cluster: None) -> None:
    generate()
    rng = random.Random(5)
    users = [f"u{i:04d}" for i in range(1, 61)]
    ts = [ANCHOR - timedelta(seconds=rng.randint(0, 150 * 86400)) for _ in range(400)]
    uids: list[str | None] = [rng.choice(users) for _ in ts]
    uids[3] = None
    spine = {"user.id": uids, "ts": ts}
    with kr.Client(PROJECT, query_log="none://") as client:
        client.models.warm()
        local = client.offline_query(spine, EXAMPLE_FEATURES)
        done: list[tuple[int, int]] = []
        on_ray = client.offline_query(
            spine, EXAMPLE_FEATURES, engine="ray", progress=lambda d, n: done.append((d, n))
        )
    assert on_ray.table.equals(local.table)  # spine order, every value, the same types
    assert on_ray.errors == local.errors
    assert on_ray.query == local.query
    assert len(done) > 1 and done[-1] == (400, 400)  # a report per part done
    assert [d for d, _ in done] == sorted(d for d, _ in done)


@pytest.fixture(params=["in_process", "kept", "redis"])
def windows_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, str]]:
    """(online store, offline store): windows over events kept in this process only, in
    this process over events kept in an offline store (an index that follows what other
    processes write there), or in the Redis online store."""
    if request.param == "in_process":
        yield "memory://", "none://"
        return
    if request.param == "kept":
        yield "memory://", f"duckdb:///{tmp_path / 'offline.duckdb'}"
        return
    need_redis()
    prefix = f"kray{uuid.uuid4().hex[:12]}"
    yield f"{REDIS_URL}?prefix={prefix}", "none://"
    delete_redis_prefix(prefix)


def test_windows_over_events_match_brute_force_on_both_engines(
    engine: str, windows_store: tuple[str, str]
) -> None:
    rows = events(21, 2000)
    shuffled = rows[:]
    random.Random(22).shuffle(shuffled)  # late events too
    rng = random.Random(23)
    accounts, nows = [], []
    for _ in range(150):
        now = T0 + timedelta(seconds=rng.randint(-86400, 42 * 86400))
        if rng.random() < 0.2:
            now = rng.choice(rows)["at"]  # exactly on an event's time
        accounts.append(rng.choice(["a1", "a2", "a3", "nobody"]))
        nows.append(now)
    outputs = [*WINDOWED, "account.lifetime"]
    online_store, offline_store = windows_store
    with kr.Client(
        definitions=[Payment, Account],
        query_log="none://",
        online_store=online_store,
        offline_store=offline_store,
    ) as client:
        for start in range(0, len(shuffled), 500):
            client.write_events(Payment, shuffled[start : start + 500])
        result = client.offline_query({"account.id": accounts, "ts": nows}, outputs, engine=engine)
    assert result.errors == []
    for index, row in enumerate(result.to_pylist()):
        account, now = accounts[index], nows[index]
        assert row["account.id"] == account and row["ts"] == now, index
        for name, value in brute(rows, account, now).items():
            assert same(row[name], value), (index, name, now, account)
        assert row["account.lifetime"] == sum(
            1 for r in rows if r["account_id"] == account and r["at"] <= now
        )


def test_a_resolver_that_raises_fails_only_its_rows(probes: kr.Client, engine: str) -> None:
    spine = probe_spine(300, seed=7)
    result = probes.offline_query(spine, ["probe.value"], engine=engine)
    failed = {error.row for error in result.errors}
    for row, (pid, ts) in enumerate(zip(spine["probe.id"], spine["ts"], strict=True)):
        value = result.column("probe.value")[row]
        if str(pid).endswith("7"):
            assert value is None and row in failed, row
        else:
            assert value == float(str(pid)[1:]) + (ts - T0).total_seconds() / 3600, row  # type: ignore[operator]
    assert failed == {r for r, p in enumerate(spine["probe.id"]) if str(p).endswith("7")}
    [error] = {(e.feature, e.code) for e in result.errors}
    assert error == ("probe.value", "resolver_error")
    assert all("no reading for p" in e.message for e in result.errors)


def test_ray_gives_the_local_errors_row_for_row(probes: kr.Client, ray_cluster: None) -> None:
    spine = probe_spine(500, seed=8)
    local = probes.offline_query(spine, ["probe.value"])
    on_ray = probes.offline_query(spine, ["probe.value"], engine="ray")
    assert on_ray.table.equals(local.table)
    assert on_ray.errors == local.errors  # each at its spine row, in the same order


def test_a_worker_that_dies_is_named_by_its_part(
    probes: kr.Client, ray_cluster: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ray_engine, "RETRIES", 1)  # each retry waits longer: keep it short
    spine: dict[str, list[Any]] = {"probe.id": ["p1", "p2", "crash", "p4"] * 10, "ts": [T0] * 40}
    with pytest.raises(kr.KairosError) as raised:
        probes.offline_query(spine, ["probe.value"], engine="ray")
    lost = r"part \d+ of \d+ \(10 spine rows from row 2, 1 entities: 'crash'\): WorkerCrashed"
    assert re.search(rf"engine='ray': \d+ of \d+ parts were lost.*{lost}", str(raised.value))
    # the workers Ray starts again compute the next query
    spine["probe.id"][2::4] = ["p3"] * 10
    assert probes.offline_query(spine, ["probe.value"], engine="ray").errors == []


def test_definitions_a_worker_cannot_import_are_refused_with_the_fix(ray_cluster: None) -> None:
    @features
    class Local:
        id: str
        size: int

    @online
    def size(lid: Local.id) -> Local.size:
        return len(str(lid))

    with kr.Client(definitions=[Local, size], query_log="none://") as client:
        spine = {"local.id": ["a"], "ts": [T0]}
        assert client.offline_query(spine, ["local.size"]).column("local.size") == [1]
        with pytest.raises(
            kr.KairosError, match=r"cannot import .*Local.*give the client a project"
        ):
            client.offline_query(spine, ["local.size"], engine="ray")


def test_bad_engines_are_clear_errors(probes: kr.Client, monkeypatch: pytest.MonkeyPatch) -> None:
    spine = probe_spine(3, seed=1)
    with pytest.raises(kr.InvalidInput, match=r"engine='spark' is not one of 'local', 'ray'"):
        probes.offline_query(spine, ["probe.value"], engine="spark")
    with pytest.raises(kr.InvalidInput, match=r"address='ray://h:10001' names a Ray cluster"):
        probes.offline_query(spine, ["probe.value"], address="ray://h:10001")
    monkeypatch.setitem(sys.modules, "ray", None)  # as if Ray were not installed
    with pytest.raises(kr.KairosError, match=r"pip install 'kairos-inference\[ray\]'"):
        probes.offline_query(spine, ["probe.value"], engine="ray")


def test_entities_stay_in_one_part_in_spine_order() -> None:
    keys = [f"k{i % 13}" for i in range(200)]
    parts = ray_engine.partition(keys, 5)
    assert sorted(row for part in parts for row in part) == list(range(200))
    assert all(part == sorted(part) for part in parts)
    owner = {keys[row]: index for index, part in enumerate(parts) for row in part}
    assert all(owner[keys[row]] == index for index, part in enumerate(parts) for row in part)
    assert ray_engine.partition(keys, 5) == parts  # the same split every time


def nearest_spine() -> dict[str, list[Any]]:
    """Tickets in two languages asking from several angles at times around the docs' edits."""
    rng = random.Random(31)
    rows = 40
    return {
        "ticket.id": [f"t{rng.randint(0, 11)}" for _ in range(rows)],
        "ticket.lang": [rng.choice(["en", "de"]) for _ in range(rows)],
        "ticket.question_embedding": [unit(rng.uniform(0, 90)) for _ in range(rows)],
        "ts": [T0 + timedelta(hours=rng.randint(-2, 60)) for _ in range(rows)],
    }


def nearest_docs() -> list[dict[str, Any]]:
    """Docs in both languages and years, some observed later, one updated after a day."""
    found = [
        doc(i, 9.0 * i, lang="en" if i % 3 else "de", year=2018 + i, at=T0 + timedelta(hours=4 * i))
        for i in range(10)
    ]
    return [*found, {**doc(4, 85.0, year=2025), "updated_at": T0 + timedelta(days=1)}]


def test_kr_nearest_on_ray_searches_the_clients_pgvector_index(
    pg_url: str, ray_cluster: None, tmp_path: Path
) -> None:
    # vectors= is given to the client, not in a config the workers could read it from
    spine = nearest_spine()
    outputs = [Ticket.related, Ticket.same_lang]
    try:
        with client_for(pg_url, tmp_path) as client:
            client.write_events(Doc, nearest_docs())
            local = client.offline_query(spine, outputs)
            on_ray = client.offline_query(spine, outputs, engine="ray")
    finally:
        with psycopg.connect(pg_url, autocommit=True) as connection:
            connection.execute('DROP TABLE IF EXISTS "doc.embedding"')
    assert local.errors == [] and on_ray.errors == []
    assert on_ray.table.equals(local.table)
    related = local.column("ticket.related")
    # k rows whenever k docs exist as of the row's time (d{i} from T0 + 4i hours)
    existing = [sum(T0 + timedelta(hours=4 * i) <= ts for i in range(10)) for ts in spine["ts"]]
    assert [len(rows) for rows in related] == [min(3, n) for n in existing]
    assert sum(existing) > 0
    # the corpus as of each row: the update of d4 is seen only from its time on
    for ts, rows in zip(spine["ts"], related, strict=True):
        assert all(r["updated_at"] <= ts for r in rows)


def test_kr_nearest_over_an_embedded_index_is_refused_on_ray_before_any_work(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def connect(ray: Any, address: str | None) -> None:
        pytest.fail("engine='ray' joined Ray for a query it must refuse")

    monkeypatch.setattr(ray_engine, "_connect", connect)
    spine = nearest_spine()
    with client_for(str(tmp_path / "vectors"), tmp_path) as client:
        client.write_events(Doc, nearest_docs())
        with pytest.raises(
            kr.InvalidInput,
            match=r"'ticket\.same_lang' is a kr\.nearest over the embedded vector index at "
            r".*vectors'.*use engine='local' or a postgresql:// vectors URL",
        ) as refused:
            client.offline_query(spine, [Ticket.same_lang], engine="ray")
        assert refused.value.field == "engine"
        local = client.offline_query(spine, [Ticket.same_lang])  # this process searches it
    assert local.errors == []
    assert all(
        r["lang"] == lang
        for rows, lang in zip(local.column("ticket.same_lang"), spine["ticket.lang"], strict=True)
        for r in rows
    )
    assert any(local.column("ticket.same_lang"))
