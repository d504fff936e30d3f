"""Streams consumed into events against the real Redis and NATS JetStream of this machine:
events reach the windows, a repeated event id counts once, poison goes to the dead-letter
stream with its reason, and a consumer killed mid-batch loses nothing and counts nothing twice
when it restarts."""

import asyncio
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import redis
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from starlette.testclient import TestClient

import kairos as kr
from kairos import DataFrame, FeatureTime, Windowed, _, features, windowed
from kairos.client.consume import consumers_for
from kairos.errors import ProjectError
from kairos.project.config import Config
from kairos.server import create_app
from kairos.sources.streams import stream_from_config
from tests.conftest import NATS_URL, REDIS_URL, need_nats, need_redis
from tests.sources.kafka_broker import kafka_broker
from tests.ui.cells import cells

T0 = datetime(2026, 6, 1, 12, tzinfo=UTC)


@features(events=True)
class Payment:
    id: str
    payer_id: "Payer.id"
    amount: float
    at: FeatureTime


@features
class Payer:
    id: str
    payments: DataFrame[Payment]
    paid: Windowed[int] = windowed("7d", expression=_.payments[_.at > _.window_start].count())


def event(i: int, payer: str = "p1", **extra: Any) -> dict[str, Any]:
    at = (T0 - timedelta(minutes=i)).isoformat()
    return {"id": f"e{i}", "payer_id": payer, "amount": float(i), "at": at, **extra}


async def drained(consumer: Any) -> int:
    try:
        return int(await consumer.drain())
    finally:
        await consumer.close()


def paid(client: kr.Client, payer: str = "p1") -> int:
    value = client.query({Payer.id: payer}, [Payer.paid["7d"]], now=T0).get_value(Payer.paid["7d"])
    return int(value)


@pytest.fixture
def r() -> Iterator[redis.Redis]:
    need_redis()
    client = redis.Redis.from_url(REDIS_URL)
    yield client
    client.close()


@pytest.fixture
def stream_key(r: redis.Redis) -> Iterator[str]:
    key = f"kairos-test-{uuid.uuid4().hex[:10]}"
    yield key
    r.delete(key, f"{key}.dead")


def groups(r: redis.Redis, key: str) -> dict[str, Any]:
    """The stream's consumer groups by name (none before the consumer made its group)."""
    if not r.exists(key):
        return {}
    found = {}
    for group in r.xinfo_groups(key):
        name = group["name"]
        found[name.decode() if isinstance(name, bytes) else name] = group
    return found


def client_for(folder: Path, streams: dict[str, Any], offline: str = "none://") -> kr.Client:
    config = Config(base_dir=folder, streams=streams, offline_store=offline)
    return kr.Client(definitions=[Payment, Payer], config=config, query_log="none://")


def test_redis_events_reach_the_windows_once_and_poison_is_dead_lettered(
    tmp_path: Path, stream_key: str, r: redis.Redis
) -> None:
    for i in range(40):
        r.xadd(stream_key, {"data": json.dumps(event(i))})
    r.xadd(stream_key, {"data": json.dumps(event(3))})  # delivered twice: counts once
    r.xadd(stream_key, {"data": b"{not json"})
    r.xadd(stream_key, {"data": json.dumps({"id": "x1", "payer_id": "p1", "amount": 1.0})})
    r.xadd(stream_key, {"data": json.dumps(event(99, amount="lots"))})
    spec = {"kind": "redis", "url": REDIS_URL, "stream": stream_key, "events": "Payment",
            "batch": 16}  # fmt: skip
    with client_for(tmp_path, {"payments": spec}) as client:
        [consumer] = consumers_for(client)
        assert asyncio.run(drained(consumer)) == 44
        assert paid(client) == 40
        stats = consumer.stats
        assert (stats.messages, stats.events, stats.dead) == (44, 41, 3)
        assert stats.lag == 0
    dead: list[Any] = r.xrange(f"{stream_key}.dead")  # type: ignore[assignment]
    reasons = [fields[b"reason"].decode() for _, fields in dead]
    assert len(reasons) == 3
    assert any("JSON" in reason or "unexpected" in reason for reason in reasons)
    assert any("'at'" in reason for reason in reasons)  # the event with no time
    assert any("amount" in reason for reason in reasons)
    pending = r.xpending(stream_key, "kairos")
    assert pending["pending"] == 0  # every message acknowledged


