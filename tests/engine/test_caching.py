"""Online-store caching against an explicit `now`.

Rule: a stored value answers a query iff observed_at <= now and now - observed_at <=
max_staleness (a per-query `staleness` override, else the feature's, else its class's, else 0).
"""

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

import kairos as kr
from kairos import feature, features, online
from tests.engine.conftest import MakeClient

T = datetime(2026, 1, 10, 12, 0, tzinfo=UTC)


@features(max_staleness="1m")
class Profile:
    id: str
    score: float  # the class's 1m
    quick: float = feature(max_staleness="10s")
    never: float = feature(max_staleness="0s")
    risk: float
    tags: list[str]


@features
class Device:
    id: str
    model: str  # no max_staleness anywhere: 0, always recomputed


@features
class Visit:
    id: str
    profile_id: "Profile.id"


@dataclass
class Cached:
    client: kr.Client
    calls: Counter[str]

    def profile(
        self, at: datetime, outputs: Sequence[Any], staleness: Mapping[Any, str] | None = None
    ) -> kr.QueryResult:
        return self.client.query(
            input={Profile.id: "p1"}, output=outputs, now=at, staleness=staleness
        )


@pytest.fixture
def cached(make_client: MakeClient) -> Cached:
    calls: Counter[str] = Counter()

    def counted(name: str) -> float:
        calls[name] += 1
        return float(calls[name])  # a different value each time it is computed

    @online
    def score(pid: Profile.id) -> Profile.score:
        return counted("score")

    @online
    def quick(pid: Profile.id) -> Profile.quick:
        return counted("quick")

    @online
    def never(pid: Profile.id) -> Profile.never:
        return counted("never")

    @online
    def risk(s: Profile.score) -> Profile.risk:
        counted("risk")
        return s * 10

    @online
    def tags(pid: Profile.id) -> Profile.tags:
        counted("tags")
        return ["a", "b"]

    @online
    def model(did: Device.id) -> Device.model:
        return f"model-{counted('model'):g}"

    @online
    def visitor(vid: Visit.id) -> Visit.profile_id:
        return "p1"

    client = make_client(Profile, Device, Visit, score, quick, never, risk, tags, model, visitor)
    return Cached(client, calls)


def test_class_max_staleness_serves_from_cache_until_it_expires(cached: Cached) -> None:
    first = cached.profile(T, [Profile.score])
    assert first.get_value(Profile.score) == 1.0
    computed = first.features["profile.score"]
    assert computed.source == "score"
    assert computed.observed_at == T
    assert not computed.cached

    hit = cached.profile(T + timedelta(seconds=59), [Profile.score])
    served = hit.features["profile.score"]
    assert served.source == "cache"
    assert served.cached
    assert served.value == 1.0
    assert served.observed_at == T
    assert cached.calls["score"] == 1

    expired = cached.profile(T + timedelta(seconds=61), [Profile.score])
    recomputed = expired.features["profile.score"]
    assert recomputed.source == "score"
    assert recomputed.value == 2.0
    assert recomputed.observed_at == T + timedelta(seconds=61)
    assert cached.calls["score"] == 2


def test_value_exactly_max_staleness_old_is_still_fresh(cached: Cached) -> None:
    cached.profile(T, [Profile.score])
    at_boundary = cached.profile(T + timedelta(seconds=60), [Profile.score])
    assert at_boundary.features["profile.score"].source == "cache"
    assert at_boundary.features["profile.score"].observed_at == T

    just_past = cached.profile(T + timedelta(seconds=60, microseconds=1), [Profile.score])
    assert just_past.features["profile.score"].source == "score"
    assert cached.calls["score"] == 2


def test_feature_max_staleness_overrides_the_class(cached: Cached) -> None:
    cached.profile(T, [Profile.quick, Profile.score])

    at_10s = cached.profile(T + timedelta(seconds=10), [Profile.quick, Profile.score])
    assert at_10s.features["profile.quick"].source == "cache"
    assert at_10s.features["profile.score"].source == "cache"

    at_11s = cached.profile(T + timedelta(seconds=11), [Profile.quick, Profile.score])
    assert at_11s.features["profile.quick"].source == "quick"
    assert at_11s.features["profile.quick"].value == 2.0
    assert at_11s.features["profile.score"].source == "cache"  # 1m still holds
    assert cached.calls == Counter({"quick": 2, "score": 1})


def test_zero_max_staleness_is_never_cached(cached: Cached) -> None:
    for offset in (0, 0, 1):
        result = cached.profile(T + timedelta(seconds=offset), [Profile.never])
        assert result.features["profile.never"].source == "never"
    assert cached.calls["never"] == 3

    for _ in range(2):
        result = cached.client.query(input={Device.id: "d1"}, output=[Device.model], now=T)
        assert result.features["device.model"].source == "model"
        assert result.meta.cache_hits == 0
    assert cached.calls["model"] == 2


