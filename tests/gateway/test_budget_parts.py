"""Budgets bound every input part (images by the provider's worst case, tool definitions; files
refused), settling never charges past the hold, cached input is billed at its own price, and
`n` answers are held and billed n times."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import sqlite3
import struct
import zlib
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
import psycopg.sql
import pytest

from kairos.gateway import BudgetExceeded, Gateway
from kairos.gateway.accounting.accountant import (
    TOOL_TOKENS,
    TOOLS_PROMPT_TOKENS,
    Usage,
    input_bound,
)
from kairos.gateway.accounting.ledger import LedgerRow, summarize
from kairos.gateway.errors import InvalidRequest
from kairos.gateway.providers.anthropic import usage_as_anthropic, usage_as_openai
from kairos.gateway.providers.base import openai_usage
from kairos.gateway.store import registry_from_url
from kairos.gateway.wire.openai import input_parts
from kairos.gateway.wire.responses import response_usage
from tests.gateway.conftest import PG_URL, config, deployment
from tests.gateway.fake_upstream import TOKENS_IN, FakeUpstream

HI = [{"role": "user", "content": "hi"}]


def png(width: int, height: int) -> bytes:
    """A black 1-bit PNG of that size (a real one: what a client would send)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        crc = struct.pack(">I", zlib.crc32(kind + data))
        return struct.pack(">I", len(data)) + kind + data + crc

    rows = (b"\x00" + b"\x00" * ((width + 7) // 8)) * height
    header = struct.pack(">IIBBBBB", width, height, 1, 0, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows))
        + chunk(b"IEND", b"")
    )  # fmt: skip


WIDE = "data:image/png;base64," + base64.b64encode(png(2048, 768)).decode()


def image(url: str, detail: str | None = None) -> dict[str, Any]:
    part: dict[str, Any] = {"url": url}
    if detail:
        part["detail"] = detail
    return {"type": "image_url", "image_url": part}


def asking(*parts: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"role": "user", "content": [{"type": "text", "text": "what is this?"}, *parts]}]


# what a call of each kind is billed for its images, by OpenAI's formula on gpt-4o: 2048 x 768
# is 4 x 2 tiles (85 + 8 x 170); an image by URL is 4096 x 1536, scaled to the same; low: 85
CALLS = [
    (asking(image("https://example.com/cat.png")), 1445),
    (asking(image(WIDE)), 1445),
    (asking(image("https://example.com/a.png"), image(WIDE, "low")), 1445 + 85),
]


def gateway_for(upstream: FakeUpstream, tmp_path: Path, **extra: Any) -> Gateway:
    models = {
        "vision": {"deployments": [deployment("gpt-4o")]},  # the fake answers it like echo
        "chat": {"deployments": [deployment("echo")]},
        "overreport": {"deployments": [deployment("overreport")]},
        "cached": {"deployments": [deployment(
            "cached", price={"input": "2.50", "output": "10.00", "cached_input": "1.25"}
        )]},
        "claude": {"deployments": [{**deployment("claude-cached"), "provider": "claude", "price": {
            "input": "3.00", "output": "15.00", "cached_input": "0.30", "cache_write": "3.75",
            "cache_write_1h": "6.00",
        }}]},
    }  # fmt: skip
    return Gateway(config(upstream, tmp_path, models=models, **extra))


