"""Versions and aliases over SQLite and PostgreSQL: numbering, moves, rollbacks, history with
times, and errors that name what exists."""

from datetime import UTC, datetime

import numpy as np
import pytest
from sklearn.linear_model import LinearRegression

import kairos as kr
from kairos.models import ModelStore, UnknownModel, model_registry_from_url
from kairos.models.schema import ModelSchema


def model(slope: float) -> LinearRegression:
    x = np.arange(10.0).reshape(-1, 1)
    return LinearRegression().fit(x, x[:, 0] * slope)


def test_versions_are_numbered_per_name(store: ModelStore) -> None:
    assert store.register("a", model(1.0)).version == 1
    assert store.register("a", model(2.0)).version == 2
    assert store.register("b", model(3.0)).version == 1
    assert [v.version for v in store.versions("a")] == [1, 2]
    assert store.get("a").version == 2  # newest without a version or alias
    assert store.names() == ["a", "b"]


def test_alias_moves_and_rolls_back_with_history(store: ModelStore) -> None:
    for slope in (1.0, 2.0, 3.0):
        store.register("risk", model(slope))
    before = datetime.now(UTC)
    store.set_alias("risk", "prod", 1)
    store.set_alias("risk", "prod", 2)
    store.set_alias("risk", "prod", 3)
    assert store.get("risk", alias="prod").version == 3
    back = store.rollback("risk", "prod")
    assert (back.version, back.previous, back.action) == (2, 3, "rollback")
    assert store.rollback("risk", "prod").version == 1  # undo goes back step by step
    with pytest.raises(kr.InvalidInput, match="no earlier version to roll back to"):
        store.rollback("risk", "prod")
    assert store.get("risk", alias="prod").version == 1
    history = store.registry.history("risk", "prod")
    assert [(c.action, c.previous, c.version) for c in history] == [
        ("set", None, 1),
        ("set", 1, 2),
        ("set", 2, 3),
        ("rollback", 3, 2),
        ("rollback", 2, 1),
    ]
    assert all(before <= c.changed_at <= datetime.now(UTC) for c in history)
    assert store.get("risk", version=1).aliases == ("prod",)
    _, predictor = store.predictor("risk", alias="prod")
    assert predictor.predict([[4.0]])[0] == pytest.approx(4.0)


def test_aliases_given_at_registration_point_at_the_new_version(store: ModelStore) -> None:
    store.register("risk", model(1.0), aliases=["prod"])
    second = store.register("risk", model(2.0), aliases=["canary"])
    assert second.aliases == ("canary",)
    assert store.registry.aliases("risk") == {"canary": 2, "prod": 1}


def test_unknown_model_version_and_alias_name_what_exists(store: ModelStore) -> None:
    store.register("risk", model(1.0), aliases=["prod"])
    with pytest.raises(UnknownModel, match=r"no model named 'rsik'; did you mean 'risk'\?"):
        store.get("rsik")
    with pytest.raises(UnknownModel, match="has no version 7; it has versions 1 to 1"):
        store.get("risk", version=7)
    with pytest.raises(UnknownModel, match=r"no alias 'prd'; did you mean 'prod'\?.*prod"):
        store.get("risk", alias="prd")
    with pytest.raises(UnknownModel, match="has no version 3"):
        store.set_alias("risk", "prod", 3)
    with pytest.raises(kr.InvalidInput, match="numbers are versions"):
        store.set_alias("risk", "2", 1)
    with pytest.raises(kr.InvalidInput, match="model name"):
        store.register("bad name!", model(1.0))


def test_an_unreachable_registry_is_backend_unavailable() -> None:
    from kairos.errors import BackendUnavailable
    from kairos.models import model_registry_from_url

    registry = model_registry_from_url("postgresql://nobody@127.0.0.1:1/none?connect_timeout=2")
    with pytest.raises(BackendUnavailable, match="model registry"):
        registry.get("risk")


def test_alias_history_keeps_who_moved_it(store: ModelStore) -> None:
    store.register("risk", model(1.0), aliases=["prod"])
    store.register("risk", model(2.0))
    moved = store.set_alias("risk", "prod", 2, by="key:3f9a0c1d")
    back = store.rollback("risk", "prod", by="dashboard")
    assert (moved.changed_by, back.changed_by) == ("key:3f9a0c1d", "dashboard")
    assert back.to_json()["changed_by"] == "dashboard"
    history = store.registry.history("risk", "prod")
    assert [(c.action, c.changed_by) for c in history] == [
        ("set", None),  # the move registration made names no one
        ("set", "key:3f9a0c1d"),
        ("rollback", "dashboard"),
    ]
    with pytest.raises(kr.InvalidInput, match="must be who moved the alias") as error:
        store.set_alias("risk", "prod", 1, by="")
    assert error.value.field == "by"


OLD_HISTORY = """create table kairos_model_alias_history (
    name text not null, alias text not null, seq integer not null,
    version integer not null, previous integer, action text not null,
    undone integer not null default 0, changed_at text not null,
    primary key (name, alias, seq))"""


def test_a_registry_from_before_changed_by_gets_the_column(registry_url: str) -> None:
    """A history table an older kairos made (no changed_by) gets the column when the registry
    opens; its rows read as None and new moves keep who made them."""
    old = model_registry_from_url(registry_url)
    with old._tx() as cur:  # the tables as an older kairos left them, one move recorded
        cur.execute("drop table kairos_model_alias_history")
        cur.execute(OLD_HISTORY)
        cur.execute(
            "insert into kairos_model_alias_history (name, alias, seq, version, previous, "
            "action, undone, changed_at) values ('risk', 'prod', 1, 1, null, 'set', 0, ?)",
            (datetime.now(UTC).isoformat(),),
        )
    old.close()
    for _ in range(2):  # opening it again finds the column there
        registry = model_registry_from_url(registry_url)
        registry.add("risk", "0" * 64, "sklearn", "skops", 1, ModelSchema(("x",)), {}, {})
        registry.set_alias("risk", "prod", 1, by="ops")
        assert [c.changed_by for c in registry.history("risk")][:2] == [None, "ops"]
        registry.close()
