"""Accounting at its edges: a reported usage never gives budget back, two budgets never share
one counter twice, a settle the store refuses shows the full hold, the lease outlives every
attempt, a cap goes in the field the provider reads, and bad limits or stops are a 400."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import yaml

from kairos.cli.main import main
from kairos.gateway import Gateway
from kairos.gateway.accounting.accountant import Accountant, Usage
from kairos.gateway.accounting.prices import Price
from kairos.gateway.errors import GatewayConfigError, InvalidRequest
from kairos.gateway.keys import Budget, KeyRecord, new_key
from kairos.gateway.providers.anthropic import usage_as_openai
from kairos.gateway.providers.base import openai_usage
from kairos.gateway.store import counters_from_url
from kairos.gateway.wire.openai import check_chat, check_completion
from tests.gateway.conftest import ADMIN_KEY, ENVIRON, config, deployment
from tests.gateway.conftest import new_key as served_key
from tests.gateway.fake_upstream import TOKENS_IN, FakeUpstream, ServerThread

HI = [{"role": "user", "content": "hi"}]
ADMIN = {"authorization": f"Bearer {ADMIN_KEY}"}
CHEAP = Price(1_000_000, 1_000_000)  # one micro-dollar per token, in or out


# --- 1. a negative reported usage is read as 0 and never refunds -------------------------


def test_every_reported_count_is_read_within_zero_and_a_bound() -> None:
    usage = openai_usage({"usage": {
        "prompt_tokens": -5_000_000, "completion_tokens": -3,
        "prompt_tokens_details": {"cached_tokens": -7}, "cache_creation_input_tokens": -1,
    }})  # fmt: skip
    assert usage == Usage(0, 0, 0, 0, 0)
    huge = openai_usage({"usage": {"prompt_tokens": 10**30, "completion_tokens": 10**30}})
    assert huge is not None and 0 < huge.input_tokens < 10**30 and huge.output_tokens < 10**30
    assert openai_usage({"usage": {"prompt_tokens": True}}) is None  # not a count: unknown
    # Anthropic's usage, as its translation carries it, is read the same way
    anthropic = usage_as_openai({"input_tokens": -5_000_000, "output_tokens": 3})
    assert openai_usage({"usage": anthropic}) == Usage(0, 3)


def test_a_negative_prompt_count_does_not_refund_the_budget(
    upstream: FakeUpstream, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The provider reports prompt_tokens -5,000,000 (through a negative cache read): the
    counter is charged the output only, never taken below what it held."""
    monkeypatch.setitem(upstream.cache, "echo", {"read": -5_000_000 - TOKENS_IN})

    async def scenario() -> tuple[int, list[int]]:
        gateway = Gateway(config(upstream, tmp_path))
        try:
            _, key = await gateway.create_key(
                name="tiny", budgets=[{"period": "total", "usd_micros": 1_000}]
            )
            await gateway.chat(key, {"model": "chat", "messages": HI, "max_tokens": 5})
            await gateway.drain()
            [spent] = await gateway.counters.spent([f"{key.id}:usd:total:all"])
            rows = await gateway.usage(key.id)
            return spent, [row.cost_micros for row in rows]
        finally:
            await gateway.close()

    spent, costs = asyncio.run(scenario())
    assert spent == 5  # five output tokens; the input read as 0, not -5,000,000
    assert costs == [5]


def test_settling_never_takes_a_counter_below_zero(tmp_path: Path) -> None:
    """Even a Usage built with negative counts (no parser in between) settles to 0 at least."""

    async def scenario() -> list[int]:
        counters = counters_from_url(f"sqlite:///{tmp_path / 'c.db'}")
        accountant = Accountant(counters, lease=60)
        key = _record(Budget("total", 1_000, 1_000))
        try:
            hold = await accountant.hold(key, CHEAP, 20, 10)
            settled = await accountant.settle(hold, Usage(-5_000_000, -5), accepted=True)
            assert settled.cost_micros == 0 and settled.uncharged_micros == 0
            return await counters.spent([f"{key.id}:usd:total:all", f"{key.id}:tok:total:all"])
        finally:
            await counters.close()

    assert asyncio.run(scenario()) == [0, 0]


# --- 2. two budgets of one period and unit ---------------------------------------------


def _record(*budgets: Budget) -> KeyRecord:
    return new_key("pepper-1", name="dup", budgets=budgets)[1]


