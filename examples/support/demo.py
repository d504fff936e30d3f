"""The support agent end to end on embedded defaults: `python -m examples.support.demo`.

The help center's articles are written as events (`Doc`); each gets its vector from the local
embedding model (all-MiniLM-L6-v2, in process) and lands in the embedded vector index. A ticket's
answer is a prompt built from the account's aggregates (SQL over the example's SQLite file) and
the articles nearest the question, in the customer's language, as of the query's `now`; Gemma 3
270M (a local llama.cpp replica behind the gateway) answers it. For each ticket the demo prints
what retrieval found, the prompt's tokens per feature and per retrieved article, the time to
first token and the total, for k = 3 and k = 20 articles.
"""

import asyncio
import tempfile
from datetime import timedelta
from pathlib import Path
from typing import Any

import kairos as kr
from kairos.gateway import Gateway, GatewayConfig
from kairos.project.llm import packaged_gemma
from kairos.serving.deploy import DeploymentSpec
from kairos.serving.group_provider import DeploymentProvider, gateway_entries
from kairos.serving.supervisor import DeploymentGroup

from .corpus import ANCHOR, articles
from .generate import generate

PROJECT = Path(__file__).parent
GROUP = "gemma-270m"
QUESTIONS = {
    "t1": ("a001", "How do I get my money back for last month?"),
    "t2": ("a003", "Meine Karte wurde abgelehnt, was kann ich tun?"),  # a German customer
    "t3": ("a002", "I lost my phone with the authenticator app"),
}
TICKETS = [
    {"ticket.id": tid, "ticket.account_id": aid, "ticket.question": question}
    for tid, (aid, question) in QUESTIONS.items()
]
DEPTHS = {3: "ticket.answer_3", 20: "ticket.answer_20"}


def _gateway(group: DeploymentGroup, folder: Path) -> Gateway:
    config = GatewayConfig.from_mapping(
        {
            "pepper_env": "DEMO_PEPPER",
            "registry": f"sqlite:///{folder / 'gateway.db'}",
            "counters": f"sqlite:///{folder / 'gateway.db'}",
            **gateway_entries(group.name, price={"input": 0, "output": 0}),
            "aliases": {"local/gemma-270m": group.name},
        },
        base_dir=folder,
        environ={"DEMO_PEPPER": "demo-only-pepper"},  # a throwaway gateway: no real secret
    )
    return Gateway(config, providers={group.name: DeploymentProvider(group)})


def retrieve(client: kr.Client) -> dict[str, Any]:
    """Which articles the refund question finds now and before the policy was rewritten."""
    ticket = TICKETS[0]
    found = {}
    for label, now in (("now", ANCHOR), ("10 days ago", ANCHOR - timedelta(days=10))):
        result = client.query(ticket, ["ticket.articles_3"], now=now)
        if result.errors:
            raise RuntimeError(result.errors[0].message)
        found[label] = list(result.get_value("ticket.articles_3"))
    return found


async def answer(client: kr.Client, ticket: dict[str, str]) -> list[dict[str, Any]]:
    """The ticket answered with k = 3 and k = 20 articles: one LLM call each, measured."""
    calls = []
    for k, feature in DEPTHS.items():
        result = await client.query_async(ticket, [feature], now=ANCHOR, staleness={feature: "0s"})
        if result.errors:
            raise RuntimeError(f"{feature}: {result.errors[0].message}")
        (call,) = result.meta.llm
        calls.append({**call, "k": k, "answer": result.get_value(feature)})
    return calls


async def answers() -> dict[str, list[dict[str, Any]]]:
    """Every ticket answered by the local LLM through the gateway, at k = 3 and k = 20."""
    spec = DeploymentSpec(name=GROUP, model=packaged_gemma(), ctx=4096, threads=2)
    with tempfile.TemporaryDirectory(prefix="kairos-support-demo-") as scratch:
        folder = Path(scratch)
        async with DeploymentGroup(spec, log_dir=folder) as group:
            gateway = _gateway(group, folder)
            key, _ = await gateway.create_key(
                name="support-demo", models=[GROUP], budgets=[{"period": "day", "tokens": 200000}]
            )
            client = kr.Client(PROJECT, gateway=gateway, llm_key=key)
            try:
                client.llm.warm()  # Gemma's vocabulary, which counts the prompts' tokens
                return {t["ticket.id"]: await answer(client, t) for t in TICKETS}
            finally:
                await client.aclose()


def run() -> dict[str, Any]:
    """Write the help center, retrieve from it at two times, then answer every ticket."""
    generate()
    corpus = articles()
    with kr.Client(PROJECT) as client:
        written = client.write_events("doc", corpus)
        found = retrieve(client)
    return {
        "versions": len(corpus),
        "articles": written,
        "found": found,
        "answers": asyncio.run(answers()),
    }


def main() -> None:
    print("Support agent: help-center articles retrieved by meaning, account aggregates by SQL,")
    print("answered by Gemma 3 270M (local llama.cpp replica behind the gateway).")
    report = run()
    print(
        f"\n{report['versions']} versions of {report['articles']} articles written as events, "
        "embedded in process and indexed."
    )
    for label, rows in report["found"].items():
        print(f"\n'{TICKETS[0]['ticket.question']}' as of {label}, k = 3:")
        for row in rows:
            print(f"  {row['distance']:.3f}  {row['id']:<14} {row['text'][:70]}...")
    for ticket in TICKETS:
        print(f"\nticket {ticket['ticket.id']}: {ticket['ticket.question']!r}")
        for call in report["answers"][ticket["ticket.id"]]:
            counts = call["tokens_by_feature"]
            docs = {name: n for name, n in counts.items() if "[" in name}
            top = ", ".join(
                f"{name} {n}" for name, n in sorted(counts.items(), key=lambda i: -i[1])[:4]
            )
            print(
                f"  k = {call['k']:>2}: {call['prompt_tokens']} prompt tokens "
                f"({len(docs)} articles {sum(docs.values())}; top: {top}), "
                f"TTFT {call['ttft_ms']:.0f} ms, total {call['total_ms']:.0f} ms"
            )
        few, many = report["answers"][ticket["ticket.id"]]
        reply = " ".join(str(few["answer"]).split())[:160]
        print(f"  reply with k = 3 (a 270M base model: it mostly continues the text): {reply!r}")
        if many["prompt_tokens"] == few["prompt_tokens"]:
            print("  (every article in this language is among the 3: both prompts are the same)")
            continue
        print(
            f"  k = 20 costs {many['prompt_tokens'] / few['prompt_tokens']:.1f}x the prompt tokens "
            f"and {many['ttft_ms'] / few['ttft_ms']:.1f}x the time to first token of k = 3"
        )


if __name__ == "__main__":
    main()
