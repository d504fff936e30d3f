"""A result's `to_dict()` is its JSON shape: the HTTP replies are made of it, and the query
log keeps each trace step's (times whole there, rounded to 0.1 µs in replies)."""

from datetime import UTC, datetime

import orjson
import pytest

from kairos.engine.result import (
    BulkResult,
    ColumnData,
    FeatureError,
    FeatureValue,
    NodeTiming,
    QueryMeta,
    QueryResult,
)
from kairos.stores.codec import decode, encode

NOW = datetime(2026, 6, 1, 12, tzinfo=UTC)
SEEN = datetime(2026, 6, 1, 11, tzinfo=UTC)
STEP = NodeTiming(0, "python", "user.profile", 0.123456789, 1.00004999, 2, "ok")
CALL = {"model": "m", "prompt_tokens": 3}


def test_a_trace_step_rounds_only_when_asked() -> None:
    assert STEP.to_dict() == {
        "node": 0,
        "kind": "python",
        "label": "user.profile",
        "start_ms": 0.123456789,
        "duration_ms": 1.00004999,
        "rows": 2,
        "status": "ok",
    }
    assert (STEP.to_dict(4)["start_ms"], STEP.to_dict(4)["duration_ms"]) == (0.1235, 1.0)


def test_an_error_names_its_row_unless_told_not_to() -> None:
    error = FeatureError("user.risk", "timeout", "took over 1s", 1, "risk")
    assert error.to_dict() == {
        "feature": "user.risk",
        "code": "timeout",
        "message": "took over 1s",
        "resolver": "risk",
        "row": 1,
    }
    assert error.to_dict(row=False) == {
        "feature": "user.risk",
        "code": "timeout",
        "message": "took over 1s",
        "resolver": "risk",
    }


def test_a_query_result_as_json() -> None:
    error = FeatureError("user.risk", "timeout", "took over 1s")
    result = QueryResult(
        {
            "user.name": FeatureValue("user.name", "Ada", SEEN, "cache"),
            "user.risk": FeatureValue("user.risk", None, None, None, error),
        },
        QueryMeta("q1", NOW, 2.5, 1, 1, 0, (CALL,)),
        [STEP],
    )
    assert result.to_dict() == {
        "query_id": "q1",
        "now": NOW,
        "values": {"user.name": "Ada", "user.risk": None},
        "features": {
            "user.name": {"value": "Ada", "observed_at": SEEN, "source": "cache", "cached": True},
            "user.risk": {"value": None, "observed_at": None, "source": None, "cached": False},
        },
        "errors": [
            {"feature": "user.risk", "code": "timeout", "message": "took over 1s", "resolver": None}
        ],
        "meta": {"duration_ms": 2.5, "cache_hits": 1, "computed": 0, "llm": [CALL]},
        "trace": [STEP.to_dict(4)],
    }


def test_a_bulk_result_as_json() -> None:
    error = FeatureError("user.risk", "timeout", "took over 1s", 1)
    column = ColumnData([0.5, None], [SEEN, None], ["risk", None], [None, error])
    result = BulkResult({"user.risk": column}, QueryMeta("q2", NOW, 3.0, 2, 0, 2), [STEP])
    assert result.to_dict() == {
        "query_id": "q2",
        "now": NOW,
        "rows": 2,
        "values": {"user.risk": [0.5, None]},
        "features": {"user.risk": {"observed_at": [SEEN, None], "source": ["risk", None]}},
        "errors": [error.to_dict()],
        "meta": {"duration_ms": 3.0, "cache_hits": 0, "computed": 2, "llm": []},
        "trace": [STEP.to_dict(4)],
    }


# times of 0.1 µs or coarser, so that the reply's rounding keeps them
ROUND_STEP = NodeTiming(1, "sql", "user", 0.25, 1.5, 2, "ok")
ENCODINGS = {
    "plain JSON": lambda tree: orjson.loads(orjson.dumps(tree)),
    "tagged JSON": lambda tree: decode(encode(tree)),
}


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_a_query_result_reads_back_from_its_json(encoding: str) -> None:
    error = FeatureError("user.risk", "timeout", "took over 1s", resolver="model:risk")
    result = QueryResult(
        {
            "user.name": FeatureValue("user.name", "Ada", SEEN, "cache"),
            "user.risk": FeatureValue("user.risk", None, None, None, error),
        },
        QueryMeta("q1", NOW, 2.5, 1, 1, 0, (CALL,)),
        [ROUND_STEP],
    )
    assert QueryResult.from_dict(ENCODINGS[encoding](result.to_dict())) == result


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_a_bulk_result_reads_back_from_its_json(encoding: str) -> None:
    error = FeatureError("user.risk", "timeout", "took over 1s", 1, "model:risk")
    columns = {
        "user.risk": ColumnData([0.5, None], [SEEN, None], ["risk", None], [None, error]),
        "user.name": ColumnData(["Ada", "Bo"], [NOW, NOW], ["cache", "user"], [None, None]),
    }
    result = BulkResult(columns, QueryMeta("q2", NOW, 3.0, 2, 1, 3, (CALL,)), [ROUND_STEP])
    back = BulkResult.from_dict(ENCODINGS[encoding](result.to_dict()))
    assert back == result
    assert back.row(1)["user.risk"].error == error
