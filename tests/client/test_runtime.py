"""The client owns one runtime: moving a model alias swaps it whole (a new planner over new
resolvers, the same graph, engine and stores), and the parts stay read-only from outside."""

from pathlib import Path

import pytest

import kairos as kr
from tests.models.test_model_features import Account, config, inputs, linear


def test_an_alias_move_swaps_the_runtime_whole(tmp_path: Path) -> None:
    with kr.Client(definitions=[Account, inputs], config=config(tmp_path)) as client:
        before = client.runtime
        first = client.plan([Account.id], [Account.score])
        client.models.register("score", linear(1.0, 1.0), aliases=["prod"], inputs=["a", "b"])
        after = client.runtime

        assert after is not before and after.planner is not before.planner
        assert (after.graph, after.engine, after.store, after.offline) == (
            before.graph,
            before.engine,
            before.store,
            before.offline,
        )
        assert client.planner is after.planner
        assert client.resolvers is after.planner.resolvers is after.resolvers
        assert first.versions["account.score"] == "score@unregistered"
        assert client.plan([Account.id], [Account.score]).versions["account.score"] == "score@v1"
        # the runtime a running query holds still plans as it did
        assert before.planner.plan(["account.id"], ["account.score"]) is first
        assert client.query({Account.id: "acc4"}, [Account.score]).get_value(
            Account.score
        ) == pytest.approx(6.0)


def test_the_runtimes_parts_are_read_only(tmp_path: Path) -> None:
    with kr.Client(definitions=[Account, inputs], config=config(tmp_path)) as client:
        planner = client.planner
        with pytest.raises(AttributeError):
            client.planner = planner  # type: ignore[misc]
        with pytest.raises(AttributeError):
            client.resolvers = planner.resolvers  # type: ignore[misc]
        with pytest.raises(AttributeError):  # frozen: a new runtime is made, never changed
            client.runtime.planner = planner  # type: ignore[misc]
        assert client.offline_writer is None and client.store is client.runtime.store
        with pytest.raises(kr.KairosError, match="keeps no offline store"):
            client.offline_store()
