"""Closing a client closes everything it opened, even when one part fails to close: the rest
(the LLM replicas last of all) still close, and the first failure is raised after."""

from pathlib import Path

import pytest

import kairos as kr
from kairos import features, online


@features
class Thing:
    id: str
    size: int


@online
def size(tid: Thing.id) -> Thing.size:
    return len(tid)


def test_a_part_that_fails_to_close_does_not_keep_the_rest_open(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = f"sqlite:///{tmp_path / 'log.db'}"
    client = kr.Client(definitions=[Thing, size], query_log=log)
    result = client.query({Thing.id: "abc"}, [Thing.size])
    assert result.get_value(Thing.size) == 3
    closed: list[str] = []

    async def broken() -> None:
        raise RuntimeError("the store would not close")

    async def llm_closed() -> None:
        closed.append("llm")

    monkeypatch.setattr(client.store, "close", broken)
    monkeypatch.setattr(client.llm, "aclose", llm_closed)
    with pytest.raises(RuntimeError, match="would not close"):
        client.close()
    assert closed == ["llm"]  # after the failure, the replicas were still stopped
    with kr.Client(definitions=[Thing, size], query_log=log) as again:  # flushed on close
        assert again.log.get(result.meta.query_id) is not None
