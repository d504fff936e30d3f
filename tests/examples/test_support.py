"""The support example end to end on the real local models: articles written as events and
embedded in process, retrieval by meaning in the customer's language as of the query's now, and
an answer from Gemma 3 270M whose prompt tokens are attributed to each retrieved article."""

from typing import Any

import pytest

from examples.support import demo


@pytest.fixture(scope="module")
def report() -> dict[str, Any]:
    return demo.run()


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_refund_question_finds_the_policy_in_force_at_each_time(
    report: dict[str, Any],
) -> None:
    assert report["versions"] == report["articles"] + 1  # the refund policy has two versions
    now, before = report["found"]["now"], report["found"]["10 days ago"]
    assert now[0]["id"] == before[0]["id"] == "refunds"
    assert "within 30 days" in now[0]["text"] and "within 14 days" in before[0]["text"]
    for rows in (now, before):
        assert [r["distance"] for r in rows] == sorted(r["distance"] for r in rows)
        assert {r["lang"] for r in rows} == {"en"}


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_more_articles_cost_more_prompt_tokens_each_attributed(report: dict[str, Any]) -> None:
    for ticket, (few, many) in report["answers"].items():
        for call, k in ((few, 3), (many, 20)):
            counts = call["tokens_by_feature"]
            assert sum(counts.values()) == call["prompt_tokens"], ticket
            articles = [name for name in counts if name.startswith(f"articles_{k}[")]
            assert articles == [f"articles_{k}[{i}]" for i in range(len(articles))]
            assert all(counts[name] > 0 for name in articles)
            assert 0 < call["ttft_ms"] <= call["total_ms"]
            assert isinstance(call["answer"], str) and call["completion_tokens"] >= 1
            assert {"account_name", "plan", "failed_charges_30d", "question"} <= set(counts)
        # three articles are in German: a German customer's k = 20 finds those three only
        expected = (3, 3) if ticket == "t2" else (3, 20)
        found = tuple(
            sum(1 for name in call["tokens_by_feature"] if "[" in name) for call in (few, many)
        )
        assert found == expected, ticket
    english = report["answers"]["t1"]
    assert english[1]["prompt_tokens"] > 3 * english[0]["prompt_tokens"]
