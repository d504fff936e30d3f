"""Decision records in the query log (a real SQLite file): every value the plan read or
produced, with its source, version and cache age; the exact vector each model call was
given; each LLM call's rendered messages as the provider received them, its answer, who
served it and what it cost; and the plan's fingerprint."""

import asyncio
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from sklearn.linear_model import LinearRegression

import kairos as kr
from kairos import DataFrame, FeatureTime, Windowed, _, feature, features, online, windowed
from kairos.gateway import Gateway, GatewayConfig
from kairos.project.config import Config
from kairos.stores.query_log import LoggedQuery
from tests.gateway.fake_upstream import FakeUpstream, ServerThread

T1 = datetime(2026, 6, 1, 12, tzinfo=UTC)


@features
class Purchase:
    id: str
    buyer_id: "Buyer.id"
    amount: float
    at: FeatureTime


@features
class Buyer:
    id: str
    name: str
    limit: float = feature(max_staleness="1h")  # cached: the second query reads it
    purchases: DataFrame[Purchase]
    spent: Windowed[float] = windowed(
        "1d", "7d", expression=_.purchases[_.amount, _.at > _.window_start].sum()
    )
    headroom: float = _.limit - _.spent["1d"]
    tier: str = feature(default="basic")
    risk: float = kr.predict("risk", inputs=[_.headroom, _.spent["7d"], _.limit])


def purchases_of(buyer: str) -> list[dict[str, Any]]:
    """The buyer's purchases, one of them after T1 (the engine drops it at T1)."""
    made = [
        ("q1", 12.25, T1 - timedelta(hours=3)),
        ("q2", 40.5, T1 - timedelta(days=2)),
        ("q3", 7.75, T1 - timedelta(days=9)),
        ("q4", 1000.0, T1 + timedelta(hours=2)),
    ]
    scale = float(buyer.removeprefix("b"))
    return [
        {"id": f"{buyer}-{pid}", "buyer_id": buyer, "amount": amount * scale, "at": at}
        for pid, amount, at in made
    ]


CALLS: Counter[str] = Counter()


@online
def buyer_name(bid: Buyer.id) -> Buyer.name:
    return f"Buyer {bid}"


@online
def buyer_limit(bid: Buyer.id) -> Buyer.limit:
    if bid == "b0":
        raise LookupError("no limit on file for b0")
    CALLS[str(bid)] += 1
    return 500.0 + CALLS[str(bid)]  # a new value each time it is computed


@online
def buyer_purchases(bid: Buyer.id) -> DataFrame[Purchase]:
    return purchases_of(str(bid))  # type: ignore[return-value]  # a list of dicts is accepted


PROJECT = [Purchase, Buyer, buyer_name, buyer_limit, buyer_purchases]
OUTPUTS = [Buyer.name, Buyer.headroom, Buyer.tier, Buyer.purchases, Buyer.risk]
MODEL_INPUTS = ["buyer.headroom", "buyer.spent[7d]", "buyer.limit"]


def risk_model(weights: tuple[float, float, float]) -> LinearRegression:
    x = np.array([[0.0, 0.0, 0.0], [1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]])
    return LinearRegression().fit(x, x @ np.array(weights) + 0.5)


def open_client(folder: Path) -> kr.Client:
    config = Config(base_dir=folder, query_log=f"sqlite:///{folder / 'log.db'}")
    return kr.Client(definitions=PROJECT, config=config, offline_store="none://")


@pytest.fixture
def client(tmp_path: Path) -> Iterator[kr.Client]:
    CALLS.clear()
    with open_client(tmp_path) as client:
        client.models.register("risk", risk_model((0.5, 0.25, 0.01)), inputs=["h", "s", "l"])
        yield client


def record_of(client: kr.Client, query_id: str) -> LoggedQuery:
    client.log.flush()
    record = client.log.get(query_id)
    assert record is not None, f"no record {query_id!r} in the query log"
    return record


