"""How the CLI shows the LLM calls of a query: the whole path (context assembly, queue, time to
first token, decode, total) and which features the prompt tokens came from."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

_STAGES = (
    ("context", "context_ms"),
    ("queue", "queue_ms"),
    ("ttft", "ttft_ms"),
    ("decode", "decode_ms"),
    ("llm total", "total_ms"),
    ("query", "query_ms"),
)


def breakdown(calls: Sequence[Mapping[str, Any]]) -> list[str]:
    """One line per LLM call: where its time went, and its tokens."""
    lines = []
    for call in calls:
        stages = [
            f"{label} {call[key]:.1f} ms"
            for label, key in _STAGES
            if isinstance(call.get(key), int | float)
        ]
        rate = call.get("tokens_per_s")
        if isinstance(rate, int | float):
            stages.append(f"{rate:.1f} tok/s")
        tokens = f"{call.get('prompt_tokens', '?')} prompt + {call.get('completion_tokens', '?')}"
        lines.append(
            f"llm {call.get('feature')} ({call.get('model')}): {', '.join(stages)}; "
            f"tokens {tokens} completion"
        )
    return lines


def token_table(calls: Sequence[Mapping[str, Any]]) -> str:
    """Per LLM feature, the prompt tokens each input feature contributed, largest first."""
    blocks = []
    for call in calls:
        counts: Mapping[str, int] = call.get("tokens_by_feature") or {}
        total = sum(counts.values()) or 1
        rows = sorted(counts.items(), key=lambda item: (-item[1], item[0]))
        exact = "" if call.get("exact") else " (approximate: no tokenizer for this model)"
        lines = [
            f"{call.get('feature')} -> {call.get('model')}: {sum(counts.values())} prompt tokens, "
            f"counted with {call.get('tokenizer')}{exact}"
        ]
        width = max([len(name) for name in counts] + [7])
        lines.append(f"  {'feature'.ljust(width)}  tokens  share")
        for name, count in rows:
            lines.append(f"  {name.ljust(width)}  {count:>6}  {count / total:>5.0%}")
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks) if blocks else "no LLM calls: the outputs reach no kr.completion"
