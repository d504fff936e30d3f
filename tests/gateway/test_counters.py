"""The counters contract on every backend: all-or-nothing holds, idempotent settles, and a
hold whose lease ran out stays charged in full."""

from __future__ import annotations

import asyncio
import time

from kairos.gateway.accounting.counters import Line
from kairos.gateway.store import counters_from_url


def test_hold_is_all_or_nothing_and_settle_is_idempotent(counters_url: str) -> None:
    async def scenario() -> None:
        counters = counters_from_url(counters_url)
        try:
            lease = time.time() + 60
            refused = await counters.hold("h1", [Line("a", 100, 60), Line("b", 50, 60)], lease)
            assert refused == 1
            assert await counters.spent(["a", "b"]) == [0, 0]  # nothing charged
            assert (
                await counters.hold("h2", [Line("a", 100, 60), Line("b", 100, 60)], lease) is None
            )
            assert await counters.spent(["a", "b"]) == [60, 60]
            assert await counters.hold("h3", [Line("a", 100, 60)], lease) == 0
            assert await counters.settle("h2", {"a": 15, "b": 20})
            assert await counters.spent(["a", "b"]) == [15, 20]
            assert not await counters.settle("h2", {"a": 0, "b": 0})  # a second settle: no-op
            assert await counters.spent(["a", "b"]) == [15, 20]
        finally:
            await counters.close()

    asyncio.run(scenario())


def test_an_expired_lease_is_charged_in_full(counters_url: str) -> None:
    async def scenario() -> None:
        counters = counters_from_url(counters_url)
        try:
            assert await counters.hold("h", [Line("c", 100, 70)], time.time() + 0.05) is None
            await asyncio.sleep(0.1)
            assert not await counters.settle("h", {"c": 5})  # too late: the full hold stays
            assert await counters.spent(["c"]) == [70]
        finally:
            await counters.close()

    asyncio.run(scenario())


def test_rate_windows_expire(counters_url: str) -> None:
    async def scenario() -> None:
        counters = counters_from_url(counters_url)
        try:
            line = Line("rpm", 1, 1, time.time() + 60)
            assert await counters.hold("r1", [line], time.time() + 60) is None
            assert await counters.hold("r2", [line], time.time() + 60) == 0
        finally:
            await counters.close()

    asyncio.run(scenario())
