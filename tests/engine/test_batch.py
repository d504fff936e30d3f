# mypy: disable-error-code="return-value, attr-defined, comparison-overlap"
# (a batch resolver takes lists of the features its annotations name; type checkers see
# the element types)
"""Resolvers that take a whole batch: one call per query, one result per entity."""

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest

import kairos as kr
from kairos import Features, Now, features, online

T0 = datetime(2026, 2, 1, tzinfo=UTC)
calls: list[int] = []


@features
class Sensor:
    id: str
    level: int
    label: str
    age_hours: float


@online(batch=True)
def levels(ids: Sensor.id) -> Features[Sensor.level, Sensor.label]:
    calls.append(len(ids))
    return [(int(str(i)[1:]), f"sensor {i}") for i in ids]


@online(batch=True)
async def ages(ids: Sensor.id, now: Now) -> Sensor.age_hours:
    return [(n - T0).total_seconds() / 3600 for n in now]


@pytest.fixture
def client() -> Iterator[kr.Client]:
    calls.clear()
    with kr.Client(definitions=[Sensor, levels, ages], query_log="none://") as client:
        yield client


def test_a_bulk_query_calls_a_batch_resolver_once(client: kr.Client) -> None:
    ids = [f"s{i}" for i in range(50)]
    result = client.query_bulk({"sensor.id": ids}, ["sensor.level", "sensor.label"])
    assert calls == [50]
    assert result.column("sensor.level") == list(range(50))
    assert result.column("sensor.label") == [f"sensor {i}" for i in ids]


def test_offline_rows_each_get_their_own_now(client: kr.Client) -> None:
    times = [T0 + timedelta(hours=h) for h in (1, 5, 2)]
    result = client.offline_query(
        {"sensor.id": ["s1", "s2", "s3"], "ts": times}, ["sensor.age_hours"]
    )
    assert result.column("sensor.age_hours") == [1.0, 5.0, 2.0]


def test_a_batch_with_the_wrong_number_of_results_fails_every_entity() -> None:
    @online(batch=True)
    def short(ids: Sensor.id) -> Sensor.level:
        return [1]

    with kr.Client(definitions=[Sensor, short], query_log="none://") as client:
        result = client.query_bulk({"sensor.id": ["s1", "s2"]}, ["sensor.level"])
    assert result.column("sensor.level") == [None, None]
    assert {e.code for e in result.errors} == {"resolver_error"}
    assert "returned 1 results for 2 entities" in result.errors[0].message


def test_a_batch_resolver_stays_a_plain_callable() -> None:
    assert levels(["s7"]) == [(7, "sensor s7")]
