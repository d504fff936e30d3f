"""Backfills into the offline store (and the online store, never over a newer value), the
offline and materialize commands, and offline queries over HTTP."""

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import kairos as kr
from kairos import features, online
from kairos.cli import main
from kairos.server import create_app
from kairos.stores.online import MemoryOnlineStore

T0 = datetime(2026, 4, 1, tzinfo=UTC)
FEATURES = """
from kairos import Now, features, online

T0_TS = 1775001600.0  # 2026-04-01T00:00:00Z


@features
class Meter:
    id: str
    reading: float


@online
def reading(mid: Meter.id, now: Now) -> Meter.reading:
    return (now.timestamp() - T0_TS) / 3600 + int(str(mid)[1:])
"""


@features(max_staleness="1d")
class Meter:
    id: str
    reading: float


@online
def reading(mid: Meter.id, now: kr.Now) -> Meter.reading:
    return (now.timestamp() - T0.timestamp()) / 3600 + int(str(mid)[1:])


@pytest.fixture
def store() -> MemoryOnlineStore:
    return MemoryOnlineStore()


@pytest.fixture
def client(store: MemoryOnlineStore) -> Iterator[kr.Client]:
    with kr.Client(
        definitions=[Meter, reading],
        online_store=store,
        offline_store="duckdb:///:memory:",
        query_log="none://",
    ) as client:
        yield client


def test_a_backfill_fills_the_offline_store_on_a_time_grid(client: kr.Client, engine: str) -> None:
    seen: list[tuple[int, int]] = []
    report = client.materialize(
        keys=["m1", "m2"],
        start=T0,
        end=T0 + timedelta(hours=6),
        every="2h",
        features=["meter.reading"],
        progress=lambda done, total: seen.append((done, total)),
        engine=engine,
    )
    assert (report.rows, report.values, report.errors) == (8, 8, 0)
    assert seen[-1] == (8, 8)
    spine = {"meter.id": ["m1", "m2", "m1"], "ts": [T0 + timedelta(hours=3)] * 2 + [T0]}
    stored = client.offline_query(spine, ["meter.reading"], recompute=False)
    assert stored.column("meter.reading") == [1 + 2.0, 2 + 2.0, 1.0]  # as of the 2h point


def test_a_backfill_never_replaces_a_newer_online_value(
    client: kr.Client, store: MemoryOnlineStore, engine: str
) -> None:
    live = client.query({"meter.id": "m1"}, ["meter.reading"], now=T0 + timedelta(days=2))
    client.materialize(
        keys=["m1", "m3"],
        start=T0,
        end=T0 + timedelta(days=1),
        every="1d",
        features=["meter.reading"],
        online=True,
        engine=engine,
    )
    later = T0 + timedelta(days=2, hours=1)
    m1 = client.query({"meter.id": "m1"}, ["meter.reading"], now=later)
    m3 = client.query({"meter.id": "m3"}, ["meter.reading"], now=T0 + timedelta(days=1, hours=1))
    assert m1.get("meter.reading").cached and m1.get_value("meter.reading") == live.get_value(
        "meter.reading"
    )
    assert m3.get("meter.reading").cached and m3.get_value("meter.reading") == 3 + 24.0


def test_backfill_input_errors(client: kr.Client) -> None:
    with pytest.raises(kr.InvalidInput, match="is before start"):
        client.materialize(
            keys=["m1"], start=T0, end=T0 - timedelta(1), every="1h", features=["meter.reading"]
        )
    with pytest.raises(kr.InvalidInput, match="positive duration"):
        client.materialize(keys=["m1"], start=T0, end=T0, every=0, features=["meter.reading"])


def write_project(folder: Path) -> Path:
    folder.mkdir()
    (folder / "features.py").write_text(FEATURES)
    return folder


def test_offline_and_materialize_commands(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], engine: str
) -> None:
    project = write_project(tmp_path / "meters")
    spine = tmp_path / "spine.parquet"
    pq.write_table(pa.table({"meter.id": ["m1", "m2"], "ts": [T0 + timedelta(hours=1)] * 2}), spine)
    out = tmp_path / "out.parquet"
    assert main(["offline", "--project", str(project), "--spine", str(spine), "--engine", engine,
                 "--out", "meter.reading", "--output", str(out)]) == 0  # fmt: skip
    assert pq.read_table(out).column("meter.reading").to_pylist() == [2.0, 3.0]
    captured = capsys.readouterr()
    assert "wrote 2 rows" in captured.out
    assert "100%" not in captured.err  # no progress bar off a terminal (tests/cli shows one on)

    assert main(["materialize", "meter.reading", "--project", str(project), "--keys", "m1",
                 "--start", T0.isoformat(), "--end", (T0 + timedelta(hours=2)).isoformat(),
                 "--every", "1h", "--engine", engine]) == 0  # fmt: skip
    assert "backfilled 3 rows: 3 values" in capsys.readouterr().out
    assert main(["offline", "--project", str(project), "--spine", str(spine), "--stored",
                 "--out", "meter.reading", "--output", str(out)]) == 0  # fmt: skip
    assert pq.read_table(out).column("meter.reading").to_pylist() == [2.0, None]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.mark.anyio
async def test_offline_queries_over_http(client: kr.Client) -> None:
    app = create_app(client)
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1"
    ) as h:
        body = {
            "spine": {"meter.id": ["m4"], "ts": [(T0 + timedelta(hours=2)).isoformat()]},
            "outputs": ["meter.reading"],
        }
        answer = await h.post("/v1/query/offline", json=body)
        assert answer.status_code == 200, answer.text
        assert answer.json()["columns"]["meter.reading"] == [6.0]
        bad = await h.post("/v1/query/offline", json={**body, "spine": [1]})
        assert bad.status_code == 422 and bad.json()["error"]["field"] == "spine"
        late = {**body, "spine": {"meter.id": ["m4"], "ts": ["not a time"]}}
        bad_time = await h.post("/v1/query/offline", json=late)
        assert bad_time.status_code == 422 and bad_time.json()["error"]["field"] == "ts"


@features
class Gauge:
    id: str
    value: float | None


@online
def gauge_value(gid: Gauge.id, now: kr.Now) -> Gauge.value:
    hours = (now.timestamp() - T0.timestamp()) / 3600
    return None if hours >= 24 else hours


def test_a_backfill_keeps_nulls_as_observations() -> None:
    with kr.Client(
        definitions=[Gauge, gauge_value], offline_store="duckdb:///:memory:", query_log="none://"
    ) as client:
        report = client.materialize(
            keys=["g1"], start=T0, end=T0 + timedelta(days=1), every="1d", features=["gauge.value"]
        )
        assert report.values == 2
        spine = {"gauge.id": ["g1", "g1"], "ts": [T0 + timedelta(hours=1), T0 + timedelta(days=2)]}
        stored = client.offline_query(spine, ["gauge.value"], recompute=False)
    assert stored.column("gauge.value") == [0.0, None]  # the later null is not hidden