def test_an_event_id_blank_or_past_256_characters_is_dead_lettered_naming_it(
    tmp_path: Path, stream_key: str, r: redis.Redis
) -> None:
    for i in range(5):
        r.xadd(stream_key, {"data": json.dumps(event(i))})
    r.xadd(stream_key, {"data": json.dumps({**event(10), "id": ""})})
    r.xadd(stream_key, {"data": json.dumps({**event(11), "id": "x" * 100_000})})
    spec = {"kind": "redis", "url": REDIS_URL, "stream": stream_key, "events": "Payment"}
    with client_for(tmp_path, {"payments": spec}) as client:
        [consumer] = consumers_for(client)
        assert asyncio.run(drained(consumer)) == 7  # the consumer went on
        assert paid(client) == 5
        assert (consumer.stats.events, consumer.stats.dead) == (5, 2)
    dead: list[Any] = r.xrange(f"{stream_key}.dead")  # type: ignore[assignment]
    reasons = sorted(fields[b"reason"].decode() for _, fields in dead)
    assert len(reasons) == 2
    assert all("id" in reason and "at most 256 characters" in reason for reason in reasons)
    assert any("blank" in reason for reason in reasons)
    assert any("100000 characters" in reason for reason in reasons)
    assert r.xpending(stream_key, "kairos")["pending"] == 0


