"""The async API inside an event loop, and the sync API called from inside a running loop."""

import asyncio
import gc
import os
import threading
import time
import warnings
from datetime import UTC, datetime

import pytest

import kairos as kr
from kairos import features, online
from tests.engine.conftest import MakeClient

NOW = datetime(2026, 1, 10, tzinfo=UTC)


@features
class Host:
    id: str
    region: str
    load: float


@pytest.fixture
def client(make_client: MakeClient) -> kr.Client:
    @online
    async def region(hid: Host.id) -> Host.region:
        await asyncio.sleep(0.01)
        return f"eu-{hid}"

    @online
    def load(hid: Host.id) -> Host.load:
        return float(len(hid))

    return make_client(Host, region, load)


def test_query_async_inside_asyncio_run(client: kr.Client) -> None:
    async def main() -> tuple[kr.QueryResult, kr.BulkResult]:
        single = await client.query_async(
            input={Host.id: "h1"}, output=[Host.region, Host.load], now=NOW, query_id="q-1"
        )
        bulk = await client.query_bulk_async(
            input={Host.id: ["a", "bbb"]}, output=[Host.region, Host.load], now=NOW
        )
        return single, bulk

    single, bulk = asyncio.run(main())

    assert single.values == {"host.region": "eu-h1", "host.load": 2.0}
    assert single.errors == []
    assert single.meta.query_id == "q-1"
    assert single.meta.now == NOW
    assert single.meta.rows == 1
    assert bulk.values == {"host.region": ["eu-a", "eu-bbb"], "host.load": [1.0, 3.0]}


def test_concurrent_async_queries_share_one_loop(client: kr.Client) -> None:
    async def main() -> list[kr.QueryResult]:
        return await asyncio.gather(
            *(
                client.query_async(input={Host.id: f"h{n}"}, output=[Host.region], now=NOW)
                for n in range(20)
            )
        )

    started = time.perf_counter()
    results = asyncio.run(main())
    elapsed = time.perf_counter() - started

    assert [r.get_value(Host.region) for r in results] == [f"eu-h{n}" for n in range(20)]
    assert elapsed < 0.15  # twenty 10 ms sleeps overlapped, not 200 ms in a row


def test_sync_query_works_inside_a_running_event_loop(client: kr.Client) -> None:
    async def main() -> tuple[kr.QueryResult, kr.BulkResult]:
        single = client.query(input={Host.id: "h1"}, output=[Host.region, Host.load], now=NOW)
        bulk = client.query_bulk(input={Host.id: ["a", "bb"]}, output=[Host.region], now=NOW)
        return single, bulk

    single, bulk = asyncio.run(main())

    assert single.values == {"host.region": "eu-h1", "host.load": 2.0}
    assert single.errors == []
    assert bulk.values == {"host.region": ["eu-a", "eu-bb"]}


def test_sync_query_from_many_threads(client: kr.Client) -> None:
    results: dict[int, object] = {}

    def ask(n: int) -> None:
        results[n] = client.query(input={Host.id: f"h{n}"}, output=[Host.region]).get_value(
            Host.region
        )

    threads = [threading.Thread(target=ask, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert results == {n: f"eu-h{n}" for n in range(8)}


def test_query_without_now_uses_the_current_time(client: kr.Client) -> None:
    before = datetime.now(UTC)
    result = client.query(input={Host.id: "h1"}, output=[Host.load])
    after = datetime.now(UTC)

    assert before <= result.meta.now <= after
    assert result.features["host.load"].observed_at == result.meta.now


def test_naive_now_is_read_as_utc(client: kr.Client) -> None:
    result = client.query(input={Host.id: "h1"}, output=[Host.load], now=datetime(2026, 1, 10))

    assert result.meta.now == NOW
    assert result.meta.now.tzinfo is not None


def test_now_that_is_not_a_datetime_is_invalid(client: kr.Client) -> None:
    with pytest.raises(kr.InvalidInput, match="now="):
        client.query(input={Host.id: "h1"}, output=[Host.load], now="2026-01-10")  # type: ignore[arg-type]


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counts open files via /proc")
def test_sync_queries_inside_a_loop_do_not_leak_event_loops(client: kr.Client) -> None:
    async def main() -> int:
        client.query(input={Host.id: "h0"}, output=[Host.load], now=NOW)  # warm up
        before = len(os.listdir("/proc/self/fd"))
        for n in range(50):
            client.query(input={Host.id: f"h{n}"}, output=[Host.load], now=NOW)
        return len(os.listdir("/proc/self/fd")) - before

    grown = asyncio.run(main())

    assert grown < 10
    assert len(client._loops) == 1  # one helper thread, one event loop, reused


def test_close_inside_a_running_loop_after_a_sync_query(make_client: MakeClient) -> None:
    @online
    def load(hid: Host.id) -> Host.load:
        return 1.0

    client = make_client(Host, load)
    made: list[asyncio.AbstractEventLoop] = []

    async def main() -> None:
        client.query(input={Host.id: "h1"}, output=[Host.load], now=NOW)
        made.extend(client._loops)  # so this test can close them if close() cannot
        client.close()

    failure = None
    with warnings.catch_warnings():
        # A failing close() leaves its store.close() coroutine un-awaited; keep that quiet.
        warnings.simplefilter("ignore", RuntimeWarning)
        try:
            asyncio.run(main())
        except RuntimeError as error:
            failure = str(error)
        finally:
            for loop in made:
                if not loop.is_closed():
                    loop.close()
        gc.collect()

    assert failure is None