def test_now_before_the_cached_value_recomputes(cached: Cached) -> None:
    cached.profile(T, [Profile.score])

    earlier = cached.profile(T - timedelta(seconds=1), [Profile.score])
    value = earlier.features["profile.score"]
    assert value.source == "score"  # the stored value did not exist yet at that now
    assert value.observed_at == T - timedelta(seconds=1)
    assert value.value == 2.0

    # The older value did not replace the newer one in the store.
    later = cached.profile(T + timedelta(seconds=30), [Profile.score])
    assert later.features["profile.score"].source == "cache"
    assert later.features["profile.score"].observed_at == T
    assert later.get_value(Profile.score) == 1.0
    assert cached.calls["score"] == 2


def test_staleness_override_of_zero_forces_a_recompute(cached: Cached) -> None:
    cached.profile(T, [Profile.score, Profile.quick])

    forced = cached.profile(
        T + timedelta(seconds=1), [Profile.score, Profile.quick], staleness={Profile.score: "0s"}
    )
    assert forced.features["profile.score"].source == "score"
    assert forced.features["profile.score"].value == 2.0
    assert forced.features["profile.quick"].source == "cache"  # only the named feature
    assert cached.calls == Counter({"score": 2, "quick": 1})

    # The forced value went back to the store.
    after = cached.profile(T + timedelta(seconds=2), [Profile.score])
    assert after.features["profile.score"].observed_at == T + timedelta(seconds=1)
    assert after.get_value(Profile.score) == 2.0


def test_staleness_override_accepts_names_and_shortens_the_limit(cached: Cached) -> None:
    cached.profile(T, [Profile.score])

    within = cached.profile(
        T + timedelta(seconds=5), [Profile.score], staleness={"profile.score": "5s"}
    )
    assert within.features["profile.score"].source == "cache"
    beyond = cached.profile(
        T + timedelta(seconds=6), [Profile.score], staleness={"profile.score": "5s"}
    )
    assert beyond.features["profile.score"].source == "score"


def test_fully_cached_query_calls_no_resolver(cached: Cached) -> None:
    first = cached.profile(T, [Profile.score, Profile.risk, Profile.quick])
    assert first.meta.cache_hits == 0
    assert first.values == {"profile.score": 1.0, "profile.risk": 10.0, "profile.quick": 1.0}
    calls_after_first = Counter(cached.calls)

    again = cached.profile(T + timedelta(seconds=5), [Profile.score, Profile.risk, Profile.quick])

    assert cached.calls == calls_after_first
    assert again.values == first.values
    assert all(v.source == "cache" for v in again.features.values())
    assert again.meta.cache_hits == 3
    assert again.meta.computed == 0
    assert [t.kind for t in again.trace if t.kind not in ("cache", "query")] == []


def test_cached_dependent_skips_its_upstream_resolver(cached: Cached) -> None:
    cached.profile(T, [Profile.risk])
    assert cached.calls == Counter({"score": 1, "risk": 1})

    # risk is fresh, so score (its only input) is not even needed.
    result = cached.profile(T + timedelta(seconds=30), [Profile.risk])
    assert result.features["profile.risk"].source == "cache"
    assert cached.calls == Counter({"score": 1, "risk": 1})


def test_cache_hits_count_every_row_in_bulk(cached: Cached) -> None:
    cached.client.query_bulk(input={Profile.id: ["p1", "p2"]}, output=[Profile.score], now=T)

    mixed = cached.client.query_bulk(
        input={Profile.id: ["p1", "p3", "p2"]}, output=[Profile.score], now=T + timedelta(seconds=1)
    )

    assert mixed.meta.cache_hits == 2
    assert [v.source for v in (mixed.row(i)["profile.score"] for i in range(3))] == [
        "cache",
        "score",
        "cache",
    ]
    assert mixed.column(Profile.score) == [1.0, 3.0, 2.0]
    assert cached.calls["score"] == 3


def test_value_reached_through_a_relation_is_served_from_the_cache(cached: Cached) -> None:
    cached.profile(T, [Profile.score])

    result = cached.client.query(
        input={Visit.id: "v1"}, output=["visit.profile.score"], now=T + timedelta(seconds=30)
    )

    served = result.features["visit.profile.score"]
    assert served.source == "cache"
    assert served.value == 1.0
    assert served.observed_at == T
    assert cached.calls["score"] == 1

    expired = cached.client.query(
        input={Visit.id: "v1"}, output=["visit.profile.score"], now=T + timedelta(minutes=2)
    )
    assert expired.features["visit.profile.score"].source == "score"
    assert cached.calls["score"] == 2


def test_mutating_a_result_does_not_change_the_cache(cached: Cached) -> None:
    first = cached.profile(T, [Profile.tags])
    first.get_value(Profile.tags).append("mutated")

    again = cached.profile(T + timedelta(seconds=1), [Profile.tags])

    assert again.features["profile.tags"].source == "cache"
    assert again.get_value(Profile.tags) == ["a", "b"]