def test_a_redis_consumer_killed_mid_batch_loses_and_doubles_nothing(
    tmp_path: Path, stream_key: str, r: redis.Redis
) -> None:
    """`kairos consume` is killed (SIGKILL) while it works through the stream; started again,
    it reads what it was given and had not acknowledged: every event kept exactly once."""
    folder = tmp_path / "project"
    folder.mkdir()
    (folder / "features.py").write_text(
        textwrap.dedent("""
        from kairos import DataFrame, FeatureTime, Windowed, _, features, windowed

        @features(events=True)
        class Payment:
            id: str
            payer_id: "Payer.id"
            amount: float
            at: FeatureTime

        @features
        class Payer:
            id: str
            payments: DataFrame[Payment]
            paid: Windowed[int] = windowed(
                "7d", expression=_.payments[_.at > _.window_start].count()
            )
    """)
    )
    (folder / "slow.py").write_text(
        textwrap.dedent("""
        import json, time

        def to_event(message):
            time.sleep(0.01)  # a batch takes a while: the kill lands inside one
            return json.loads(message["body"])
    """)
    )
    (folder / "kairos.yaml").write_text(
        textwrap.dedent(f"""
        offline_store: duckdb:///.kairos/offline.duckdb
        query_log: none://
        streams:
          payments:
            kind: redis
            url: {REDIS_URL}
            stream: {stream_key}
            events: payment
            map: slow:to_event
            batch: 20
    """)
    )
    total = 300
    for i in range(total):
        r.xadd(stream_key, {"data": json.dumps(event(i, payer=f"p{i % 3}"))})
    command = [sys.executable, "-m", "kairos.cli", "consume", "--project", str(folder)]
    log = (tmp_path / "consume.log").open("wb")
    process = subprocess.Popen(command, cwd=folder, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # kill it once some, not all, were acknowledged
        group = groups(r, stream_key).get("kairos")
        if group is not None and 60 <= int(group["entries-read"] or 0) < total - 60:
            break
        time.sleep(0.02)
    os.kill(process.pid, signal.SIGKILL)
    process.wait(30)
    log.close()
    group = groups(r, stream_key)["kairos"]
    assert 0 < int(group["entries-read"]) < total  # killed part way
    assert int(group["pending"]) > 0  # with a batch delivered and not acknowledged
    again = subprocess.run([*command, "--drain"], cwd=folder, capture_output=True, text=True,
                           timeout=120)  # fmt: skip
    assert again.returncode == 0, again.stdout + again.stderr
    assert r.xpending(stream_key, "kairos")["pending"] == 0
    with kr.Client(folder) as client:  # the windows read every event back from the store
        counts = [paid(client, f"p{k}") for k in range(3)]
    assert counts == [100, 100, 100]


def test_nats_jetstream_events_reach_the_windows_and_poison_is_terminated(
    tmp_path: Path,
) -> None:
    nats = pytest.importorskip("nats")
    need_nats()
    subject = f"kairos.test.{uuid.uuid4().hex[:10]}"
    name = subject.replace(".", "_")
    dead: list[Any] = []

    async def publish() -> None:
        connection = await nats.connect(NATS_URL)
        js = connection.jetstream()
        await js.add_stream(name=name, subjects=[subject])
        for i in range(25):
            await js.publish(subject, json.dumps(event(i)).encode())
        await js.publish(subject, json.dumps(event(4)).encode())
        await js.publish(subject, b"[1, 2]")
        await connection.close()

    async def consume(client: kr.Client) -> int:
        watcher = await nats.connect(NATS_URL)

        async def on_dead(message: Any) -> None:
            dead.append(message)

        await watcher.subscribe(f"{subject}.dead", cb=on_dead)
        [consumer] = consumers_for(client)
        try:
            count = await consumer.drain(idle=0.5)
            await watcher.flush()
            await asyncio.sleep(0.2)
        finally:
            await consumer.close()
            await watcher.close()
        return count

    async def cleanup() -> None:
        connection = await nats.connect(NATS_URL)
        await connection.jetstream().delete_stream(name)
        await connection.close()

    asyncio.run(publish())
    spec = {"kind": "nats", "url": NATS_URL, "stream": subject, "events": "payment",
            "group": "kairos-test", "batch": 10}  # fmt: skip
    try:
        with client_for(tmp_path, {"payments": spec}) as client:
            assert asyncio.run(consume(client)) == 27
            assert paid(client) == 25
    finally:
        asyncio.run(cleanup())
    assert len(dead) == 1
    assert "not an object" in dead[0].headers["Kairos-Reason"]


def test_a_nats_read_of_an_empty_stream_is_empty_every_time() -> None:
    """nats-py's fetch times out with its own TimeoutError or, now and then (its deadline
    passed after the server's "no messages"), the builtin one: both are an empty read, never
    a broker error, which would stop a drain and back a running consumer off."""
    nats = pytest.importorskip("nats")
    need_nats()
    subject = f"kairos.test.{uuid.uuid4().hex[:10]}"
    name = subject.replace(".", "_")
    spec = {"kind": "nats", "url": NATS_URL, "stream": subject, "events": "payment",
            "group": "kairos-test"}  # fmt: skip

    async def reads() -> list[int]:
        connection = await nats.connect(NATS_URL)
        js = connection.jetstream()
        await js.add_stream(name=name, subjects=[subject])
        stream = stream_from_config("payments", spec)
        try:
            return [len(await stream.read(500, timeout=0.005)) for _ in range(300)]
        finally:
            await stream.close()
            await js.delete_stream(name)
            await connection.close()

    assert asyncio.run(reads()) == [0] * 300


def nats_stream_of(subject: str, **extra: Any) -> Any:
    spec = {"kind": "nats", "url": NATS_URL, "stream": subject, "events": "payment",
            "group": "kairos-test", "claim_after": 1, **extra}  # fmt: skip
    return stream_from_config("payments", spec)


async def read_until(stream: Any, wanted: int, count: int, timeout: float) -> list[str]:
    """Message ids read (and acknowledged) until `wanted` came or three reads found none."""
    ids: list[str] = []
    empty = 0
    while len(ids) < wanted and empty < 3:
        messages = await stream.read(count, timeout=timeout)
        await stream.ack(messages)
        ids += [message.id for message in messages]
        empty = 0 if messages else empty + 1
    return ids


def test_a_nats_batch_not_acknowledged_is_read_again() -> None:
    """A consumer that read a batch and stopped before writing it (killed) acknowledged
    nothing: after the ack wait (`claim_after`) the next one reads the same messages; reads
    of fewer than a pull delivered leave the rest to the next read, nothing twice."""
    nats = pytest.importorskip("nats")
    need_nats()
    subject = f"kairos.test.{uuid.uuid4().hex[:10]}"
    name = subject.replace(".", "_")

    async def run() -> tuple[list[str], list[str], int | None, int]:
        connection = await nats.connect(NATS_URL)
        js = connection.jetstream()
        await js.add_stream(name=name, subjects=[subject])
        try:
            for i in range(12):
                await js.publish(subject, json.dumps(event(i)).encode())
            first = nats_stream_of(subject)
            taken = [message.id for message in await first.read(5, timeout=2.0)]
            await first.close()  # never acknowledged
            second = nats_stream_of(subject)
            try:
                ids = await read_until(second, 12, count=3, timeout=2.0)
                lag = await second.lag()
            finally:
                await second.close()
            info = await js.consumer_info(name, "kairos-test")
            return taken, ids, lag, info.num_ack_pending
        finally:
            await js.delete_stream(name)
            await connection.close()

    taken, ids, lag, unacknowledged = asyncio.run(run())
    assert taken == ["1", "2", "3", "4", "5"]
    assert sorted(ids, key=int) == [str(i) for i in range(1, 13)]  # each once
    assert ids[:7] == [str(i) for i in range(6, 13)]  # the new ones first, then the five again
    assert (lag, unacknowledged) == (0, 0)


def test_a_nats_read_with_max_ack_pending_reached_is_empty_then_gets_the_redelivered() -> None:
    """At max ack pending (4 batches taken, none acknowledged) JetStream answers a pull with
    nothing: the read is empty, not an error, and once the ack wait passes the messages come
    again to the next reads."""
    nats = pytest.importorskip("nats")
    need_nats()
    subject = f"kairos.test.{uuid.uuid4().hex[:10]}"
    name = subject.replace(".", "_")

    async def run() -> tuple[int, int, list[str]]:
        connection = await nats.connect(NATS_URL)
        js = connection.jetstream()
        await js.add_stream(name=name, subjects=[subject])
        stream = nats_stream_of(subject, batch=2, claim_after=2)  # max ack pending 8
        try:
            for i in range(10):
                await js.publish(subject, json.dumps(event(i)).encode())
            held = 0
            for _ in range(4):
                held += len(await stream.read(2, timeout=2.0))  # never acknowledged
            at_limit = len(await stream.read(2, timeout=0.2))  # over before the ack wait
            ids = await read_until(stream, 10, count=2, timeout=2.0)
            return held, at_limit, ids
        finally:
            await stream.close()
            await js.delete_stream(name)
            await connection.close()

    held, at_limit, ids = asyncio.run(run())
    assert (held, at_limit) == (8, 0)
    assert sorted(set(ids), key=int) == [str(i) for i in range(1, 11)]


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"kind": "pulsar", "url": "x", "stream": "s", "events": "payment"}, "kind"),
        ({"kind": "redis", "url": REDIS_URL, "stream": "s"}, "events is required"),
        ({"kind": "redis", "url": REDIS_URL, "stream": "s", "events": "p", "colour": 1}, "colour"),
        ({"kind": "redis", "url": REDIS_URL, "stream": "s", "events": "p", "batch": 0}, "batch"),
        ({"kind": "redis", "url": REDIS_URL, "stream": "s", "events": "p", "map": "x"}, "map"),
    ],
)
def test_a_bad_streams_entry_is_a_project_error_naming_the_key(
    tmp_path: Path, entry: dict[str, Any], message: str
) -> None:
    (tmp_path / "kairos.yaml").write_text(json.dumps({"streams": {"payments": entry}}))
    with pytest.raises(ProjectError, match=message):
        Config.load(tmp_path)