def vector_of(record: LoggedQuery, call: dict[str, Any]) -> list[float]:
    return [float(record.values[name].value) for name in call["inputs"]]


# --- every intermediate ------------------------------------------------------------------


def test_a_decision_record_holds_every_value_the_plan_read_or_produced(
    client: kr.Client,
) -> None:
    result = client.query({Buyer.id: "b1"}, OUTPUTS, now=T1)
    assert result.errors == []
    record = record_of(client, result.meta.query_id)
    plan = client.plan([Buyer.id], OUTPUTS)

    assert set(record.values) == set(plan.columns)
    assert set(record.outputs) == {client.name(o) for o in OUTPUTS}
    assert {"buyer.limit", "buyer.spent[1d]", "buyer.spent[7d]"} <= set(record.values)
    sources = {name: value.source for name, value in record.values.items()}
    assert sources["buyer.id"] == "input"
    assert sources["buyer.name"] == "buyer_name"
    assert sources["buyer.limit"] == "buyer_limit"
    assert sources["buyer.purchases"] == "buyer_purchases"
    assert sources["buyer.headroom"] == "expression"
    assert sources["buyer.tier"] == "default"
    assert sources["buyer.risk"] == result.features["buyer.risk"].source
    assert "risk" in str(sources["buyer.risk"])
    # every value is the one the query computed
    for name in record.outputs:
        assert record.values[name].value == result.values[name], name
    spent_1d, spent_7d = 12.25, 12.25 + 40.5
    assert record.value("buyer.spent[1d]") == spent_1d
    assert record.value("buyer.spent[7d]") == spent_7d
    assert record.value("buyer.limit") == 501.0
    assert record.value("buyer.headroom") == 501.0 - spent_1d
    assert record.value("buyer.tier") == "basic"
    # the code that made each value, as the plan names it; none for an input or a default
    for name, value in record.values.items():
        if value.source in ("input", "default"):
            assert value.version is None, name
        else:
            assert value.version == plan.versions.get(name), name
    for name in ("buyer.name", "buyer.limit", "buyer.purchases", "buyer.risk"):
        assert record.values[name].version, f"{name} has no version"
    assert record.values["buyer.risk"].version == "risk@v1"
    # computed now: observed at the query's now, no cache age
    for name, value in record.values.items():
        if value.source != "input":
            assert value.observed_at == T1, name
        assert value.age_s is None, name
        assert value.error_code is None and value.error_message is None, name


def test_values_served_from_the_cache_carry_their_age(client: kr.Client) -> None:
    first = client.query({Buyer.id: "b1"}, OUTPUTS, now=T1)
    t2 = T1 + timedelta(minutes=25, seconds=30)
    second = client.query({Buyer.id: "b1"}, OUTPUTS, now=t2)
    assert first.errors == second.errors == []
    record = record_of(client, second.meta.query_id)
    limit = record.values["buyer.limit"]
    assert (limit.source, limit.value, limit.observed_at) == ("cache", 501.0, T1)
    assert limit.age_s == (t2 - T1).total_seconds() == 1530.0
    assert limit.version is None  # the cache made nothing; the first record names the code
    assert CALLS["b1"] == 1
    # the rest was computed again at t2, from the cached limit
    assert record.values["buyer.name"].source == "buyer_name"
    assert record.values["buyer.name"].observed_at == t2
    assert record.values["buyer.name"].age_s is None
    assert record.value("buyer.headroom") == 501.0 - 12.25
    [call] = record.model_calls  # the model was given the cached limit
    assert call["vector"] == vector_of(record, call) == [501.0 - 12.25, 12.25 + 40.5, 501.0]
    first_record = record_of(client, first.meta.query_id)
    assert first_record.values["buyer.limit"].source == "buyer_limit"


