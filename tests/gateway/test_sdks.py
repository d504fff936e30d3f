"""The official `openai` and `anthropic` SDKs, unchanged, against the gateway over HTTP."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest

from kairos.gateway import Gateway
from kairos.gateway.app import create_gateway_app
from tests.gateway.conftest import PROVIDER_SECRET, closed_after_test, config, ledger, new_key
from tests.gateway.fake_upstream import TOKENS_IN, FakeUpstream, ServerThread


def client(served: ServerThread, key: str) -> openai.OpenAI:
    return closed_after_test(openai.OpenAI(base_url=f"{served.url}/v1", api_key=key, max_retries=0))


def test_chat_completion(served: ServerThread, upstream: FakeUpstream) -> None:
    sdk = client(served, new_key(served))
    reply = sdk.chat.completions.create(
        model="chat", messages=[{"role": "user", "content": "hi"}], max_tokens=3
    )
    assert reply.choices[0].message.content == "tok tok tok "
    assert reply.usage is not None and reply.usage.completion_tokens == 3
    sent = upstream.received[-1]
    assert sent["model"] == "echo" and sent["max_tokens"] == 3
    # the provider's credential is sent upstream, server-side only
    assert upstream.headers[-1]["authorization"] == f"Bearer {PROVIDER_SECRET}"
    [row] = ledger(served)
    assert (row["tokens_in"], row["tokens_out"], row["cost_micros"]) == (TOKENS_IN, 3, 13)
    assert row["model_requested"] == "chat" and row["provider"] == "fake"
    assert row["status"] == "ok" and row["route"] == "chat"
    metrics = httpx.get(f"{served.url}/metrics").text
    assert 'kairos_gateway_cost_micros_total{model="chat"} 13.0' in metrics
    assert 'kairos_gateway_tokens_total{direction="out",model="chat"} 3.0' in metrics
    assert 'kairos_gateway_calls_total{model="chat",provider="fake",status="ok"} 1.0' in metrics


def test_streaming_with_usage(served: ServerThread, upstream: FakeUpstream) -> None:
    sdk = client(served, new_key(served))
    chunks = list(
        sdk.chat.completions.create(
            model="chat",
            messages=[{"role": "user", "content": "hi"}],
            max_tokens=4,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "tok " * 4
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert (chunks[-1].usage.prompt_tokens, chunks[-1].usage.completion_tokens) == (TOKENS_IN, 4)
    [row] = ledger(served)
    assert (row["tokens_out"], row["cost_micros"], row["status"]) == (4, 14, "ok")
    assert row["ttft_ms"] is not None


def test_streaming_without_usage_is_still_billed(
    served: ServerThread, upstream: FakeUpstream
) -> None:
    sdk = client(served, new_key(served))
    chunks = list(
        sdk.chat.completions.create(
            model="chat", messages=[{"role": "user", "content": "hi"}], max_tokens=2, stream=True
        )
    )
    assert all(c.usage is None for c in chunks)  # the client did not ask for it
    assert upstream.received[-1]["stream_options"] == {"include_usage": True}
    [row] = ledger(served)
    assert (row["tokens_in"], row["tokens_out"], row["cost_micros"]) == (TOKENS_IN, 2, 12)


def test_completions_embeddings_and_models(served: ServerThread) -> None:
    sdk = client(served, new_key(served, models=["chat", "claude"]))
    completion = sdk.completions.create(model="chat", prompt="say", max_tokens=2)
    assert completion.choices[0].text == "tok tok "
    embedding = sdk.embeddings.create(model="chat", input=["a", "b"])
    assert len(embedding.data) == 2
    assert sorted(m.id for m in sdk.models.list()) == ["chat", "claude"]
    routes = sorted(str(r["route"]) for r in ledger(served))
    assert routes == ["completion", "embedding"]
    assert all(int(str(r["cost_micros"])) > 0 for r in ledger(served))


def test_anthropic_sdk_on_messages(served: ServerThread, upstream: FakeUpstream) -> None:
    sdk = closed_after_test(
        anthropic.Anthropic(base_url=served.url, api_key=new_key(served), max_retries=0)
    )
    for model in ("chat", "claude"):  # an OpenAI-compatible and an Anthropic deployment
        message = sdk.messages.create(
            model=model,
            max_tokens=3,
            system="be brief",
            messages=[{"role": "user", "content": "hi"}],
        )
        assert message.content[0].text == "tok tok tok "  # type: ignore[union-attr]
        assert (message.usage.input_tokens, message.usage.output_tokens) == (TOKENS_IN, 3)
    anthropic_request = upstream.received[-1]
    assert anthropic_request["system"] == "be brief" and anthropic_request["max_tokens"] == 3
    assert upstream.headers[-1]["x-api-key"] == PROVIDER_SECRET
    with sdk.messages.stream(
        model="claude", max_tokens=4, messages=[{"role": "user", "content": "hi"}]
    ) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == "tok " * 4
    assert final.usage.output_tokens == 4
    rows = ledger(served)
    assert [r["route"] for r in rows] == ["messages"] * 3
    assert rows[-1]["tokens_out"] == 4 and rows[-1]["cost_micros"] == TOKENS_IN + 4


def test_openai_chat_through_an_anthropic_deployment_streams(served: ServerThread) -> None:
    sdk = client(served, new_key(served))
    chunks = list(
        sdk.chat.completions.create(
            model="claude",
            messages=[{"role": "system", "content": "s"}, {"role": "user", "content": "hi"}],
            max_tokens=3,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "tok " * 3
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 3


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"messages": [{"role": "user", "content": "x"}]}, "model"),
        ({"model": "chat"}, "messages"),
        ({"model": "chat", "messages": [], "max_tokens": 3}, "messages"),
        ({"model": "chat", "messages": [{"role": "user", "content": "x"}], "max_tokens": 0},
         "max_tokens"),
        ({"model": "chat", "messages": [{"role": "user", "content": "x"}], "stream": "yes"},
         "stream"),
        ({"model": "chat", "messages": [{"role": "user", "content": "x"}], "n": 0}, "n"),
    ],
)  # fmt: skip
def test_bad_requests_get_openai_errors(
    served: ServerThread, body: dict[str, object], param: str
) -> None:
    key = new_key(served)
    response = httpx.post(
        f"{served.url}/v1/chat/completions", json=body, headers={"authorization": f"Bearer {key}"}
    )
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == param and error["type"] == "invalid_request_error"
    assert param in error["message"]


def test_sdk_raises_typed_errors(served: ServerThread) -> None:
    sdk = client(served, new_key(served, models=["chat"]))
    with pytest.raises(openai.BadRequestError) as bad:
        sdk.chat.completions.create(model="chat", messages=[], max_tokens=1)
    assert bad.value.param == "messages"
    with pytest.raises(openai.NotFoundError, match="did you mean 'chat'"):
        sdk.chat.completions.create(model="chatt", messages=[{"role": "user", "content": "x"}])
    with pytest.raises(openai.PermissionDeniedError):
        sdk.chat.completions.create(model="other", messages=[{"role": "user", "content": "x"}])
    with pytest.raises(openai.AuthenticationError):
        client(served, "nope").models.list()


def test_malformed_json_and_unknown_routes(served: ServerThread) -> None:
    key = new_key(served)
    headers = {"authorization": f"Bearer {key}", "content-type": "application/json"}
    response = httpx.post(f"{served.url}/v1/chat/completions", content=b"{", headers=headers)
    assert response.status_code == 400 and "not valid JSON" in response.json()["error"]["message"]
    assert httpx.get(f"{served.url}/v1/nothing", headers=headers).status_code == 404
    response = httpx.post(
        f"{served.url}/v1/messages", json={"model": "chat", "messages": []}, headers=headers
    )
    assert response.status_code == 400
    body = response.json()
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    assert "max_tokens" in body["error"]["message"]


def test_usage_by_key_and_period_over_http(served: ServerThread) -> None:
    from tests.gateway.conftest import ADMIN_KEY

    keys = [new_key(served, name=f"k{i}") for i in range(2)]
    for index, key in enumerate(keys):
        with client(served, key) as sdk:
            for _ in range(index + 1):
                sdk.chat.completions.create(
                    model="chat", messages=[{"role": "user", "content": "x"}], max_tokens=1
                )
    admin = {"authorization": f"Bearer {ADMIN_KEY}"}
    second = keys[1].split("-")[1]
    body = httpx.get(f"{served.url}/admin/usage", params={"key": second}, headers=admin).json()
    assert body["requests"] == 2 and body["cost_micros"] == 2 * (TOKENS_IN + 1)
    assert body["by_key_and_model"] == [
        {"key_id": second, "model": "chat", "requests": 2, "tokens_in": 20, "tokens_out": 2,
         "cost_micros": 22}
    ]  # fmt: skip
    future = httpx.get(
        f"{served.url}/admin/usage", params={"since": "2999-01-01"}, headers=admin
    ).json()
    assert future["requests"] == 0
    bad = httpx.get(f"{served.url}/admin/usage", params={"since": "soon"}, headers=admin)
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "since"


def test_the_app_is_plain_asgi_uvicorn_serves_it_alike(
    upstream: FakeUpstream, tmp_path: Path
) -> None:
    """`kairos gateway serve` runs kairos' own HTTP server; the app is ASGI, so uvicorn (or any
    ASGI server) serves the same answers."""
    gateway = Gateway(config(upstream, tmp_path))
    with ServerThread(create_gateway_app(gateway)) as server:  # uvicorn
        server.gateway = gateway  # type: ignore[attr-defined]
        sdk = client(server, new_key(server))
        messages: list[Any] = [{"role": "user", "content": "hi"}]
        reply = sdk.chat.completions.create(model="chat", messages=messages, max_tokens=3)
        assert reply.choices[0].message.content == "tok tok tok "
        chunks = list(
            sdk.chat.completions.create(model="chat", messages=messages, max_tokens=2, stream=True)
        )
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "tok tok "
        assert httpx.get(f"{server.url}/v1/nothing").status_code == 404
        assert [row["status"] for row in ledger(server)] == ["ok", "ok"]
        server.call(gateway.close())
