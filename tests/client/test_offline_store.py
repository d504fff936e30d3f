"""Online queries write what they compute to the offline store; offline queries read it back
as of each spine row (through has-one relations too), or recompute some features."""

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest

import kairos as kr
from kairos import Features, features, online

T0 = datetime(2026, 3, 1, 12, tzinfo=UTC)


@features
class Team:
    id: str
    name: str


@features
class Player:
    id: str
    team_id: "Team.id"
    score: int
    tags: list[str]


calls = {"score": 0}


@online
def player_row(pid: Player.id, now: kr.Now) -> Features[Player.score, Player.team_id, Player.tags]:
    calls["score"] += 1
    day = days_since_t0(now)
    return 10 * day + int(str(pid)[1:]), f"t{day % 2}", [f"d{day}"]


@online
def team_name(tid: Team.id, now: kr.Now) -> Team.name:
    return f"{tid} on day {days_since_t0(now)}"


def days_since_t0(now: datetime) -> int:
    return int((now.timestamp() - T0.timestamp()) // 86400)


@pytest.fixture
def client() -> Iterator[kr.Client]:
    with kr.Client(
        definitions=[Team, Player, player_row, team_name],
        offline_store="duckdb:///:memory:",
        query_log="none://",
    ) as client:
        yield client


def test_stored_values_are_read_as_of_each_row(client: kr.Client) -> None:
    outputs = ["player.score", "player.tags", "player.team.name"]
    for day in (0, 1, 2):
        client.query({"player.id": "p7"}, outputs, now=T0 + timedelta(days=day))
    spine = {
        "player.id": ["p7", "p7", "p7", "p7", "p8", None],
        "ts": [
            T0 - timedelta(hours=1),  # before anything was computed
            T0,  # exactly when day 0 was observed
            T0 + timedelta(days=1, hours=5),
            T0 + timedelta(days=9),
            T0 + timedelta(days=9),  # never queried online
            T0 + timedelta(days=9),  # a null key
        ],
    }
    before = calls["score"]
    result = client.offline_query(spine, outputs, recompute=False)
    assert calls["score"] == before  # nothing recomputed
    assert result.column("player.score") == [None, 7, 17, 27, None, None]
    assert result.column("player.tags") == [None, ["d0"], ["d1"], ["d2"], None, None]
    # the relation as of then: day 1 pointed at team t1, whose name was computed that day
    assert result.column("player.team.name") == [
        None,
        "t0 on day 0",
        "t1 on day 1",
        "t0 on day 2",
        None,
        None,
    ]


def test_recompute_some_features_and_read_the_others(client: kr.Client) -> None:
    client.query({"player.id": "p3"}, ["player.score"], now=T0)
    spine = {"player.id": ["p3"], "ts": [T0 + timedelta(days=4)]}
    result = client.offline_query(spine, ["player.score", "player.tags"], recompute=["player.tags"])
    assert result.column("player.score") == [3]  # stored at T0
    assert result.column("player.tags") == [["d4"]]  # recomputed with Now = ts


def test_a_client_without_an_offline_store_says_so() -> None:
    with (
        kr.Client(definitions=[Team, Player, player_row, team_name]) as client,
        pytest.raises(kr.KairosError, match="keeps no offline store"),
    ):
        client.offline_query({"player.id": ["p1"], "ts": [T0]}, ["player.score"], recompute=False)


def test_stored_reads_refuse_outputs_of_two_classes(client: kr.Client) -> None:
    spine = {"player.id": ["p1"], "ts": [T0]}
    with pytest.raises(kr.InvalidInput, match="several classes"):
        client.offline_query(spine, ["player.score", "team.name"], recompute=False)


def test_values_computed_at_a_future_now_are_not_kept(client: kr.Client) -> None:
    future = datetime.now(UTC) + timedelta(days=400)
    client.query({"player.id": "p5"}, ["player.score"], now=future)
    stored = client.offline_query(
        {"player.id": ["p5"], "ts": [future]}, ["player.score"], recompute=False
    )
    assert stored.column("player.score") == [None]


def test_a_flush_waits_for_values_added_before_it() -> None:
    import threading
    import time as clock

    from kairos.definitions.types import ValueType
    from kairos.stores.offline.writer import OfflineWriter

    written: list[str] = []
    gate = threading.Event()

    class SlowStore:
        def write(self, namespace: str, feature: str, *args: object) -> None:
            gate.wait(1.0)
            written.append(feature)

    writer = OfflineWriter(lambda: SlowStore(), interval=0.01)  # type: ignore[arg-type, return-value]
    kind = ValueType("int")
    writer.add([("n", "a", kind, kind, 1, T0, 1)])
    clock.sleep(0.05)  # the writer is now inside the slow write of "a"
    writer.add([("n", "b", kind, kind, 1, T0, 2)])
    gate.set()
    writer.flush(timeout=5)
    assert written == ["a", "b"]
    writer.close()