@pytest.mark.slow
def test_200_concurrent_calls_with_images_never_pass_the_budget(
    upstream: FakeUpstream, tmp_path: Path, counters_url: str
) -> None:
    """The fake provider bills each image as OpenAI does (1,445 tokens for a high-detail
    2048 x 768 one, or one sent by URL, whose bytes say nothing of its size); the budget of
    10,000 tokens and 10,000 micro-dollars is never passed, in the counters or the ledger."""
    limit = 10_000
    upstream.keep_log = False

    async def scenario() -> tuple[list[str], list[int], list[LedgerRow]]:
        gateway = gateway_for(upstream, tmp_path, counters=counters_url)
        _, key = await gateway.create_key(
            name="vision", budgets=[{"period": "total", "usd_micros": limit, "tokens": limit}]
        )

        async def one(index: int) -> str:
            messages, _ = CALLS[index % len(CALLS)]
            try:
                await gateway.chat(key, {"model": "vision", "messages": messages, "max_tokens": 5})
            except BudgetExceeded:
                return "refused"
            return "ok"

        try:
            outcomes = list(await asyncio.gather(*(one(i) for i in range(200))))
            # what the burst's holds left unused is free again: spend it one call at a time
            index = 0
            while outcomes[-1] == "ok" or index == 0:
                await gateway.drain()
                outcomes.append(await one(index))
                index += 1
            await gateway.drain()
            spent = await gateway.counters.spent(
                [f"{key.id}:usd:total:all", f"{key.id}:tok:total:all"]
            )
            rows = await gateway.usage(key.id)
            return outcomes, spent, rows
        finally:
            await gateway.close()

    try:
        outcomes, (usd, tokens), rows = asyncio.run(scenario())
    finally:
        upstream.keep_log = True
    served = [row for row in rows if row.status == "ok"]
    assert len(served) == outcomes.count("ok") >= 5
    assert outcomes.count("refused") > 0
    assert usd <= limit and tokens <= limit
    assert usd == sum(row.cost_micros for row in rows)  # the ledger shows what was charged
    assert tokens == sum(row.tokens_in + row.tokens_out for row in rows)
    billed = {TOKENS_IN + images for _, images in CALLS}
    assert {row.tokens_in for row in served} <= billed  # the provider's real count, recorded
    assert all(row.uncharged_micros == 0 for row in rows)  # every hold covered its call
    assert tokens > limit - 2 * 1_600  # refused only when the next worst case did not fit


def test_settling_never_charges_past_the_hold(upstream: FakeUpstream, tmp_path: Path) -> None:
    """A provider reporting more input than the hold's bound (here 50,000 cached tokens the
    request could not have had) is charged up to the hold; the rest is in the ledger, as
    uncharged, with the reported tokens."""
    upstream.cache["overreport"] = {"read": 50_000}
    body = {"model": "overreport", "messages": HI, "max_tokens": 5}
    held = (
        input_bound(input_parts(body).text_bytes, 1) + 5
    )  # tokens and micro-dollars (CHEAP prices)

    async def scenario() -> tuple[list[int], LedgerRow]:
        gateway = gateway_for(upstream, tmp_path)
        _, key = await gateway.create_key(
            name="k", budgets=[{"period": "total", "usd_micros": 10**6, "tokens": 10**6}]
        )
        try:
            await gateway.chat(key, body)
            [row] = await gateway.usage(key.id)
            spent = await gateway.counters.spent(
                [f"{key.id}:usd:total:all", f"{key.id}:tok:total:all"]
            )
            return spent, row
        finally:
            await gateway.close()

    spent, row = asyncio.run(scenario())
    assert spent == [held, held]
    assert (row.tokens_in, row.tokens_out, row.tokens_cached) == (TOKENS_IN + 50_000, 5, 50_000)
    assert row.cost_micros == held
    assert row.uncharged_micros == TOKENS_IN + 50_000 + 5 - held
    assert summarize([row])["uncharged_micros"] == row.uncharged_micros  # the usage report


def test_files_are_refused_on_keys_with_token_or_usd_limits(
    upstream: FakeUpstream, tmp_path: Path
) -> None:
    pdf = {"type": "file", "file": {"file_data": "data:application/pdf;base64,JVBERi0=",
                                    "filename": "a.pdf"}}  # fmt: skip
    body = {"model": "chat", "messages": asking(pdf), "max_tokens": 5}

    async def scenario() -> InvalidRequest | None:
        gateway = gateway_for(upstream, tmp_path)
        _, budgeted = await gateway.create_key(
            name="b", budgets=[{"period": "day", "usd_micros": 10**6}]
        )
        _, limited = await gateway.create_key(name="l", tpm=10**6)
        _, free = await gateway.create_key(name="f", rpm=100)
        try:
            await gateway.chat(free, body)  # nothing to bound: it goes
            try:
                await gateway.chat(limited, body)
            except InvalidRequest:
                pass
            else:
                return None
            try:
                await gateway.chat(budgeted, body)
            except InvalidRequest as error:
                return error
            return None
        finally:
            await gateway.close()

    error = asyncio.run(scenario())
    assert error is not None and error.param == "messages[0].content[1]"
    assert "budget" in error.message and "file" in error.message
    assert len(upstream.received) == 1


