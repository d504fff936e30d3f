"""The gateway's app writes one access line per request (logger kairos.access), unrouted ones
too: method, path, status, duration; never the key, a header or the body."""

import logging

import httpx
import pytest

from tests.gateway.conftest import new_key
from tests.gateway.fake_upstream import ServerThread


def test_each_request_is_one_line_without_its_key(
    served: ServerThread, caplog: pytest.LogCaptureFixture
) -> None:
    key = new_key(served)
    with caplog.at_level(logging.INFO, logger="kairos.access"):
        reply = httpx.post(
            f"{served.url}/v1/chat/completions?api_key={key}",
            json={"model": "chat", "messages": [{"role": "user", "content": "a secret prompt"}]},
            headers={"Authorization": f"Bearer {key}"},
        )
        assert reply.status_code == 200, reply.text
        assert httpx.get(f"{served.url}/no/such/route").status_code == 404
        assert httpx.delete(f"{served.url}/v1/models").status_code == 405
        refused = httpx.get(f"{served.url}/v1/models", headers={"Authorization": "Bearer bad"})
        assert refused.status_code == 401
    records = [r for r in caplog.records if r.name == "kairos.access"]
    seen = [(r.method, r.path, r.status) for r in records]  # type: ignore[attr-defined]
    assert seen == [
        ("POST", "/v1/chat/completions", 200),
        ("GET", "/no/such/route", 404),
        ("DELETE", "/v1/models", 405),
        ("GET", "/v1/models", 401),
    ]
    assert all(r.duration_ms >= 0 and r.query_id is None for r in records)  # type: ignore[attr-defined]
    for record in records:
        text = record.getMessage() + repr(vars(record))
        assert key not in text and "secret prompt" not in text and "Bearer" not in text
