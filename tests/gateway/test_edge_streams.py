"""The gateway's edge, for streams and errors: a provider that quotes the key it was sent
(mid-stream, or in an error page cut at 200 bytes) never gets it to the client, a log line
or the ledger; a stream that ends without its terminal event (`data: [DONE]`, `message_stop`),
whether its body was well framed, close-delimited or dropped mid-chunk, reaches the client as
an in-band error and the ledger as a failure, on every route and provider."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from kairos.gateway import Gateway, GatewayConfig
from kairos.gateway.app import create_gateway_app
from kairos.gateway.providers.scrub import Secrets
from tests.gateway.conftest import (
    ADMIN_KEY,
    ENVIRON,
    PROVIDER_SECRET,
    config,
    deployment,
    new_key,
    rows_when,
    stream_in_process,
)
from tests.gateway.fake_upstream import FakeUpstream, ServerThread, close_delimited

HI = [{"role": "user", "content": "hi"}]
HEAD = PROVIDER_SECRET[:8]  # a piece this long from the key's start is already a leak
MODES = ("broken", "page", "truncated", "cut")


@pytest.fixture(scope="module")
def closing_url(upstream: FakeUpstream) -> Iterator[str]:
    """The fake provider again, its bodies close-delimited (served on a loop of its own)."""
    with ServerThread(upstream.app()) as host:
        server, url = host.call(close_delimited(upstream.app()))
        yield url
        assert host.loop is not None
        host.loop.call_soon_threadsafe(server.close)  # on its own loop, before that stops


def gateway_config(upstream: FakeUpstream, closing_url: str, tmp_path: Path) -> Any:
    url = upstream.url  # type: ignore[attr-defined]
    providers = {
        "fake": {"kind": "openai", "base_url": f"{url}/v1", "api_key_env": "FAKE_KEY"},
        "claude": {"kind": "anthropic", "base_url": url, "api_key_env": "FAKE_KEY"},
        "fake10": {"kind": "openai", "base_url": f"{closing_url}/v1", "api_key_env": "FAKE_KEY"},
        "claude10": {"kind": "anthropic", "base_url": closing_url, "api_key_env": "FAKE_KEY"},
    }
    models: dict[str, Any] = {}
    for provider in providers:
        for mode in MODES:
            models[f"{provider}-{mode}"] = {
                "deployments": [{**deployment(mode), "provider": provider}]
            }
    return config(upstream, tmp_path, models=models, providers=providers)


@pytest.fixture
def edge(upstream: FakeUpstream, closing_url: str, tmp_path: Path) -> Iterator[ServerThread]:
    gateway = Gateway(gateway_config(upstream, closing_url, tmp_path))
    with ServerThread(create_gateway_app(gateway), kairos=True) as server:
        server.gateway = gateway  # type: ignore[attr-defined]
        yield server
        server.call(gateway.close())


def call(server: ServerThread, route: str, model: str, *, stream: bool = True) -> bytes:
    """The raw bytes of the answer to one call on `route` (chat, completions or messages)."""
    body: dict[str, Any] = {"model": model, "max_tokens": 5, "stream": stream}
    body.update({"prompt": "hi"} if route == "completions" else {"messages": HI})
    path = {"chat": "/v1/chat/completions", "completions": "/v1/completions"}.get(
        route, "/v1/messages"
    )
    headers = {"authorization": f"Bearer {new_key(server)}"}
    with httpx.stream("POST", server.url + path, json=body, headers=headers) as response:
        return response.read()


def events(raw: bytes) -> list[tuple[str | None, Any]]:
    """(event name, data) of each frame of an SSE body; `[DONE]` as the string."""
    found = []
    for frame in raw.decode().split("\n\n"):
        name, data = None, None
        for line in frame.splitlines():
            if line.startswith("event: "):
                name = line[7:]
            elif line.startswith("data: "):
                data = line[6:] if line[6:] == "[DONE]" else orjson.loads(line[6:])
        if data is not None:
            found.append((name, data))
    return found


def assert_no_key(*texts: str | bytes) -> None:
    for text in texts:
        seen = text.decode(errors="replace") if isinstance(text, bytes) else text
        assert PROVIDER_SECRET not in seen and HEAD not in seen


# --- credentials never leave ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("route", "model"),
    [
        ("chat", "fake-broken"),  # OpenAI's in-band `{"error": ...}` event
        ("chat", "claude-broken"),  # Anthropic's `event: error`, translated
        ("messages", "fake-broken"),
        ("messages", "claude-broken"),
    ],
)
def test_a_key_quoted_mid_stream_never_leaves(
    edge: ServerThread, caplog: pytest.LogCaptureFixture, route: str, model: str
) -> None:
    caplog.set_level(logging.DEBUG)
    raw = call(edge, route, model)
    found = events(raw)
    name, last = found[-1]
    message = last["error"]["message"]
    assert "scripted overload" in message and "***" in message  # the quote is kept, masked
    assert (name == "error") is (route == "messages")
    assert len(found) > 2  # chunks came first: the failure is mid-stream
    [row] = rows_when(edge, 1)
    assert row.status == "upstream_error"
    assert_no_key(raw, caplog.text, repr(row))


@pytest.mark.parametrize("route", ["chat", "messages"])
@pytest.mark.parametrize("provider", ["fake", "claude"])
@pytest.mark.parametrize("stream", [False, True])
def test_a_key_across_the_cut_of_an_error_page_never_leaves(
    edge: ServerThread,
    caplog: pytest.LogCaptureFixture,
    route: str,
    provider: str,
    stream: bool,
) -> None:
    """The page has 190 bytes, then the key: cut at 200 before scrubbing, its head leaked."""
    caplog.set_level(logging.DEBUG)
    raw = call(edge, route, f"{provider}-page", stream=stream)
    error = orjson.loads(raw)["error"]
    assert error["message"].startswith(f"provider {provider!r} answered 500: <html><body>xxx")
    assert "x***</body>" in error["message"]  # masked, then cut
    [row] = rows_when(edge, 1)
    assert row.status == "upstream_error"
    assert_no_key(raw, caplog.text, repr(row))


def test_every_configured_credential_is_masked_with_its_head(tmp_path: Path) -> None:
    headers = {
        "api-key": "azure-secret-123456",  # a credential header: masked from its head on
        "Authorization": "Bearer tok-abcdefghijkl",  # its token, quoted alone, too
        "OpenAI-Beta": "assistants=v2",  # no credential: "assistant" is in every answer
    }
    raw = {
        "admin_key_env": "GW_ADMIN", "pepper_env": "GW_PEPPER",
        "providers": {
            "a": {"base_url": "http://a/v1", "api_key_env": "FAKE_KEY", "headers": headers},
            "b": {"base_url": "http://b/v1", "api_key_env": "OTHER_KEY"},
            "local": {"base_url": "http://c/v1", "api_key_env": "DUMMY_KEY"},
        },
        "models": {"chat": {"deployments": [{"provider": "a", "model": "m"}]}},
    }  # fmt: skip
    environ = {**ENVIRON, "OTHER_KEY": PROVIDER_SECRET[:12] + "-other", "DUMMY_KEY": "x"}
    secrets = Secrets.of(GatewayConfig.from_mapping(raw, base_dir=tmp_path, environ=environ))
    text = (
        f"1 {PROVIDER_SECRET[:10]}| 2 {PROVIDER_SECRET}zz 3 {PROVIDER_SECRET[:12]}-other"
        f" 4 {PROVIDER_SECRET[:7]} 5 azure-secre 6 tok-abcdefg 7 assistants=v2 8 x"
        f" 9 {ADMIN_KEY} 10 {ADMIN_KEY[:9]} 11 pepper-1"
    )
    assert secrets.scrub(text) == (
        f"1 ***| 2 ***zz 3 *** 4 {PROVIDER_SECRET[:7]} 5 *** 6 *** 7 assistants=v2 8 x"
        f" 9 *** 10 {ADMIN_KEY[:9]} 11 ***"
    )  # the admin key and the pepper are masked whole only: people choose them
    assert secrets.scrub(text.encode()) == secrets.scrub(text).encode()
    assert Secrets([]).scrub(text) == text


# --- truthful streams -----------------------------------------------------------------------

ROUTES = [
    ("chat", "fake"),
    ("completions", "fake"),
    ("chat", "claude"),
    ("messages", "fake"),
    ("messages", "claude"),
]


@pytest.mark.parametrize(("route", "provider"), ROUTES)
@pytest.mark.parametrize(
    ("mode", "status"),
    [
        ("truncated", "upstream_incomplete"),  # well framed, no terminal event
        ("closed", "upstream_incomplete"),  # close-delimited, no terminal event
        ("cut", "upstream_error"),  # the connection dropped mid-chunk
    ],
)
def test_a_stream_cut_short_ends_with_an_error_and_is_no_success(
    edge: ServerThread, route: str, provider: str, mode: str, status: str
) -> None:
    model = f"{provider}10-truncated" if mode == "closed" else f"{provider}-{mode}"
    found = events(call(edge, route, model))
    name, last = found[-1]
    assert last != "[DONE]" and "error" in last, found
    assert "[DONE]" not in [data for _, data in found]
    if route == "messages":
        assert name == "error" and last["type"] == "error"
        assert "message_stop" not in [n for n, _ in found]
    else:
        assert name is None and last["error"]["code"] == status
    text = "".join(
        str(c.get("text") or (c.get("delta") or {}).get("content") or "")
        for _, data in found
        if isinstance(data, dict)
        for c in [*data.get("choices", []), data.get("delta") or {}]
    )
    assert text == "tok tok "  # what came before the cut was passed on
    [row] = rows_when(edge, 1)
    assert row.status == status
    assert row.cost_micros > 10 + 2  # no usage came: the hold is charged in full


@pytest.mark.parametrize("provider", ["fake", "claude", "fake10", "claude10"])
def test_in_process_readers_see_a_stream_cut_short(
    upstream: FakeUpstream, closing_url: str, tmp_path: Path, provider: str
) -> None:
    body = {"model": f"{provider}-truncated", "messages": HI, "max_tokens": 5}
    chunks, rows = stream_in_process(gateway_config(upstream, closing_url, tmp_path), body)
    *before, last = chunks
    assert [c["choices"][0]["delta"].get("content") for c in before if c["choices"]][-2:] == [
        "tok ",
        "tok ",
    ]
    assert last["error"]["code"] == "upstream_incomplete"
    terminal = "message_stop" if provider.startswith("claude") else "[DONE]"
    assert terminal in last["error"]["message"]  # the provider's own terminal event is named
    [row] = rows
    assert row.status == "upstream_incomplete"


def test_a_key_sent_as_a_model_name_is_kept_out_of_the_ledger(
    edge: ServerThread, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    raw = call(edge, "chat", PROVIDER_SECRET, stream=False)
    assert orjson.loads(raw)["error"]["code"] == "model_not_found"
    [row] = rows_when(edge, 1)
    assert row.model_requested == "***"
    assert_no_key(raw, caplog.text, repr(row))