def test_tool_definitions_are_bounded_with_the_providers_tool_prompt(
    upstream: FakeUpstream, tmp_path: Path
) -> None:
    """The output a budget leaves is what remains after the input bound, tools' framing and
    Anthropic's tool system prompt included."""
    limit = 5_000
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    plain = {"model": "chat", "messages": HI, "max_tokens": 10**5}
    tools = {**plain, "tools": [tool, tool]}

    async def scenario() -> None:
        gateway = gateway_for(upstream, tmp_path, budget_shares=0)
        try:
            for body in (plain, tools):
                _, key = await gateway.create_key(
                    name="t", budgets=[{"period": "total", "tokens": limit}]
                )
                await gateway.chat(key, body)
        finally:
            await gateway.close()

    asyncio.run(scenario())
    sent = [b.get("max_completion_tokens") or b.get("max_tokens") for b in upstream.received]
    text = input_bound(input_parts(plain).text_bytes, 1)
    with_tools = (
        input_bound(input_parts(tools).text_bytes, 1) + TOOLS_PROMPT_TOKENS + 2 * TOOL_TOKENS
    )
    assert sent == [limit - text, limit - with_tools]


def test_cached_input_is_billed_at_the_cached_price(
    upstream: FakeUpstream, tmp_path: Path, registry_url: str
) -> None:
    """OpenAI's cached_tokens (a part of prompt_tokens) at $1.25 per million, the rest at
    $2.50: 10 x 2.50 + 1,500 x 1.25 + 5 x 10.00 = 1,950 micro-dollars, on every registry."""
    upstream.cache["cached"] = {"read": 1_500}
    body = {"model": "cached", "messages": [{"role": "user", "content": "x" * 2_000}],
            "max_tokens": 5}  # fmt: skip

    async def scenario() -> tuple[int, list[LedgerRow]]:
        gateway = gateway_for(upstream, tmp_path, registry=registry_url)
        _, key = await gateway.create_key(name="c", budgets=[{"period": "day", "usd": 1}])
        try:
            await gateway.chat(key, body)
            stream = await gateway.chat(key, {**body, "stream": True})
            async for _ in stream:  # type: ignore[union-attr]
                pass
            rows = await gateway.usage(key.id)
            day = datetime.now(UTC).strftime("%Y-%m-%d")
            [spent] = await gateway.counters.spent([f"{key.id}:usd:day:{day}"])
            return spent, rows
        finally:
            await gateway.close()

    spent, rows = asyncio.run(scenario())
    assert [(r.cost_micros, r.tokens_in, r.tokens_cached) for r in rows] == [
        (1_950, TOKENS_IN + 1_500, 1_500)
    ] * 2
    assert spent == 2 * 1_950


@pytest.mark.parametrize("stream", [False, True])
def test_anthropic_cache_reads_and_writes_are_billed_at_their_prices(
    upstream: FakeUpstream, tmp_path: Path, stream: bool
) -> None:
    """Anthropic's input_tokens leaves the cache out: 10 fresh at $3, 1,000 read at $0.30, 300
    written to the 5-minute cache at $3.75 and 100 to the 1-hour one at $6, 5 out at $15:
    30 + 300 + 1,125 + 600 + 75 = 2,130 micro-dollars."""
    upstream.cache["claude-cached"] = {"read": 1_000, "write": 400, "write_1h": 100}
    body = {"model": "claude", "messages": [{"role": "user", "content": "x" * 2_000}],
            "max_tokens": 5, "stream": stream}  # fmt: skip

    async def scenario() -> LedgerRow:
        gateway = gateway_for(upstream, tmp_path)
        _, key = await gateway.create_key(name="c", budgets=[{"period": "day", "usd": 1}])
        try:
            reply = await gateway.chat(key, body)
            if stream:
                async for _ in reply:  # type: ignore[union-attr]
                    pass
            else:
                assert isinstance(reply, dict)
                assert reply["usage"]["prompt_tokens_details"] == {"cached_tokens": 1_000}
            [row] = await gateway.usage(key.id)
            return row
        finally:
            await gateway.close()

    row = asyncio.run(scenario())
    assert (row.cost_micros, row.tokens_in, row.tokens_cached, row.tokens_cache_write) == (
        2_130, TOKENS_IN + 1_400, 1_000, 400,
    )  # fmt: skip


