"""A resolver that overruns its timeout nulls only its own features (and their dependents)."""

import asyncio
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest

from kairos import features, online
from tests.engine.conftest import MakeClient

NOW = datetime(2026, 1, 10, tzinfo=UTC)
HANG = 1.0  # how long a hanging resolver would block
RETURNS_WITHIN = 0.5


@features
class Card:
    id: str
    limit: float
    issuer: str
    headroom: float


@pytest.fixture
def release() -> Iterator[threading.Event]:
    """Set at teardown so a timed-out sync resolver's thread does not outlive the test."""
    event = threading.Event()
    yield event
    event.set()


def test_sync_resolver_past_its_timeout_gives_a_timeout_error(
    make_client: MakeClient, release: threading.Event
) -> None:
    @online(timeout="50ms")
    def hanging_limit(cid: Card.id) -> Card.limit:
        release.wait(HANG)
        return 100.0

    @online
    def issuer(cid: Card.id) -> Card.issuer:
        return "visa"

    client = make_client(Card, hanging_limit, issuer)
    started = time.perf_counter()
    result = client.query(input={Card.id: "c1"}, output=[Card.limit, Card.issuer], now=NOW)
    elapsed = time.perf_counter() - started

    assert elapsed < RETURNS_WITHIN
    assert result.values == {"card.limit": None, "card.issuer": "visa"}
    (error,) = result.errors
    assert error.feature == "card.limit"
    assert error.code == "timeout"
    assert error.resolver == "hanging_limit"
    assert "hanging_limit" in error.message
    assert "0.05s" in error.message
    statuses = {t.label: t.status for t in result.trace}
    assert statuses["hanging_limit"] == "timeout"
    assert statuses["issuer"] == "ok"


def test_async_resolver_past_its_timeout_gives_a_timeout_error(make_client: MakeClient) -> None:
    cancelled: list[bool] = []

    @online(timeout="50ms")
    async def hanging_limit(cid: Card.id) -> Card.limit:
        try:
            await asyncio.sleep(HANG)
        except asyncio.CancelledError:
            cancelled.append(True)
            raise
        return 100.0

    @online
    async def issuer(cid: Card.id) -> Card.issuer:
        return "visa"

    client = make_client(Card, hanging_limit, issuer)
    started = time.perf_counter()
    result = client.query(input={Card.id: "c1"}, output=[Card.limit, Card.issuer], now=NOW)
    elapsed = time.perf_counter() - started

    assert elapsed < RETURNS_WITHIN
    assert result.values == {"card.limit": None, "card.issuer": "visa"}
    assert [(e.feature, e.code) for e in result.errors] == [("card.limit", "timeout")]
    assert cancelled == [True]  # the coroutine is cancelled, not left running


def test_dependents_of_a_timed_out_feature_get_upstream_errors(
    make_client: MakeClient, release: threading.Event
) -> None:
    @online(timeout="50ms")
    def hanging_limit(cid: Card.id) -> Card.limit:
        release.wait(HANG)
        return 100.0

    @online
    def headroom(limit: Card.limit) -> Card.headroom:
        return limit - 10

    client = make_client(Card, hanging_limit, headroom)
    result = client.query(input={Card.id: "c1"}, output=[Card.headroom], now=NOW)

    assert result.get_value(Card.headroom) is None
    (error,) = result.errors
    assert error.feature == "card.headroom"
    assert error.code == "upstream_error"
    assert "card.limit" in error.message


def test_client_default_timeout_applies_to_resolvers_without_their_own(
    make_client: MakeClient, release: threading.Event
) -> None:
    @online
    def hanging_limit(cid: Card.id) -> Card.limit:
        release.wait(HANG)
        return 100.0

    @online(timeout="2s")
    def slowish_issuer(cid: Card.id) -> Card.issuer:
        time.sleep(0.1)  # over the client default, under its own timeout
        return "visa"

    client = make_client(Card, hanging_limit, slowish_issuer, default_timeout="50ms")
    started = time.perf_counter()
    result = client.query(input={Card.id: "c1"}, output=[Card.limit, Card.issuer], now=NOW)
    elapsed = time.perf_counter() - started

    assert elapsed < RETURNS_WITHIN
    assert result.values == {"card.limit": None, "card.issuer": "visa"}
    assert [(e.feature, e.code) for e in result.errors] == [("card.limit", "timeout")]


def test_a_resolver_within_its_timeout_is_not_cut_off(make_client: MakeClient) -> None:
    @online(timeout="1s")
    async def limit(cid: Card.id) -> Card.limit:
        await asyncio.sleep(0.05)
        return 100.0

    client = make_client(Card, limit, default_timeout="10ms")
    result = client.query(input={Card.id: "c1"}, output=[Card.limit], now=NOW)

    assert result.errors == []
    assert result.get_value(Card.limit) == 100.0