def test_has_many_values_round_trip_exactly(client: kr.Client) -> None:
    result = client.query({Buyer.id: "b2"}, [Buyer.purchases, Buyer.spent["7d"]], now=T1)
    record = record_of(client, result.meta.query_id)
    stored = record.value("buyer.purchases")
    assert stored == result.values["buyer.purchases"]
    expected = [row for row in purchases_of("b2") if row["at"] <= T1]
    assert sorted(stored, key=lambda row: row["id"]) == expected
    assert all(type(row["at"]) is datetime and row["at"].tzinfo is not None for row in stored)
    assert all(type(row["amount"]) is float for row in stored)
    assert record.value("buyer.spent[7d]") == (12.25 + 40.5) * 2


# --- model input vectors -----------------------------------------------------------------


def test_the_models_input_vector_equals_the_values_in_the_record(client: kr.Client) -> None:
    result = client.query({Buyer.id: "b1"}, [Buyer.risk], now=T1)
    assert result.errors == []
    record = record_of(client, result.meta.query_id)
    [call] = record.model_calls
    assert call["feature"] == "buyer.risk"
    assert call["model"] == "risk" and call["version"] == "risk@v1"
    assert call["inputs"] == MODEL_INPUTS
    assert call["vector"] == vector_of(record, call)
    assert call["vector"] == [501.0 - 12.25, 12.25 + 40.5, 501.0]
    [again] = client.models.predict("risk", [call["vector"]], version=1).tolist()
    assert record.value("buyer.risk") == again == result.get_value(Buyer.risk)
    assert record.values["buyer.risk"].version == "risk@v1"


def test_each_bulk_row_carries_its_own_rows_vector(client: kr.Client) -> None:
    buyers = ["b1", "b2", "b3"]
    bulk = client.query_bulk({Buyer.id: buyers}, [Buyer.risk], now=T1)
    assert bulk.errors == []
    for row, buyer in enumerate(buyers):
        record = record_of(client, f"{bulk.meta.query_id}-{row}")
        assert record.inputs == {"buyer.id": buyer}
        [call] = record.model_calls
        scale = float(row + 1)
        assert call["vector"] == vector_of(record, call)
        assert call["vector"] == [501.0 - 12.25 * scale, (12.25 + 40.5) * scale, 501.0]
        [again] = client.models.predict("risk", [call["vector"]], version=1).tolist()
        assert record.value("buyer.risk") == again == bulk.columns["buyer.risk"].values[row]


def test_bulk_rows_whose_inputs_failed_have_no_model_call(client: kr.Client) -> None:
    buyers = ["b1", "b0", "b3"]  # b0's limit fails: the model is given rows 0 and 2 only
    bulk = client.query_bulk({Buyer.id: buyers}, [Buyer.risk], now=T1)
    assert [error.row for error in bulk.errors] == [1]
    failed = record_of(client, f"{bulk.meta.query_id}-1")
    assert failed.model_calls == []
    assert failed.values["buyer.risk"].error_code == "upstream_error"
    assert failed.values["buyer.limit"].error_code == "resolver_error"
    for row, scale in ((0, 1.0), (2, 3.0)):
        record = record_of(client, f"{bulk.meta.query_id}-{row}")
        [call] = record.model_calls
        assert call["vector"] == vector_of(record, call)
        assert call["vector"] == [501.0 - 12.25 * scale, (12.25 + 40.5) * scale, 501.0]
        [again] = client.models.predict("risk", [call["vector"]], version=1).tolist()
        assert record.value("buyer.risk") == again


# --- the plan ----------------------------------------------------------------------------


