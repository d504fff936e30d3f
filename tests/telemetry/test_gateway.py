"""Traces across processes' edges, over real HTTP: an LLM feature's gateway call and its
attempts (failover included) under the query's node, with the gen_ai attributes; the
`traceparent` a request brings continued by kairos' server and by the gateway's; and the one
sent to the provider, in the same trace, naming the attempt that sent it."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

import kairos as kr
from kairos import features, online
from kairos.gateway import Gateway, GatewayConfig
from kairos.gateway.app import create_gateway_app
from kairos.server import create_app
from tests.gateway.fake_upstream import TOKENS_IN, FakeUpstream, ServerThread
from tests.telemetry.conftest import children, one, wait_for

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{PARENT_ID}-01"
ANSWER_TOKENS = 3  # max_tokens of the feature: the fake answers that many tokens


@features
class Seller:
    id: str
    name: str
    review: str = kr.completion(
        model="judge", messages=[kr.message("user", "Review {{ name }}")], max_tokens=3
    )


@online
def seller_name(sid: Seller.id) -> Seller.name:
    return f"Seller {sid}"


@pytest.fixture(scope="module")
def upstream() -> Iterator[FakeUpstream]:
    fake = FakeUpstream()
    with ServerThread(fake.app()) as server:
        fake.url = server.url  # type: ignore[attr-defined]
        yield fake


@pytest.fixture(autouse=True)
def _fresh(upstream: FakeUpstream) -> None:
    upstream.received.clear()
    upstream.headers.clear()


def gateway_config(upstream: FakeUpstream, folder: Path) -> GatewayConfig:
    """`judge` fails over from a deployment that answers 500 to one that answers; `steady`
    has only the one that answers."""
    url = upstream.url  # type: ignore[attr-defined]
    return GatewayConfig.from_mapping(
        {
            "pepper_env": "PEPPER",
            "registry": f"sqlite:///{folder / 'gateway.db'}",
            "counters": f"sqlite:///{folder / 'gateway.db'}",
            "providers": {"fake": {"kind": "openai", "base_url": f"{url}/v1"}},
            "models": {
                "judge": {
                    "deployments": [
                        {"provider": "fake", "model": "fail", "priority": 1},
                        {"provider": "fake", "model": "echo", "priority": 2},
                    ]
                },
                "steady": {"deployments": [{"provider": "fake", "model": "echo"}]},
            },
        },
        base_dir=folder,
        environ={"PEPPER": "pepper"},
    )


@pytest.fixture
def client(upstream: FakeUpstream, tmp_path: Path) -> Iterator[kr.Client]:
    gateway = Gateway(gateway_config(upstream, tmp_path))
    plain, _ = asyncio.run(gateway.create_key(name="features", models=["judge"]))
    with kr.Client(
        definitions=[Seller, seller_name],
        query_log="none://",
        offline_store="none://",
        gateway=gateway,
        llm_key=plain,
    ) as client:
        yield client


def traceparents(upstream: FakeUpstream) -> list[tuple[str, str]]:
    """(trace id, parent span id) of the `traceparent` of each request the provider got."""
    found = []
    for headers in upstream.headers:
        version, trace_id, parent_id, flags = headers["traceparent"].split("-")
        assert version == "00" and int(flags, 16) & 1  # sampled
        found.append((trace_id, parent_id))
    return found


def ids(span: ReadableSpan) -> tuple[str, str]:
    context = span.context
    return f"{context.trace_id:032x}", f"{context.span_id:016x}"


def check_answered(span: ReadableSpan, *, attempts: int) -> None:
    attributes: dict[str, Any] = dict(span.attributes or {})
    assert attributes["gen_ai.operation.name"] == "chat"
    assert attributes["gen_ai.response.model"] == "echo"
    assert attributes["gen_ai.usage.input_tokens"] == TOKENS_IN
    assert attributes["gen_ai.usage.output_tokens"] == ANSWER_TOKENS
    assert attributes["gen_ai.server.time_to_first_token"] > 0
    assert attributes["kairos.gateway.provider"] == "fake"
    assert attributes["kairos.gateway.deployment"] == "echo"
    assert attributes["kairos.gateway.attempts"] == attempts
    assert attributes["kairos.gateway.status"] == "ok"
    assert span.status.status_code is StatusCode.OK


def test_an_llm_feature_traces_its_gateway_call_and_both_attempts_of_a_failover(
    client: kr.Client, upstream: FakeUpstream, spans: InMemorySpanExporter
) -> None:
    result = client.query({Seller.id: "s1"}, [Seller.review])
    assert result.errors == []
    assert result.get_value(Seller.review) == "tok " * ANSWER_TOKENS

    query = one(spans, "kairos.query")
    node = one(spans, "kairos.llm seller.review")
    call = one(spans, "chat judge")
    assert node.parent is not None and node.parent.span_id == query.context.span_id
    assert call.parent is not None and call.parent.span_id == node.context.span_id
    assert call.kind is SpanKind.INTERNAL
    assert call.attributes is not None
    assert call.attributes["gen_ai.request.model"] == "judge"
    assert call.attributes["kairos.gateway.route"] == "chat"
    check_answered(call, attempts=2)

    failed, answered = children(spans, call)
    assert [failed.name, answered.name] == ["kairos.gateway.attempt fake"] * 2
    assert failed.kind is answered.kind is SpanKind.CLIENT
    assert failed.attributes is not None
    assert failed.attributes["gen_ai.request.model"] == "fail"
    assert failed.attributes["gen_ai.provider.name"] == "openai"
    assert failed.attributes["kairos.gateway.failover_reason"] == "provider 'fake' answered 500"
    assert failed.attributes["error.type"] == "upstream_error"
    assert failed.status.status_code is StatusCode.ERROR
    check_answered(answered, attempts=2)
    assert answered.attributes is not None and answered.attributes["kairos.gateway.attempt"] == 2
    # every span ends inside its parent's time
    for inner, outer in ((call, node), (failed, call), (answered, call)):
        assert outer.start_time <= inner.start_time <= inner.end_time <= outer.end_time  # type: ignore[operator]

    # each request reached the provider in the query's trace, sent by its own attempt
    trace_id = ids(query)[0]
    assert traceparents(upstream) == [(trace_id, ids(failed)[1]), (trace_id, ids(answered)[1])]


def test_kairos_server_continues_an_incoming_traceparent(
    client: kr.Client, upstream: FakeUpstream, spans: InMemorySpanExporter
) -> None:
    with ServerThread(create_app(client)) as server:
        answer = httpx.post(
            f"{server.url}/v1/query/online",
            json={"inputs": {"seller.id": "s2"}, "outputs": ["seller.review"]},
            headers={"traceparent": TRACEPARENT},
            timeout=30,
        )
        assert answer.status_code == 200, answer.text
        request = wait_for(spans, "POST /v1/query/online")
        server.call(client.aclose())  # its gateway's connections live on the server's loop
    assert answer.json()["values"]["seller.review"] == "tok " * ANSWER_TOKENS

    assert request.kind is SpanKind.SERVER
    assert ids(request)[0] == TRACE_ID
    assert request.parent is not None and f"{request.parent.span_id:016x}" == PARENT_ID
    assert request.attributes is not None
    assert request.attributes["http.route"] == "/v1/query/online"
    assert request.attributes["http.response.status_code"] == 200
    query = one(spans, "kairos.query")
    assert query.parent is not None and query.parent.span_id == request.context.span_id
    assert {ids(s)[0] for s in spans.get_finished_spans()} == {TRACE_ID}
    assert [t for t, _ in traceparents(upstream)] == [TRACE_ID, TRACE_ID]


def test_the_gateway_app_continues_a_traceparent_to_the_provider(
    upstream: FakeUpstream, tmp_path: Path, spans: InMemorySpanExporter
) -> None:
    gateway = Gateway(gateway_config(upstream, tmp_path))
    with ServerThread(create_gateway_app(gateway), kairos=True) as server:
        key, _ = server.call(gateway.create_key(name="app", models=["steady"]))
        body = {"model": "steady", "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": ANSWER_TOKENS}  # fmt: skip
        headers = {"authorization": f"Bearer {key}", "traceparent": TRACEPARENT}
        answer = httpx.post(
            f"{server.url}/v1/chat/completions", json=body, headers=headers, timeout=30
        )
        assert answer.status_code == 200, answer.text
        request = wait_for(spans, "POST /v1/chat/completions")
        refused = httpx.post(
            f"{server.url}/v1/chat/completions",
            json={**body, "model": "nope"},
            headers={"authorization": f"Bearer {key}"},
            timeout=30,
        )
        assert refused.status_code == 404
        server.call(gateway.close())

    assert request.kind is SpanKind.SERVER
    assert ids(request)[0] == TRACE_ID
    assert request.parent is not None and f"{request.parent.span_id:016x}" == PARENT_ID
    assert request.attributes is not None
    assert request.attributes["http.route"] == "/v1/chat/completions"
    assert request.attributes["http.response.status_code"] == 200
    call = one(spans, "chat steady")
    assert call.parent is not None and call.parent.span_id == request.context.span_id
    check_answered(call, attempts=1)
    [attempt] = children(spans, call)
    check_answered(attempt, attempts=1)
    assert traceparents(upstream) == [(TRACE_ID, ids(attempt)[1])]

    # a call the gateway refuses is a failed span naming the error's code, in a trace of its own
    unknown = one(spans, "chat nope")
    assert unknown.status.status_code is StatusCode.ERROR
    assert unknown.attributes is not None and unknown.attributes["error.type"] == "model_not_found"
    assert ids(unknown)[0] != TRACE_ID