def test_a_stream_feeding_a_class_that_takes_no_events_names_those_that_do(
    tmp_path: Path,
) -> None:
    spec = {"kind": "redis", "url": REDIS_URL, "stream": "s", "events": "payer"}
    with (
        client_for(tmp_path, {"payments": spec}) as client,
        pytest.raises(ProjectError, match="events classes: payment"),
    ):
        consumers_for(client)


def test_kairos_serve_consumes_its_streams_and_reports_them_on_metrics_and_live(
    tmp_path: Path, stream_key: str, r: redis.Redis
) -> None:
    for i in range(10):
        r.xadd(stream_key, {"data": json.dumps(event(i))})
    r.xadd(stream_key, {"data": b"poison"})
    spec = {"kind": "redis", "url": REDIS_URL, "stream": stream_key, "events": "payment"}
    with client_for(tmp_path, {"payments": spec}) as client:
        body = {"inputs": {"payer.id": "p1"}, "outputs": ["payer.paid[7d]"],
                "now": T0.isoformat()}  # fmt: skip
        # the app's lifespan runs the consumer; the dashboard answers localhost only
        with TestClient(create_app(client), base_url="http://localhost") as http:
            deadline = time.monotonic() + 20
            while True:
                value = http.post("/v1/query/online", json=body).json()["values"]
                row = cells(http.get("/ui/live").text, '<td class="mono">payments</td>')
                if value["payer.paid[7d]"] == 10 and row[2] == "11":
                    break
                if time.monotonic() > deadline:
                    break
                time.sleep(0.05)
            metrics = http.get("/metrics").text
    assert value["payer.paid[7d]"] == 10
    assert 'kairos_stream_events_total{stream="payments"} 10.0' in metrics
    assert 'kairos_stream_dead_letters_total{stream="payments"} 1.0' in metrics
    assert 'kairos_stream_messages_total{stream="payments"} 11.0' in metrics
    # the dashboard's Live page: stream, lag, messages, events, skipped, dead letters, failed
    assert row[:7] == ["payments", "0", "11", "10", "0", "1", "0"]