def test_usage_translates_both_ways_with_the_cache() -> None:
    anthropic = {"input_tokens": 10, "output_tokens": 5, "cache_read_input_tokens": 7,
                 "cache_creation_input_tokens": 3,
                 "cache_creation": {"ephemeral_1h_input_tokens": 2}}  # fmt: skip
    openai = usage_as_openai(anthropic)
    assert openai_usage({"usage": openai}) == Usage(20, 5, cached=7, written=3, written_1h=2)
    assert usage_as_anthropic(openai) == {
        "input_tokens": 10, "output_tokens": 5, "cache_read_input_tokens": 7,
        "cache_creation_input_tokens": 3,
    }  # fmt: skip
    # a part never passes its whole, whatever a provider reports
    wild = {
        "prompt_tokens": 5,
        "completion_tokens": 1,
        "prompt_tokens_details": {"cached_tokens": 9},
    }
    assert openai_usage({"usage": wild}) == Usage(5, 1, cached=5)


_OLD_LEDGER = """
create table {table} (
    request_id text primary key, key_id text not null, route text not null,
    model_requested text not null, model_dispatched text, provider text, deployment text,
    tokens_in bigint not null, tokens_out bigint not null, cost_micros bigint not null,
    price_version text not null, ttft_ms double precision, latency_ms double precision not null,
    status text not null, attempts integer not null, created_at bigint not null
);
insert into {table} values ('old', 'k', 'chat', 'chat', 'chat', 'fake', 'echo', 10, 5, 15,
    'v1', 1.0, 2.0, 'ok', 1, {created});
"""


def test_a_ledger_made_before_the_cache_columns_gains_them(registry_url: str) -> None:
    created = int(datetime.now(UTC).timestamp() * 1_000_000)
    if registry_url.startswith("sqlite"):
        with contextlib.closing(sqlite3.connect(registry_url.removeprefix("sqlite:///"))) as db:
            db.executescript(_OLD_LEDGER.format(table="gateway_ledger", created=created))
    else:
        prefix = registry_url.rpartition("prefix=")[2]
        script = _OLD_LEDGER.format(table=f"{prefix}_ledger", created=created)
        with psycopg.connect(PG_URL, autocommit=True) as connection:
            connection.execute(psycopg.sql.SQL(script))

    async def scenario() -> list[LedgerRow]:
        registry = registry_from_url(registry_url)
        try:
            now = datetime.now(UTC)
            await registry.write_rows([LedgerRow(
                request_id="new", key_id="k", route="chat", model_requested="chat",
                model_dispatched="chat", provider="fake", deployment="echo", tokens_in=1_510,
                tokens_out=5, cost_micros=1_950, price_version="v2", ttft_ms=1.0, latency_ms=2.0,
                status="ok", attempts=1, created_at=now, tokens_cached=1_500,
                tokens_cache_write=0, uncharged_micros=7,
            )])  # fmt: skip
            return await registry.read_rows("k", None, None)
        finally:
            await registry.close()

    old, new = asyncio.run(scenario())
    assert (old.request_id, old.tokens_cached, old.uncharged_micros) == ("old", 0, 0)
    assert (new.tokens_cached, new.tokens_cache_write, new.uncharged_micros) == (1_500, 0, 7)


# --- n answers --------------------------------------------------------------------------------


def test_n_answers_are_held_and_billed_n_times(upstream: FakeUpstream, tmp_path: Path) -> None:
    """n = 3 on a 1,000-token budget: each answer gets a third of the output the budget
    leaves; the provider's usage covers all three, and so does the charge."""
    body = {"model": "chat", "messages": HI, "max_tokens": 10**4, "n": 3}
    bound = input_bound(input_parts(body).text_bytes, 1)

    async def scenario() -> tuple[dict[str, Any], list[dict[str, Any]], list[LedgerRow]]:
        gateway = gateway_for(upstream, tmp_path, budget_shares=0)
        _, key = await gateway.create_key(name="n", budgets=[{"period": "total", "tokens": 1_000}])
        try:
            reply = await gateway.chat(key, body)
            assert isinstance(reply, dict)
            await gateway.drain()  # settled: the next call sees what this one gave back
            stream = await gateway.chat(key, {**body, "n": 2, "stream": True})
            chunks = [chunk async for chunk in stream]  # type: ignore[union-attr]
            return reply, chunks, await gateway.usage(key.id)
        finally:
            await gateway.close()

    reply, chunks, rows = asyncio.run(scenario())
    assert [choice["index"] for choice in reply["choices"]] == [0, 1, 2]
    sent = upstream.received[0]
    assert (sent.get("max_completion_tokens") or sent.get("max_tokens")) == (1_000 - bound) // 3
    assert sent["n"] == 3
    streamed = {choice["index"] for chunk in chunks for choice in chunk.get("choices") or []}
    assert streamed == {0, 1}
    assert [row.tokens_out for row in rows] == [3 * 5, 2 * 5]
    assert all(row.cost_micros == row.tokens_in + row.tokens_out for row in rows)  # CHEAP


