"""A feature's ttl: one rule online and offline. A value observed at `t` is a value until
`t + ttl` (excluded): the cache serves it only before then, whatever max_staleness allows, and
an offline row at `ts` sees it only when `ts - ttl < t`."""

from collections import Counter
from datetime import UTC, datetime, timedelta

import pytest

import kairos as kr
from kairos import feature, features, online
from kairos.errors import DefinitionError
from tests.engine.conftest import MakeClient

T = datetime(2026, 1, 10, 12, 0, tzinfo=UTC)
US = timedelta(microseconds=1)


@features(max_staleness="1h", ttl="10m")
class Meter:
    id: str
    reading: float  # the class's ttl: 10m
    lasting: float = feature(ttl="2h")
    forever: float = feature(max_staleness="1h")  # the class's ttl too


@features
class Plain:
    id: str
    value: float = feature(max_staleness="1d")  # no ttl: only max_staleness counts


def test_ttl_is_read_from_the_feature_then_the_class() -> None:
    client = kr.Client(definitions=[Meter, Plain])
    try:
        assert client.graph.feature("meter", "reading").ttl == timedelta(minutes=10)
        assert client.graph.feature("meter", "lasting").ttl == timedelta(hours=2)
        assert client.graph.feature("meter", "forever").ttl == timedelta(minutes=10)
        assert client.graph.feature("plain", "value").ttl is None
    finally:
        client.close()


@pytest.mark.parametrize("ttl", ["0s", timedelta(minutes=-1)])
def test_a_ttl_must_be_positive(ttl: str | timedelta) -> None:
    with pytest.raises(DefinitionError, match=r"ttl.*must be positive"):
        feature(ttl=ttl)
    with pytest.raises(DefinitionError, match=r"ttl.*must be positive"):
        features(ttl=ttl)


def test_online_and_offline_drop_a_value_at_exactly_its_ttl(make_client: MakeClient) -> None:
    calls: Counter[str] = Counter()

    @online
    def reading(mid: Meter.id) -> Meter.reading:
        calls[mid] += 1
        return float(calls[mid])

    client = make_client(Meter, reading, offline_store="duckdb:///:memory:", query_log="none://")

    def online_at(meter: str, at: datetime) -> float:
        value = client.query(input={Meter.id: meter}, output=[Meter.reading], now=at)
        return float(value.get_value(Meter.reading))

    assert online_at("m1", T) == 1.0
    assert online_at("m1", T + timedelta(minutes=10) - US) == 1.0  # cached: younger than ttl
    assert online_at("m1", T + timedelta(minutes=10)) == 2.0  # exactly ttl old: recomputed
    assert calls["m1"] == 2
    assert online_at("m2", T) == 1.0
    offline = client.offline_query(
        {
            "meter.id": ["m2", "m2", "m2", "m2"],
            "ts": [T - US, T, T + timedelta(minutes=10) - US, T + timedelta(minutes=10)],
        },
        [Meter.reading],
        recompute=False,
    )
    # the same boundary: stored m2 was observed at T
    assert offline.column("meter.reading") == [None, 1.0, 1.0, None]