@pytest.fixture(scope="module")
def kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with kafka_broker(tmp_path_factory.mktemp("kafka")) as url:
        yield url


def test_kafka_events_reach_the_windows_once_and_offsets_follow_the_writes(
    tmp_path: Path, kafka: str
) -> None:
    topic = f"kairos-test-{uuid.uuid4().hex[:8]}"
    servers = kafka.removeprefix("kafka://")

    async def publish() -> None:
        producer = AIOKafkaProducer(bootstrap_servers=servers)
        await producer.start()
        for i in range(30):
            await producer.send_and_wait(topic, json.dumps(event(i)).encode())
        await producer.send_and_wait(topic, json.dumps(event(7)).encode())
        await producer.send_and_wait(topic, b"not json")
        await producer.stop()

    async def dead_letters() -> list[Any]:
        consumer = AIOKafkaConsumer(f"{topic}.dead", bootstrap_servers=servers,
                                    auto_offset_reset="earliest", group_id="reader")  # fmt: skip
        await consumer.start()
        try:
            got = await consumer.getmany(timeout_ms=3000)
        finally:
            await consumer.stop()
        return [record for records in got.values() for record in records]

    asyncio.run(publish())
    spec = {"kind": "kafka", "url": kafka, "stream": topic, "events": "payment", "batch": 8}
    with client_for(tmp_path, {"payments": spec}) as client:
        [consumer] = consumers_for(client)
        assert asyncio.run(drained(consumer)) == 32
        assert paid(client) == 30
        assert (consumer.stats.events, consumer.stats.dead) == (31, 1)
        [again] = consumers_for(client)  # the group's offsets are committed: nothing left
        assert asyncio.run(drained(again)) == 0
    [dead] = asyncio.run(dead_letters())
    assert dead.value == b"not json"
    assert b"JSONDecodeError" in dict(dead.headers)["kairos-reason"]