def test_the_plan_fingerprint_is_stable_and_names_the_model_version(tmp_path: Path) -> None:
    CALLS.clear()
    prints = []
    for folder in ("one", "two"):
        (tmp_path / folder).mkdir()
        with open_client(tmp_path / folder) as client:
            client.models.register("risk", risk_model((0.5, 0.25, 0.01)), inputs=["h", "s", "l"])
            result = client.query({Buyer.id: "b1"}, OUTPUTS, now=T1)
            record = record_of(client, result.meta.query_id)
            assert record.plan is not None
            assert record.plan.models == ("risk@v1",)
            assert record.plan.fingerprint == client.plan([Buyer.id], OUTPUTS).fingerprint
            prints.append((record.plan.fingerprint, record.plan.definitions))
            if folder == "two":  # a new version of the model: a new plan
                client.models.register("risk", risk_model((1.0, 1.0, 1.0)), inputs=["h", "s", "l"])
                moved = client.query({Buyer.id: "b1"}, OUTPUTS, now=T1)
                assert moved.errors == []
                later = record_of(client, moved.meta.query_id)
                assert later.plan is not None
                assert later.plan.models == ("risk@v2",)
                assert later.values["buyer.risk"].version == "risk@v2"
                assert later.plan.fingerprint != record.plan.fingerprint
    assert prints[0] == prints[1]


# --- LLM calls ---------------------------------------------------------------------------

PROMPT_TOKENS = 41
COMPLETION_TOKENS = 9


