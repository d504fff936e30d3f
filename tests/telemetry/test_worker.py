"""kairos' LLM worker (a real subprocess, a tiny random model) continues the `traceparent` the
gateway sends it, exporting its own span over OTLP when its environment asks for traces."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest

from tests.serving.conftest import running_worker
from tests.serving.tiny_gguf import write_tiny_gguf
from tests.telemetry.conftest import Collector

TRACE_ID = "0af7651916cd43dd8448eb211c80319c"
PARENT_ID = "b7ad6b7169203331"


def test_the_worker_continues_an_incoming_traceparent(
    collector: Collector, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = write_tiny_gguf(tmp_path / "tiny.gguf")
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "otlp")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", collector.url)
    monkeypatch.setenv("OTEL_SERVICE_NAME", "llm-worker")
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "50")  # ms between the worker's exports
    monkeypatch.delenv("OTEL_SDK_DISABLED", raising=False)
    with running_worker(model, "--ctx", "256") as url:
        body = {"model": "tiny", "prompt": "Hello", "max_tokens": 2, "temperature": 0}
        headers = {"traceparent": f"00-{TRACE_ID}-{PARENT_ID}-01"}
        answer = httpx.post(url + "/v1/completions", json=body, headers=headers, timeout=30)
        assert answer.status_code == 200, answer.text
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            served = [s for s in collector.spans() if s.name == "POST /v1/completions"]
            if served:
                break
            time.sleep(0.05)
    [span] = served
    assert span.trace_id.hex() == TRACE_ID
    assert span.parent_span_id.hex() == PARENT_ID
    attributes = {a.key: a.value for a in span.attributes}
    assert attributes["http.response.status_code"].int_value == 200