def test_a_kafka_batch_not_acknowledged_is_read_again(tmp_path: Path, kafka: str) -> None:
    """A consumer that read a batch and stopped before writing it (killed) has committed
    nothing: the next one reads the same messages."""
    topic = f"kairos-test-{uuid.uuid4().hex[:8]}"

    async def publish() -> None:
        producer = AIOKafkaProducer(bootstrap_servers=kafka.removeprefix("kafka://"))
        await producer.start()
        for i in range(12):
            await producer.send_and_wait(topic, json.dumps(event(i)).encode())
        await producer.stop()

    async def read_and_stop(stream: Any) -> int:
        try:
            return len(await stream.read(5, timeout=5.0))  # taken, never acknowledged
        finally:
            await stream.close()

    asyncio.run(publish())
    spec = {"kind": "kafka", "url": kafka, "stream": topic, "events": "payment", "batch": 5}
    with client_for(tmp_path, {"payments": spec}) as client:
        [first] = consumers_for(client)
        assert asyncio.run(read_and_stop(first.stream)) == 5
        [second] = consumers_for(client)
        assert asyncio.run(drained(second)) == 12
        assert paid(client) == 12


def test_a_failing_store_leaves_the_batch_unacknowledged_and_it_is_read_again(
    tmp_path: Path, stream_key: str, r: redis.Redis
) -> None:
    """The offline store is a PostgreSQL nobody listens on: every batch fails, the consumer
    counts the errors and backs off, and acknowledges nothing; the same consumer started on a
    store that works reads the batch it was given and writes it."""
    for i in range(5):
        r.xadd(stream_key, {"data": json.dumps(event(i))})
    spec = {"kind": "redis", "url": REDIS_URL, "stream": stream_key, "events": "payment"}
    down = "postgresql://postgres@127.0.0.1:1/test"

    async def run_briefly(consumer: Any) -> None:
        stop = asyncio.Event()
        running = asyncio.ensure_future(consumer.run(stop, idle=0.1))
        await asyncio.sleep(1.0)
        stop.set()
        await running
        await consumer.close()

    with client_for(tmp_path / "a", {"payments": spec}, offline=down) as failing:
        [consumer] = consumers_for(failing)
        asyncio.run(run_briefly(consumer))
        assert consumer.stats.errors >= 2 and consumer.stats.events == 0
        assert consumer.stats.last_error
    assert r.xpending(stream_key, "kairos")["pending"] == 5  # delivered, none acknowledged
    with client_for(tmp_path / "b", {"payments": spec}) as working:
        [consumer] = consumers_for(working)
        assert asyncio.run(drained(consumer)) == 5
        assert paid(working) == 5
    assert r.xpending(stream_key, "kairos")["pending"] == 0


def test_kairos_consume_stops_on_sigterm_after_the_batch_in_hand(
    tmp_path: Path, stream_key: str, r: redis.Redis
) -> None:
    folder = tmp_path / "project"
    folder.mkdir()
    (folder / "features.py").write_text(
        textwrap.dedent("""
        from kairos import FeatureTime, features

        @features(events=True)
        class Payment:
            id: str
            amount: float
            at: FeatureTime
    """)
    )
    (folder / "kairos.yaml").write_text(json.dumps({
        "query_log": "none://",
        "streams": {"payments": {"kind": "redis", "url": REDIS_URL, "stream": stream_key,
                                 "events": "payment"}},
    }))  # fmt: skip
    log_path = tmp_path / "consume.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "kairos.cli", "consume", "--project", str(folder)],
            cwd=folder, stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
        deadline = time.monotonic() + 60
        while "kairos" not in groups(r, stream_key) and time.monotonic() < deadline:
            time.sleep(0.05)  # the consumer made its group: it is reading
        r.xadd(stream_key, {"data": json.dumps({"id": "e1", "amount": 1.0,
                                                 "at": T0.isoformat()})})  # fmt: skip
        while r.xpending(stream_key, "kairos")["pending"] or not int(
            groups(r, stream_key)["kairos"]["entries-read"] or 0
        ):
            if time.monotonic() > deadline:
                break
            time.sleep(0.05)
        process.send_signal(signal.SIGTERM)
        code = process.wait(30)
    assert code == 0, log_path.read_text()
    assert "consuming payments" in log_path.read_text()
    assert r.xpending(stream_key, "kairos")["pending"] == 0