def test_n_answers_to_each_prompt_of_a_completion(upstream: FakeUpstream, tmp_path: Path) -> None:
    async def scenario() -> tuple[dict[str, Any], LedgerRow]:
        gateway = gateway_for(upstream, tmp_path)
        _, key = await gateway.create_key(name="n", budgets=[{"period": "total", "tokens": 10**4}])
        body = {"model": "chat", "prompt": ["a", "b"], "max_tokens": 5, "n": 2}
        try:
            reply = await gateway.completion(key, body)
            assert isinstance(reply, dict)
            [row] = await gateway.usage(key.id)
            return reply, row
        finally:
            await gateway.close()

    reply, row = asyncio.run(scenario())
    assert len(reply["choices"]) == 4
    assert row.tokens_out == 4 * 5


@pytest.mark.parametrize("n", [0, -1, 129, 2.5, True, "2"])
def test_a_bad_n_is_a_400_naming_it(upstream: FakeUpstream, tmp_path: Path, n: Any) -> None:
    async def scenario() -> InvalidRequest:
        gateway = gateway_for(upstream, tmp_path)
        _, key = await gateway.create_key(name="n")
        try:
            with pytest.raises(InvalidRequest) as caught:
                await gateway.chat(key, {"model": "chat", "messages": HI, "n": n})
            return caught.value
        finally:
            await gateway.close()

    error = asyncio.run(scenario())
    assert error.param == "n"
    assert not upstream.received


def test_responses_usage_counts_cached_input() -> None:
    reported = {"input_tokens": 100, "output_tokens": 5,
                "input_tokens_details": {"cached_tokens": 60}}  # fmt: skip
    assert response_usage({"usage": reported}) == Usage(100, 5, cached=60)


def wav(byte_rate: int, samples: int = 800) -> dict[str, Any]:
    """An input_audio part: a mono 8-bit WAV whose header claims `byte_rate` bytes a second."""
    fmt = struct.pack("<IHHIIHH", 16, 1, 1, byte_rate, byte_rate, 1, 8)
    data = b"WAVEfmt " + fmt + b"data" + struct.pack("<I", samples) + b"\x80" * samples
    riff = b"RIFF" + struct.pack("<I", len(data)) + data
    return {"type": "input_audio",
            "input_audio": {"data": base64.b64encode(riff).decode(), "format": "wav"}}  # fmt: skip


def test_audio_counts_by_its_bytes_unless_its_length_is_unknown(
    upstream: FakeUpstream, tmp_path: Path
) -> None:
    """A WAV of 8,000 bytes a second is bounded by its bytes (a 0.1 s clip: 1,000 tokens of
    bound for at most 1 billed); one whose header claims 1 byte a second (800 s of audio in
    800 bytes) is refused on a budgeted key."""
    audio = wav(8_000)
    body = {"model": "chat", "messages": asking(audio), "max_tokens": 5}

    async def scenario() -> InvalidRequest:
        gateway = gateway_for(upstream, tmp_path)
        _, key = await gateway.create_key(name="a", budgets=[{"period": "day", "usd": 1}])
        try:
            await gateway.chat(key, body)
            with pytest.raises(InvalidRequest) as caught:
                await gateway.chat(key, {**body, "messages": asking(wav(1))})
            return caught.value
        finally:
            await gateway.close()

    error = asyncio.run(scenario())
    assert error.param == "messages[0].content[1]" and "audio" in error.message
    assert len(upstream.received) == 1
    assert input_parts(body).text_bytes > len(audio["input_audio"]["data"])
