"""The planner: passes, errors that name the fix, caching, immutability and explain()."""

import dataclasses
import os
from pathlib import Path

import pytest

import kairos as kr
from kairos import Features, online
from kairos.definitions.graph import Graph
from kairos.planner import Planner
from kairos.planner.bind import bind_query
from kairos.planner.order import order
from kairos.planner.plan import (
    DefaultNode,
    ExpressionNode,
    RelationNode,
    ResolverNode,
)
from kairos.planner.resolve import resolve
from kairos.resolvers import ResolverSet
from tests.planner.defs import ALL, Account, Event, Owner, account_row, owner_name

GOLDEN = Path(__file__).parent / "golden"


def planner_for(*extra: object) -> Planner:
    project = kr.Project.from_objects([*ALL, *extra])
    graph = Graph.build(project.feature_classes)
    return Planner(graph, ResolverSet.build(graph, project.resolvers))


def test_passes_run_in_order_and_each_is_pure() -> None:
    planner = planner_for()
    query = bind_query(planner.graph, ["owner.id"], ["owner.score"])
    assert query.root == "owner"
    resolution = resolve(planner.graph, planner.resolvers, query)
    kinds = {name: p.kind for name, p in resolution.producers.items()}
    assert kinds == {
        "owner.id": "input",
        "owner.score": "resolver",
        "owner.name": "resolver",
        "owner.account_count": "expression",
        "owner.accounts": "resolver",
    }
    plan = order(resolution, planner.default_timeout)
    labels = [n.label for n in plan.nodes]
    # every node comes after the nodes it reads from
    position = {n.id: i for i, n in enumerate(plan.nodes)}
    for node in plan.nodes:
        assert all(position[a] < position[node.id] for a in node.after)
    assert labels.index("owner_accounts") < labels.index("owner.account_count")
    assert labels[-1] == "owner_score"
    score = plan.node("owner.score")
    assert score is not None and score.args == ("owner.name", "owner.account_count", None)
    assert score.timeout.total_seconds() == 0.25


def test_explain_matches_golden_text() -> None:
    planner = planner_for()
    text = planner.plan(["account.id"], ["account.doubled", "account.owner.score"]).explain()
    golden = GOLDEN / "account_owner_score.txt"
    if os.environ.get("KAIROS_UPDATE_GOLDEN"):
        golden.write_text(text + "\n")
    assert text + "\n" == golden.read_text()


def test_has_one_path_goes_through_a_relation_node() -> None:
    plan = planner_for().plan(["account.id"], ["account.owner.name"])
    relation = plan.node("account.owner.id")
    assert relation is not None and relation.kind == "relation"
    assert relation.args == ("account.owner_id",)
    name = plan.node("account.owner.name")
    assert name is not None and name.path == ("owner",) and name.key == "account.owner.id"


def test_plans_are_cached_by_names_regardless_of_input_order() -> None:
    planner = planner_for()
    first = planner.plan(["account.id", "account.balance"], ["account.doubled"])
    second = planner.plan(["account.balance", "account.id"], ["account.doubled"])
    assert first is second
    assert planner.plan(["account.id"], ["account.doubled"]) is not first


def test_plans_are_immutable() -> None:
    plan = planner_for().plan(["account.id"], ["account.doubled"])
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.root = "x"  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.nodes[0].label = "x"  # type: ignore[misc]
    with pytest.raises(TypeError):
        plan.producer["account.doubled"] = 3  # type: ignore[index]


def test_supplied_input_replaces_its_producer() -> None:
    plan = planner_for().plan(["account.id", "account.balance"], ["account.doubled"])
    assert [n.kind for n in plan.nodes] == ["expression"]
    assert plan.node("account.balance") is None


def test_default_is_used_when_nothing_computes_a_feature() -> None:
    plan = planner_for().plan(["account.id"], ["account.tier"])
    node = plan.node("account.tier")
    assert isinstance(node, DefaultNode) and node.kind == "default" and node.default == "basic"


def test_each_kind_of_step_is_a_node_class_carrying_only_its_own_fields() -> None:
    outputs = ["account.doubled", "account.owner.name", "account.tier"]
    plan = planner_for().plan(["account.id"], outputs)
    nodes = {n.label: n for n in plan.nodes}
    row, doubled = nodes["account_row"], nodes["account.doubled"]
    relation, tier = nodes["account.owner.id"], nodes["account.tier"]
    assert isinstance(row, ResolverNode) and row.resolver.name == "account_row"
    assert row.kind == "python"  # a resolver node is named after its resolver's kind
    assert isinstance(doubled, ExpressionNode) and doubled.expression.source == "(_.balance * 2)"
    assert isinstance(relation, RelationNode) and relation.kind == "relation"
    assert isinstance(tier, DefaultNode) and tier.default == "basic"
    for field in ("resolver", "expression", "default"):
        assert not hasattr(relation, field)
    assert not hasattr(row, "expression") and not hasattr(doubled, "resolver")


