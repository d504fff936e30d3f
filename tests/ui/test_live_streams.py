"""The Live page's streams, end to end: `kairos serve`'s app consumes a real Redis stream
(events and one poison message) and the page shows what the consumer counted and the lag the
broker reports."""

import json
import time
from pathlib import Path

import redis
from starlette.testclient import TestClient

from kairos.server import create_app
from tests.sources.test_streams import REDIS_URL, T0, client_for, event, r, stream_key
from tests.ui.cells import cells

__all__ = ["r", "stream_key"]  # fixtures


def test_live_shows_a_real_streams_messages_dead_letters_and_lag(
    tmp_path: Path, stream_key: str, r: redis.Redis
) -> None:
    for i in range(10):
        r.xadd(stream_key, {"data": json.dumps(event(i))})
    r.xadd(stream_key, {"data": b"poison"})
    spec = {"kind": "redis", "url": REDIS_URL, "stream": stream_key, "events": "payment"}
    with client_for(tmp_path, {"payments": spec}) as client:
        body = {"inputs": {"payer.id": "p1"}, "outputs": ["payer.paid[7d]"],
                "now": T0.isoformat()}  # fmt: skip
        app = create_app(client)
        with TestClient(app, base_url="http://localhost") as http:  # lifespan: the consumer
            deadline = time.monotonic() + 20
            while True:
                row = cells(http.get("/ui/live").text, '<td class="mono">payments</td>')
                if row[2] == "11" or time.monotonic() > deadline:
                    break
                time.sleep(0.05)
            value = http.post("/v1/query/online", json=body).json()["values"]
    # stream, lag, messages, events, skipped, dead letters, failed batches
    assert row[:7] == ["payments", "0", "11", "10", "0", "1", "0"]
    assert value["payer.paid[7d]"] == 10