class Upstream(FakeUpstream):
    """An OpenAI-compatible provider over real HTTP: keeps every request body it got, and
    streams a scripted answer naming the buyer of the prompt, with fixed usage."""

    pieces = 2
    pause = 0.005

    def __init__(self) -> None:
        super().__init__()
        self.cached = 0  # prompt tokens reported as read from the provider's prompt cache

    @staticmethod
    def answer(body: dict[str, Any]) -> str:
        text = body["messages"][-1]["content"]
        return f"verdict for {text.split(':')[0]}: fine"

    def reply(self, body: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        assert body.get("stream"), "the LLM resolver streams"
        usage: dict[str, Any] = {
            "prompt_tokens": PROMPT_TOKENS,
            "completion_tokens": COMPLETION_TOKENS,
            "total_tokens": PROMPT_TOKENS + COMPLETION_TOKENS,
        }
        if self.cached:
            usage["prompt_tokens_details"] = {"cached_tokens": self.cached}
        return self.answer(body), usage


@pytest.fixture(scope="module")
def upstream() -> Iterator[tuple[Upstream, str]]:
    fake = Upstream()
    with ServerThread(fake.app()) as server:
        yield fake, server.url


@features
class Seller:
    id: str
    name: str
    rating: float
    review: str = kr.completion(
        model="judge",
        messages=[
            kr.message("system", "You review sellers in one line."),
            kr.message("user", "{{ name }}: rated {{ rating }}. Trustworthy?"),
        ],
        max_tokens=20,
        temperature=0,
    )


@online
def seller_profile(sid: Seller.id) -> kr.Features[Seller.name, Seller.rating]:
    if sid == "s0":
        raise LookupError("no seller s0")
    return f"Seller {sid}", 4.5 if sid == "s1" else 2.0


# USD per million tokens; prompt tokens read from the provider's cache cost a tenth
INPUT_PRICE, OUTPUT_PRICE, CACHED_PRICE = 3.0, 15.0, 0.3


def gateway_config(url: str, folder: Path) -> GatewayConfig:
    return GatewayConfig.from_mapping(
        {
            "pepper_env": "PEPPER",
            "registry": f"sqlite:///{folder / 'gateway.db'}",
            "counters": f"sqlite:///{folder / 'gateway.db'}",
            "providers": {"fake": {"kind": "openai", "base_url": f"{url}/v1"}},
            "models": {"judge": {"deployments": [{"provider": "fake", "model": "judge-1"}]}},
            "prices": {
                "judge-1": {
                    "input": INPUT_PRICE,
                    "output": OUTPUT_PRICE,
                    "cached_input": CACHED_PRICE,
                }
            },
        },
        base_dir=folder,
        environ={"PEPPER": "pepper"},
    )


def llm_client(url: str, folder: Path) -> kr.Client:
    gateway = Gateway(gateway_config(url, folder))
    plain, _ = asyncio.run(gateway.create_key(name="features", models=["judge"]))
    return kr.Client(
        definitions=[Seller, seller_profile],
        query_log=f"sqlite:///{folder / 'log.db'}",
        offline_store="none://",
        gateway=gateway,
        llm_key=plain,
    )


def billed(client: kr.Client) -> dict[str, float]:
    """What the gateway's ledger charged the key, in USD, by request id."""
    rows = asyncio.run(client.llm.gateway().usage())
    return {row.request_id: row.cost_micros / 1e6 for row in rows}


def check_llm_call(call: dict[str, Any], sent: dict[str, Any], name: str) -> None:
    """One LLM call of a record against the request the provider received for it."""
    assert call["feature"] == "seller.review"
    assert call["messages"] == sent["messages"]
    assert sent["messages"][-1]["content"].startswith(f"{name}: rated")
    assert call["answer"] == Upstream.answer(sent) == f"verdict for {name}: fine"
    assert call["provider"] == "fake" and call["deployment"] == "judge-1"
    assert isinstance(call["request_id"], str) and call["request_id"]
    assert call["version"] and str(call["version"]).startswith("judge#")
    assert (call["prompt_tokens"], call["completion_tokens"]) == (PROMPT_TOKENS, COMPLETION_TOKENS)
    assert call["tokens_by_feature"] and {"name", "rating"} <= set(call["tokens_by_feature"])
    cost = (PROMPT_TOKENS * INPUT_PRICE + COMPLETION_TOKENS * OUTPUT_PRICE) / 1e6
    assert call["cost_usd"] == pytest.approx(cost, abs=1e-12)
    by_feature = call["cost_by_feature"]
    assert set(by_feature) == set(call["tokens_by_feature"])
    for feature_name, tokens in call["tokens_by_feature"].items():
        assert by_feature[feature_name] == pytest.approx(tokens * INPUT_PRICE / 1e6)
    assert sum(by_feature.values()) <= call["cost_usd"] + 1e-12
    assert call["context_ms"] >= 0


def test_a_prompts_rendered_text_equals_what_the_provider_received(
    upstream: tuple[Upstream, str], tmp_path: Path
) -> None:
    fake, url = upstream
    with llm_client(url, tmp_path) as client:
        before = len(fake.received)
        result = client.query({Seller.id: "s1"}, [Seller.review], now=T1)
        assert result.errors == []
        [sent] = fake.received[before:]
        record = record_of(client, result.meta.query_id)
        ledger = billed(client)
    [call] = record.llm_calls
    check_llm_call(call, sent, "Seller s1")
    assert ledger == {call["request_id"]: call["cost_usd"]}  # what the key was charged
    assert sent["messages"] == [
        {"role": "system", "content": "You review sellers in one line."},
        {"role": "user", "content": "Seller s1: rated 4.5. Trustworthy?"},
    ]
    assert record.value("seller.review") == "verdict for Seller s1: fine"
    assert record.values["seller.review"].version == call["version"]
    assert record.value("seller.name") == "Seller s1" and record.value("seller.rating") == 4.5
    assert record.cost_usd == call["cost_usd"]


def test_each_bulk_row_has_only_its_own_llm_call(
    upstream: tuple[Upstream, str], tmp_path: Path
) -> None:
    fake, url = upstream
    with llm_client(url, tmp_path) as client:
        before = len(fake.received)
        bulk = client.query_bulk({Seller.id: ["s1", "s2"]}, [Seller.review], now=T1)
        assert bulk.errors == []
        received = fake.received[before:]
        records = [record_of(client, f"{bulk.meta.query_id}-{row}") for row in range(2)]
        ledger = billed(client)
    assert len(received) == 2
    assert ledger == {r.llm_calls[0]["request_id"]: r.llm_calls[0]["cost_usd"] for r in records}
    by_name = {body["messages"][-1]["content"].split(":")[0]: body for body in received}
    for row, record in enumerate(records):
        name = f"Seller s{row + 1}"
        [call] = record.llm_calls
        check_llm_call(call, by_name[name], name)
        assert record.value("seller.review") == f"verdict for {name}: fine"
        assert record.value("seller.name") == name
    assert records[0].llm_calls[0]["request_id"] != records[1].llm_calls[0]["request_id"]


def test_bulk_rows_whose_inputs_failed_have_no_llm_call(
    upstream: tuple[Upstream, str], tmp_path: Path
) -> None:
    fake, url = upstream
    with llm_client(url, tmp_path) as client:
        before = len(fake.received)
        # s0's profile fails: the prompt is rendered for rows 0 and 2 only
        bulk = client.query_bulk({Seller.id: ["s1", "s0", "s2"]}, [Seller.review], now=T1)
        received = fake.received[before:]
        records = [record_of(client, f"{bulk.meta.query_id}-{row}") for row in range(3)]
    assert [error.row for error in bulk.errors] == [1]
    assert len(received) == 2
    by_name = {body["messages"][-1]["content"].split(":")[0]: body for body in received}
    assert records[1].llm_calls == []
    assert records[1].values["seller.review"].error_code == "upstream_error"
    for row, name in ((0, "Seller s1"), (2, "Seller s2")):
        [call] = records[row].llm_calls
        check_llm_call(call, by_name[name], name)
        assert records[row].value("seller.review") == f"verdict for {name}: fine"


def test_the_cost_of_a_call_with_cached_prompt_tokens_is_what_the_gateway_billed(
    upstream: tuple[Upstream, str], tmp_path: Path
) -> None:
    fake, url = upstream
    fake.cached = 32  # of the 41 prompt tokens, 32 were read from the provider's cache
    try:
        with llm_client(url, tmp_path) as client:
            result = client.query({Seller.id: "s1"}, [Seller.review], now=T1)
            assert result.errors == []
            record = record_of(client, result.meta.query_id)
            ledger = billed(client)
    finally:
        fake.cached = 0
    [call] = record.llm_calls
    fresh = PROMPT_TOKENS - 32
    price = fresh * INPUT_PRICE + 32 * CACHED_PRICE + COMPLETION_TOKENS * OUTPUT_PRICE
    assert ledger[call["request_id"]] == pytest.approx(price / 1e6, abs=1e-6)
    assert call["cost_usd"] == ledger[call["request_id"]], (
        f"the record says the call cost {call['cost_usd']} USD, the gateway billed "
        f"{ledger[call['request_id']]} USD for it (cached prompt tokens are cheaper)"
    )
    assert sum(call["cost_by_feature"].values()) <= call["cost_usd"]


def test_the_gateway_reports_one_attempt_for_a_call_answered_at_once(
    upstream: tuple[Upstream, str], tmp_path: Path
) -> None:
    gateway = Gateway(gateway_config(upstream[1], tmp_path))
    served: dict[str, Any] = {}
    messages = [{"role": "user", "content": "Seller s1: hi"}]

    async def call() -> list[Any]:
        try:
            plain, _ = await gateway.create_key(name="direct", models=["judge"])
            body = {"model": "judge", "messages": messages, "stream": True}
            reply = await gateway.chat(plain, body, served=served)
            assert not isinstance(reply, dict)
            assert [chunk async for chunk in reply]
            return [(row.request_id, row.attempts) for row in await gateway.usage()]
        finally:
            await gateway.close()

    rows = asyncio.run(call())
    assert served["provider"] == "fake" and served["deployment"] == "judge-1"
    assert rows == [(served["request_id"], 1)]  # the ledger: one attempt
    assert served["attempts"] == 1, f"served says {served['attempts']} attempts for one"