def test_duplicate_budgets_are_refused_by_the_admin_api(served: ServerThread) -> None:
    body = {"name": "x", "budgets": [{"period": "day", "tokens": 1000},
                                     {"period": "day", "tokens": 5000}]}  # fmt: skip
    response = httpx.post(f"{served.url}/admin/keys", json=body, headers=ADMIN)
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["param"] == "budgets[1]"
    assert "one budget per period and unit" in error["message"]
    assert "keep the lowest" in error["message"]
    # one period, two units; or one unit, two periods: distinct counters, accepted
    for budgets in (
        [{"period": "day", "usd": 1}, {"period": "day", "tokens": 5000}],
        [{"period": "day", "tokens": 1000}, {"period": "month", "tokens": 5000}],
    ):
        ok = httpx.post(f"{served.url}/admin/keys", json={"name": "y", "budgets": budgets},
                        headers=ADMIN)  # fmt: skip
        assert ok.status_code == 201, ok.text


def test_duplicate_budgets_are_refused_by_the_cli(
    upstream: FakeUpstream,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    for name, value in ENVIRON.items():
        monkeypatch.setenv(name, value)
    gateway = {
        "pepper_env": "GW_PEPPER",
        "providers": {"fake": {"kind": "openai", "base_url": f"{upstream.url}/v1"}},  # type: ignore[attr-defined]
        "models": {"chat": {"deployments": [deployment("echo")]}},
    }
    (tmp_path / "kairos.yaml").write_text(yaml.safe_dump({"gateway": gateway}))
    code = main(["gateway", "keys", "create", "--name", "x", "--budget", "day:usd=5",
                 "--budget", "day:usd=2", "--project", str(tmp_path)])  # fmt: skip
    assert code == 2
    err = capsys.readouterr().err
    assert "budgets[1]" in err and "keep the lowest" in err


def test_a_stored_key_with_duplicate_budgets_holds_each_counter_once(
    upstream: FakeUpstream, tmp_path: Path, counters_url: str
) -> None:
    """A record stored before the check: three calls of 15 tokens charge 45, on every
    backend, with the lowest limit holding."""
    record = _record(Budget("total", tokens=1_000), Budget("total", tokens=5_000))

    async def scenario() -> int:
        gateway = Gateway(config(upstream, tmp_path, counters=counters_url))
        try:
            await gateway.start()
            await gateway.registry.put_key(record)
            for _ in range(3):
                await gateway.chat(record, {"model": "chat", "messages": HI, "max_tokens": 5})
                await gateway.drain()
            [spent] = await gateway.counters.spent([f"{record.id}:tok:total:all"])
            return spent
        finally:
            await gateway.close()

    assert asyncio.run(scenario()) == 3 * (TOKENS_IN + 5)


def test_lines_merge_duplicate_budgets_keeping_the_lowest_limit(tmp_path: Path) -> None:
    key = _record(Budget("day", 900, 5_000), Budget("day", 300, 1_000), Budget("month", 50))
    accountant = Accountant(counters_from_url(f"sqlite:///{tmp_path / 'c.db'}"), lease=60)
    lines = accountant.lines(key, CHEAP, 20, 10)
    assert [(line.counter.split(":")[1:3], line.limit, line.amount) for line in lines] == [
        (["usd", "day"], 300, 30),
        (["tok", "day"], 1_000, 30),
        (["usd", "month"], 50, 30),
    ]


# --- 3. a settle the store refuses; the lease outlives every attempt --------------------


def test_a_settle_too_late_reports_the_full_hold(tmp_path: Path) -> None:
    """The hold's lease ran out before its usage arrived: the store keeps the full hold
    charged, and the settlement (so the ledger row) says so instead of the smaller usage."""

    async def scenario() -> None:
        counters = counters_from_url(f"sqlite:///{tmp_path / 'c.db'}")
        # held two minutes ago with a one-minute lease: it has run out
        accountant = Accountant(counters, lease=60, clock=lambda: time.time() - 120)
        key = _record(Budget("total", 10_000))
        try:
            hold = await accountant.hold(key, CHEAP, 20, 10)
            settled = await accountant.settle(hold, Usage(12, 3), accepted=True)
            [spent] = await counters.spent([f"{key.id}:usd:total:all"])
            assert spent == hold.cost == 30
            assert settled.lapsed and settled.cost_micros == spent
            assert (settled.tokens_in, settled.tokens_out) == (20, 10)
            # in time, the usage is what is charged and reported
            accountant.clock = time.time
            hold = await accountant.hold(key, CHEAP, 20, 10)
            settled = await accountant.settle(hold, Usage(12, 3), accepted=True)
            assert not settled.lapsed and settled.cost_micros == 15
        finally:
            await counters.close()

    asyncio.run(scenario())


def test_deadline_and_stream_drain_must_be_below_the_lease(
    upstream: FakeUpstream, tmp_path: Path
) -> None:
    models = {"chat": {"deployments": [deployment("echo", deadline="10m")]}}
    with pytest.raises(GatewayConfigError, match=r"models\.chat\.deployments\[0\]\.deadline"):
        config(upstream, tmp_path, models=models)  # the default lease is 10m too
    with pytest.raises(GatewayConfigError, match=r"gateway\.stream_drain .* below gateway\.lease"):
        config(upstream, tmp_path, lease="1m", stream_drain="1m")
    # the defaults fit, and a longer lease lets a longer deadline through
    defaults = config(upstream, tmp_path)
    assert all(d.deadline < defaults.lease for d in defaults.models["chat"].deployments)
    longer = config(upstream, tmp_path, models=models, lease="15m")
    assert longer.models["chat"].deployments[0].deadline == 600


# --- 4. the cap goes in the field the provider reads -----------------------------------


def _received(upstream: FakeUpstream, tmp_path: Path, body: dict[str, Any], **extra: Any) -> Any:
    async def scenario() -> None:
        gateway = Gateway(config(upstream, tmp_path, **extra))
        try:
            _, key = await gateway.create_key(
                name="capped", budgets=[{"period": "total", "usd": 100}]
            )
            await gateway.chat(key, {"model": "chat", "messages": HI, **body})
        finally:
            await gateway.close()

    asyncio.run(scenario())
    [received] = upstream.received
    return received


def test_a_cap_goes_in_the_token_field_of_an_older_server(
    upstream: FakeUpstream, tmp_path: Path
) -> None:
    url = f"{upstream.url}/v1"  # type: ignore[attr-defined]
    settings = {
        "providers": {"old": {"kind": "openai", "base_url": url, "token_field": "max_tokens"}},
        "models": {"chat": {"deployments": [{**deployment("echo"), "provider": "old"}]}},
    }
    body = _received(upstream, tmp_path, {"max_completion_tokens": 3}, **settings)
    assert body == {"model": "echo", "messages": HI, "max_tokens": 3}  # the field it reads


def test_completions_refuse_max_completion_tokens(
    served: ServerThread, upstream: FakeUpstream
) -> None:
    key = served_key(served, budgets=[{"period": "total", "usd": 100}])
    response = httpx.post(
        f"{served.url}/v1/completions",
        json={"model": "chat", "prompt": "Say hi", "max_completion_tokens": 3},
        headers={"authorization": f"Bearer {key}"},
    )
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == "max_completion_tokens" and "max_tokens" in error["message"]
    assert upstream.received == []


# --- 5. both output limits and stop are checked ----------------------------------------


def test_both_output_limits_are_checked() -> None:
    body = {"model": "m", "messages": HI, "max_completion_tokens": 5, "max_tokens": "x"}
    with pytest.raises(InvalidRequest) as raised:
        check_chat(body, 100)
    assert raised.value.param == "max_tokens"
    assert check_chat({**body, "max_tokens": 9}, 100)[2] == 5  # max_completion_tokens wins


@pytest.mark.parametrize("stop", [5, ["a", "b", "c", "d", "e"], [1], {"x": 1}])
def test_stop_is_a_string_or_up_to_four(stop: Any) -> None:
    with pytest.raises(InvalidRequest) as raised:
        check_chat({"model": "m", "messages": HI, "stop": stop}, 100)
    assert raised.value.param == "stop"
    with pytest.raises(InvalidRequest):
        check_completion({"model": "m", "prompt": "p", "stop": stop})
    for fine in ("END", ["a", "b", "c", "d"], None):
        check_chat({"model": "m", "messages": HI, "stop": fine}, 100)
        check_completion({"model": "m", "prompt": "p", "stop": fine})
    # /v1/messages' stop_sequences: Anthropic takes more than four
    check_chat({"model": "m", "messages": HI, "stop": ["s"] * 6}, 100, stop_field="stop_sequences")


def test_a_bad_stop_is_a_400_not_a_crash(served: ServerThread, upstream: FakeUpstream) -> None:
    key = served_key(served)
    headers = {"authorization": f"Bearer {key}"}
    chat = httpx.post(
        f"{served.url}/v1/chat/completions",
        json={"model": "claude", "messages": HI, "stop": 5},
        headers=headers,
    )
    assert chat.status_code == 400, chat.text
    assert chat.json()["error"]["param"] == "stop"
    messages = httpx.post(
        f"{served.url}/v1/messages",
        content=orjson.dumps(
            {"model": "claude", "max_tokens": 5, "messages": HI, "stop_sequences": 5}
        ),
        headers={**headers, "content-type": "application/json"},
    )
    assert messages.status_code == 400, messages.text
    assert "stop_sequences" in messages.text
    assert upstream.received == []
