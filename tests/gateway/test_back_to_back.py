"""Back-to-back calls on a key with a budget: the same client's next call sees the previous one
settled, although settling runs a few ms after an answer's last byte (served over HTTP)."""

from __future__ import annotations

import httpx
import orjson
import pytest

from kairos.gateway import Gateway
from kairos.gateway.accounting.accountant import input_bound
from tests.gateway.conftest import new_key
from tests.gateway.fake_upstream import TOKENS_IN, ServerThread

HI = [{"role": "user", "content": "hi"}]
BOUND = input_bound(len(orjson.dumps({"messages": HI})), 1)
ACTUAL = TOKENS_IN + 5  # micro-dollars each call really costs ($1 per million tokens)


def _one_client(
    served: ServerThread, key: str, max_tokens: int, calls: int, stream: bool
) -> list[int]:
    statuses = []
    with httpx.Client(base_url=served.url, headers={"authorization": f"Bearer {key}"}) as client:
        for _ in range(calls):
            reply = client.post(
                "/v1/chat/completions",
                json={"model": "chat", "messages": HI, "max_tokens": max_tokens,
                      "stream": stream},
            )  # fmt: skip
            statuses.append(reply.status_code)
            if stream and reply.status_code == 200:
                assert reply.text.endswith("data: [DONE]\n\n")
            if reply.status_code != 200:
                break
    return statuses


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize(("max_tokens", "worst_cases"), [(100, 10), (2_000, 0.5)])
def test_back_to_back_calls_all_succeed_until_the_budget_is_spent(
    served: ServerThread, max_tokens: int, worst_cases: float, stream: bool
) -> None:
    """A budget of ten worst cases (about a hundred real calls), and one smaller than a single
    worst case (each hold is clamped to all that is left): one client's calls, each sent
    right after the previous answer, are served until what they really cost reaches the
    limit."""
    gateway: Gateway = served.gateway  # type: ignore[attr-defined]
    limit = max(int(worst_cases * (BOUND + max_tokens)), 50 * ACTUAL)
    key = new_key(served, budgets=[{"period": "total", "usd_micros": limit}])
    statuses = _one_client(served, key, max_tokens, 500, stream)
    served.call(gateway.drain())
    [record] = served.call(gateway.list_keys())
    [spent] = served.call(gateway.counters.spent([f"{record.id}:usd:total:all"]))
    assert len(statuses) >= 50
    assert statuses[:-1] == [200] * (len(statuses) - 1), statuses
    assert statuses[-1] == 429
    assert limit - spent < BOUND + 1  # refused only once not one output token fits
