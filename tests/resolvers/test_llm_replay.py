"""Replaying LLM features: a deterministic provider reproduces every logged answer; a new
prompt is rendered from the values the decision logged (not from events written since), and
the replay reports prompt tokens, TTFT and cost before and after."""

import asyncio
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest

import kairos as kr
from tests.gateway.fake_upstream import ServerThread
from tests.resolvers.test_llm import T0, Payment, Provider, Shopper, gateway_for, shopper_name


@pytest.fixture(scope="module")
def provider() -> Iterator[tuple[Provider, str]]:
    fake = Provider()
    with ServerThread(fake.app()) as server:
        yield fake, server.url


@pytest.fixture
def client(provider: tuple[Provider, str], tmp_path: Path) -> Iterator[kr.Client]:
    gateway = gateway_for(provider[1], tmp_path)
    plain, _ = asyncio.run(gateway.create_key(name="features", models=["gpt-4"]))
    with kr.Client(
        definitions=[Payment, Shopper, shopper_name],
        query_log=f"sqlite:///{tmp_path / 'log.db'}",
        offline_store="none://",
        gateway=gateway,
        llm_key=plain,
    ) as client:
        client.write_events(
            Payment,
            [
                {"id": "p1", "shopper_id": "s1", "amount": 10.5, "at": T0 - timedelta(hours=2)},
                {"id": "p2", "shopper_id": "s2", "amount": 99.0, "at": T0 - timedelta(hours=3)},
            ],
        )
        yield client


def test_a_deterministic_provider_reproduces_every_logged_answer(client: kr.Client) -> None:
    served = client.query_bulk({"shopper.id": ["s1", "s2"]}, ["shopper.advice"], now=T0)
    assert served.errors == []
    before = asyncio.run(client.llm.gateway().usage())
    result = client.replay(since=T0 - timedelta(hours=1), recompute=["shopper.advice"])
    ledger = asyncio.run(client.llm.gateway().usage())
    # the replay's calls went through the gateway with the client's key: billed, in the ledger
    replayed = {c["request_id"] for calls in result.llm_calls.values() for c in calls}
    assert len(ledger) == len(before) + 2
    assert replayed == {row.request_id for row in ledger} - {row.request_id for row in before}
    assert result.decisions == 2  # the resolver makes advice and its usage: both recomputed
    assert result.recomputed == ("shopper.advice", "shopper.advice_usage")
    advice = [r for r in result.rows if r.feature == "shopper.advice"]
    assert [r.changed for r in advice] == [False, False]
    assert sorted(r.replayed for r in advice) == sorted(served.column("shopper.advice"))
    # its usage is recomputed too, and differs where it must: the timings of the new call
    usage = [r for r in result.rows if r.feature == "shopper.advice_usage"]
    assert [r.replayed["prompt_tokens"] for r in usage] == [
        r.logged["prompt_tokens"] for r in usage
    ]
    for record in result.records:  # one new call per decision, its own prompt
        [call] = result.llm_calls[record.query_id]
        [logged] = record.llm_calls
        assert call["messages"] == logged["messages"]
        assert call["prompt_tokens"] == logged["prompt_tokens"]
    llm = result.summary()["llm"]["shopper.advice"]
    assert llm["logged"]["calls"] == llm["replayed"]["calls"] == 2
    assert llm["logged"]["mean_prompt_tokens"] == llm["replayed"]["mean_prompt_tokens"]
    assert llm["replayed"]["mean_ttft_ms"] > 0
    assert llm["logged"]["cost_usd"] == llm["replayed"]["cost_usd"] > 0


def test_a_new_prompt_sees_the_logged_values_not_events_written_since(
    client: kr.Client, provider: tuple[Provider, str]
) -> None:
    fake, _ = provider
    served = client.query({"shopper.id": "s1"}, ["shopper.advice"], now=T0)
    assert not served.errors
    # an event the decision did not see, inside its window: a recomputed window would count it
    client.write_events(
        Payment, [{"id": "p9", "shopper_id": "s1", "amount": 500.0, "at": T0 - timedelta(hours=1)}]
    )
    shorter = kr.completion(
        model="gpt-4",
        messages=[kr.message("user", "{{ name }}: {{ spent['1d'] }}?")],
        max_tokens=8,
        temperature=0,
    )
    result = client.replay([served.meta.query_id], features={"shopper.advice": shorter})
    [row] = [r for r in result.rows if r.feature == "shopper.advice"]
    assert row.logged == served.get_value("shopper.advice")
    assert row.replayed == "seen: Shopper s1: 10.5?"  # the logged 1-day spend, not 510.5
    assert row.changed
    assert fake.received[-1]["messages"] == [{"role": "user", "content": "Shopper s1: 10.5?"}]
    llm = result.summary()["llm"]["shopper.advice"]
    assert llm["replayed"]["mean_prompt_tokens"] < llm["logged"]["mean_prompt_tokens"]
    assert llm["replayed"]["cost_usd"] is not None
    assert "shopper.advice" in result.to_markdown()
