"""The fraud example's LLM features on the real local model: one question asked two ways, the
prompt tokens attributed to the features they came from."""

import asyncio

import pytest

from examples.fraud import llm_demo
from examples.fraud.generate import generate


@pytest.mark.slow
def test_the_history_prompt_costs_more_tokens_and_time_than_the_aggregates() -> None:
    generate()
    aggregates, history = asyncio.run(llm_demo.ask("u0001"))
    for call in (aggregates, history):
        assert sum(call["tokens_by_feature"].values()) == call["prompt_tokens"]
        assert call["exact"] and call["tokenizer"].startswith("gguf:")
        assert 0 < call["ttft_ms"] <= call["total_ms"]
        assert call["completion_tokens"] >= 1 and isinstance(call["answer"], str)
        assert call["billed"] == f"{call['prompt_tokens']}+{call['completion_tokens']} tokens"
    # the raw history is the prompt's bulk; the aggregates are three small numbers
    assert max(history["tokens_by_feature"], key=history["tokens_by_feature"].get) == (
        "transactions"
    )
    assert history["prompt_tokens"] > 5 * aggregates["prompt_tokens"]
    assert history["ttft_ms"] > aggregates["ttft_ms"]
    assert {"txn_count", "declines", "avg_ticket", "name"} <= set(aggregates["tokens_by_feature"])