def test_unknown_feature_suggests_the_near_match() -> None:
    with pytest.raises(kr.UnknownFeature, match=r"did you mean 'account\.balance'"):
        planner_for().plan(["account.id"], ["account.balanse"])


def test_missing_primary_key_names_the_input_to_pass() -> None:
    with pytest.raises(kr.MissingInput, match=r"'owner\.id'"):
        planner_for().plan([], ["owner.name"])


def test_no_path_names_the_feature_and_the_fix() -> None:
    with pytest.raises(kr.NoPath, match=r"nothing computes 'event\.ts'.*add an @online resolver"):
        planner_for().plan(["event.id"], ["event.ts"])


def test_a_key_missing_deep_in_the_graph_is_reported_as_the_input_to_pass() -> None:
    with pytest.raises(kr.MissingInput, match=r"needs 'owner\.id' in its input"):
        planner_for().plan(["owner.account_count"], ["owner.score"])


def test_no_path_through_a_resolver_says_why_the_resolver_cannot_run() -> None:
    @online
    def from_event_time(ts: Event.ts) -> Account.balance:
        return 1.0

    with pytest.raises(kr.DefinitionError, match="same class"):
        planner_for(from_event_time)

    @online
    def needs_tier_of_owner(name: Owner.name) -> Owner.score:
        return 1.0

    with pytest.raises(kr.NoPath, match=r"'needs_tier_of_owner' could.*nothing computes"):
        Planner(
            (graph := Graph.build([Account, Owner, Event])),
            ResolverSet.build(graph, [needs_tier_of_owner]),
        ).plan(["owner.id"], ["owner.score"])


def test_outputs_about_two_entities_are_rejected() -> None:
    with pytest.raises(kr.PlanError, match="several classes"):
        planner_for().plan(["owner.id"], ["owner.name", "account.balance"])


def test_ambiguous_resolvers_are_named() -> None:
    @online
    def other_name(oid: Owner.id) -> Owner.name:
        return "bob"

    with pytest.raises(kr.AmbiguousResolvers, match=r"'owner_name', 'other_name'|'other_name', "):
        planner_for(other_name).plan(["owner.id"], ["owner.name"])


def test_cycles_name_every_feature_in_the_loop() -> None:
    @online
    def balance_from_tier(t: Account.tier) -> Account.balance:
        return 1.0

    @online
    def tier_from_balance(b: Account.balance) -> Account.tier:
        return "gold"

    project = kr.Project.from_objects(
        [Account, Owner, Event, balance_from_tier, tier_from_balance, owner_name]
    )
    graph = Graph.build(project.feature_classes)
    planner = Planner(graph, ResolverSet.build(graph, project.resolvers))
    with pytest.raises(kr.CycleError) as caught:
        planner.plan(["account.id"], ["account.balance"])
    message = str(caught.value)
    assert "account.balance -> account.tier -> account.balance" in message
    assert "pass one of them as an input" in message


def test_resolver_outputs_from_one_call_share_a_node() -> None:
    plan = planner_for().plan(["account.id"], ["account.balance", "account.owner_id"])
    assert len(plan.nodes) == 1
    assert plan.nodes[0].label == account_row.name
    assert set(plan.nodes[0].needed) == {"account.balance", "account.owner_id"}


def test_resolver_inputs_and_outputs_must_start_from_one_class() -> None:
    @online
    def crossing(aid: Account.id) -> Features[Owner.name]:
        return ("x",)

    project = kr.Project.from_objects([Account, Owner, Event, crossing])
    graph = Graph.build(project.feature_classes)
    with pytest.raises(kr.DefinitionError, match=r"'crossing'.*same class"):
        ResolverSet.build(graph, project.resolvers)


def test_two_resolvers_with_one_name_are_rejected() -> None:
    @online(name="owner_name")
    def duplicate(oid: Owner.id) -> Owner.name:
        return "x"

    project = kr.Project.from_objects([Account, Owner, Event, owner_name, duplicate])
    graph = Graph.build(project.feature_classes)
    with pytest.raises(kr.DefinitionError, match="two resolvers are named 'owner_name'"):
        ResolverSet.build(graph, project.resolvers)
