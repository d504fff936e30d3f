# On a feature class `User.balance` is a Feature, not the declared float; mypy reads the latter
# (so passing it to field_of() or writing `User.id | None` looks wrong to mypy).
# mypy: disable-error-code="attr-defined, assignment, call-arg, misc, arg-type, operator"
"""`@features`, `feature(...)`, `windowed(...)` and the refs feature classes hand out."""

from datetime import timedelta
from typing import Any

import pytest

import kairos as kr
from kairos import (
    DataFrame,
    DefinitionError,
    FeatureTime,
    Windowed,
    _,
    feature,
    features,
    windowed,
)
from kairos.definitions.feature import (
    FeatureOptions,
    FeatureRef,
    FieldSpec,
    HasManyRef,
    PathRef,
    class_spec,
    field_of,
    foreign_key_target,
    ref_of,
    snake_case,
)


@features
class Transaction:
    id: str
    user_id: "User.id"
    amount: float
    status: str
    ts: FeatureTime


@features(max_staleness="1m")
class User:
    id: str
    name: str
    balance: float = feature(
        default=0.0,
        max_staleness="5m",
        description="money on the account",
        tags=["finance", "pii"],
        owner="risk-team",
        min=0,
        max=1_000_000,
    )
    score: float = 0.5
    transactions: DataFrame[Transaction]
    txn_count: Windowed[int] = windowed("1d", "7d", expression=_.transactions.count())
    total: float = _.transactions[_.amount].sum()
    _cache: int


# --- namespaces --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("class_name", "namespace"),
    [
        ("User", "user"),
        ("CreditCard", "credit_card"),
        ("HTTPLog", "http_log"),
        ("UserHTTPLog", "user_http_log"),
        ("Card2Fa", "card2_fa"),
        ("already_snake", "already_snake"),
    ],
)
def test_snake_case(class_name: str, namespace: str) -> None:
    assert snake_case(class_name) == namespace


def test_namespace_is_the_snake_case_class_name() -> None:
    @features
    class CreditCard:
        id: str
        limit: float

    @features
    class HTTPLog:
        id: str

    assert CreditCard.limit.fqn == "credit_card.limit"
    assert field_of(HTTPLog.id).namespace == "http_log"


def test_namespace_and_class_options_can_be_given() -> None:
    @features(namespace="acct", max_staleness="1h", owner="ledger", tags=("core",))
    class Account:
        id: str
        balance: float

    spec = class_spec(Account)
    assert spec is not None
    assert spec.namespace == "acct"
    assert spec.max_staleness == timedelta(hours=1)
    assert spec.owner == "ledger"
    assert spec.tags == ("core",)
    assert Account.balance.fqn == "acct.balance"


def test_class_max_staleness_must_be_a_duration() -> None:
    with pytest.raises(DefinitionError, match="max_staleness='soon'"):

        @features(max_staleness="soon")
        class Account:
            id: str


def test_class_spec_is_none_for_plain_classes_and_instances() -> None:
    class Plain:
        id: str

    assert class_spec(Plain) is None
    assert class_spec(User(id="u1")) is None
    assert class_spec(User) is not None


# --- class attributes become Feature objects ---------------------------------------------


def test_annotated_attributes_become_features() -> None:
    assert isinstance(User.balance, kr.Feature)
    assert User.balance.fqn == "user.balance"
    spec = field_of(User.balance)
    assert isinstance(spec, FieldSpec)
    assert spec.namespace == "user"
    assert spec.name == "balance"
    assert spec.owner_class is User
    assert spec.implicit is False
    assert ref_of(User.name) == FeatureRef("user", (), "name")
    assert repr(User.balance) == "<feature user.balance>"


def test_private_annotations_are_not_features() -> None:
    spec = class_spec(User)
    assert spec is not None
    assert "_cache" not in spec.features
    assert set(spec.features) == {
        "id",
        "name",
        "balance",
        "score",
        "transactions",
        "txn_count",
        "total",
    }


def test_feature_options_are_recorded() -> None:
    options = field_of(User.balance).options
    assert options.default == 0.0
    assert options.max_staleness == timedelta(minutes=5)
    assert options.description == "money on the account"
    assert options.tags == ("finance", "pii")
    assert options.owner == "risk-team"
    assert (options.min, options.max) == (0, 1_000_000)
    assert options.expression is None


def test_a_plain_value_is_the_default() -> None:
    assert field_of(User.score).options == FeatureOptions(default=0.5)


def test_a_feature_without_value_has_no_default() -> None:
    assert field_of(User.name).options == FeatureOptions()
    assert repr(field_of(User.name).options.default) == "MISSING"


def test_an_expression_value_defines_the_feature() -> None:
    expression = field_of(User.total).options.expression
    assert expression is not None
    assert expression.same_as(_.transactions[_.amount].sum())


def test_feature_rejects_a_non_expression_expression() -> None:
    with pytest.raises(DefinitionError, match="must be an `_` expression"):
        feature(expression=5)


def test_feature_rejects_a_bad_max_staleness() -> None:
    with pytest.raises(DefinitionError, match="max_staleness='5 minutes'"):
        feature(max_staleness="5 minutes")


def test_bare_underscore_is_not_an_expression() -> None:
    with pytest.raises(DefinitionError, match=r"Bad\.x = _ is not an expression; write _\.x"):

        @features
        class Bad:
            id: str
            x: int = _


# --- windowed ------------------------------------------------------------------------------


def test_windowed_records_parsed_windows_and_expression() -> None:
    options = field_of(User.txn_count).options
    assert options.windows == (timedelta(days=1), timedelta(days=7))
    assert options.expression is not None
    assert options.expression.same_as(_.transactions.count())


def test_windowed_passes_its_options_through() -> None:
    options = windowed(
        "1h",
        expression=_.transactions.count(),
        default=0,
        max_staleness="30s",
        description="recent",
        tags=["t"],
        owner="me",
    )
    assert options.windows == (timedelta(hours=1),)
    assert options.default == 0
    assert options.max_staleness == timedelta(seconds=30)
    assert (options.description, options.tags, options.owner) == ("recent", ("t",), "me")


def test_windowed_needs_a_window() -> None:
    with pytest.raises(DefinitionError, match="at least one window"):
        windowed(expression=_.transactions.count())


@pytest.mark.parametrize("window", ["0s", 0, timedelta(0), timedelta(seconds=-5)])
def test_windowed_windows_must_be_positive(window: Any) -> None:
    with pytest.raises(DefinitionError, match="windows must be > 0"):
        windowed(window, expression=_.transactions.count())


def test_windowed_rejects_an_unparseable_window() -> None:
    with pytest.raises(DefinitionError, match="window='1 day'"):
        windowed("1 day", expression=_.transactions.count())


@pytest.mark.parametrize("expression", [None, 5, "count"])
def test_windowed_needs_an_expression(expression: Any) -> None:
    with pytest.raises(DefinitionError, match="must be an `_` expression"):
        windowed("1d", expression=expression)


@pytest.mark.parametrize(
    ("window", "fqn"),
    [
        ("24h", "user.txn_count[1d]"),
        ("1d", "user.txn_count[1d]"),
        ("1440m", "user.txn_count[1d]"),
        ("1w", "user.txn_count[7d]"),
        ("7d", "user.txn_count[7d]"),
    ],
)
def test_a_window_is_canonicalized(window: str, fqn: str) -> None:
    ref = User.txn_count[window]
    assert isinstance(ref, PathRef)
    assert ref_of(ref) == FeatureRef("user", (), "txn_count", fqn[len("user.txn_count[") : -1])
    assert ref.fqn == fqn
    assert str(ref) == fqn


def test_a_bad_window_is_a_definition_error() -> None:
    with pytest.raises(DefinitionError, match="window='soon'"):
        User.txn_count["soon"]


def test_a_windowed_value_is_not_a_relation() -> None:
    with pytest.raises(DefinitionError, match=r"'user\.txn_count\[1d\]' is a windowed value"):
        User.txn_count["1d"].balance  # noqa: B018


# --- relations -----------------------------------------------------------------------------


def test_a_foreign_key_creates_an_implicit_has_one_relation() -> None:
    relation = Transaction.user
    assert isinstance(relation, kr.Feature)
    assert field_of(relation).implicit is True
    assert field_of(relation).annotation == "User"
    assert field_of(relation).name == "user"
    assert relation.fqn == "transaction.user"
    assert field_of(Transaction.user_id).implicit is False


def test_an_explicit_relation_is_not_replaced() -> None:
    @features
    class Order:
        id: str
        user_id: "User.id"
        user: User

    assert field_of(Order.user).implicit is False
    assert field_of(Order.user).annotation is User


def test_a_foreign_key_given_as_a_feature_object_creates_the_relation_too() -> None:
    @features
    class Order:
        id: str
        user_id: User.id

    assert field_of(Order.user).implicit is True
    assert field_of(Order.user).annotation == "User"


@pytest.mark.parametrize("annotation", [str, "str", "user.id"])
def test_a_non_foreign_key_id_creates_no_relation(annotation: Any) -> None:
    @features
    class Order:
        id: str
        user_id: annotation

    spec = class_spec(Order)
    assert spec is not None
    assert "user" not in spec.features


def test_a_foreign_key_not_ending_in_id_creates_no_relation() -> None:
    @features
    class Order:
        id: str
        buyer: "User.id"

    spec = class_spec(Order)
    assert spec is not None
    assert set(spec.features) == {"id", "buyer"}


@pytest.mark.parametrize(
    ("annotation", "target"),
    [
        ("User.id", ("User", "id")),
        ("  User.id ", ("User", "id")),
        ("User.id | None", ("User", "id")),
        ("User.id|None", ("User", "id")),
        ("User.id | str", None),
        ("kr.FeatureTime", None),
        ("user.id", None),
        ("User.id.name", None),
        ("User", None),
        (str, None),
    ],
)
def test_foreign_key_target(annotation: Any, target: tuple[str, str] | None) -> None:
    assert foreign_key_target(annotation) == target


def test_foreign_key_target_of_a_feature() -> None:
    assert foreign_key_target(User.id) == ("User", "id")
    assert foreign_key_target(User.id | None) == ("User", "id")
    assert foreign_key_target(None | User.id) == ("User", "id")


@pytest.mark.parametrize("annotation", ["User.id | None", User.id | None])
def test_a_nullable_foreign_key_creates_the_relation_too(annotation: Any) -> None:
    @features
    class Order:
        id: str
        user_id: annotation

    assert field_of(Order.user).implicit is True
    assert field_of(Order.user).annotation == "User"
    assert Order.user.name.fqn == "order.user.name"


def test_a_has_one_path_is_a_feature_ref() -> None:
    ref = Transaction.user.balance
    assert isinstance(ref, PathRef)
    assert ref_of(ref) == FeatureRef("transaction", ("user",), "balance")
    assert ref.fqn == "transaction.user.balance"


def test_has_one_paths_can_be_walked_further() -> None:
    ref = Transaction.user.account.owner
    assert isinstance(ref, PathRef)
    assert ref_of(ref) == FeatureRef("transaction", ("user", "account"), "owner")
    assert ref.fqn == "transaction.user.account.owner"


def test_a_has_one_path_can_pick_a_window() -> None:
    ref = Transaction.user.txn_count["24h"]
    assert isinstance(ref, PathRef)
    assert ref_of(ref) == FeatureRef("transaction", ("user",), "txn_count", "1d")
    assert ref.fqn == "transaction.user.txn_count[1d]"


def test_a_has_one_path_to_a_feature_called_name() -> None:
    ref = Transaction.user.name
    assert isinstance(ref, PathRef)
    assert ref_of(ref) == FeatureRef("transaction", ("user",), "name")
    assert ref.fqn == "transaction.user.name"


def test_a_two_hop_path_to_a_feature_called_name() -> None:
    ref = Transaction.user.account.name
    assert isinstance(ref, PathRef)
    assert ref_of(ref) == FeatureRef("transaction", ("user", "account"), "name")
    assert ref.fqn == "transaction.user.account.name"


def test_has_many_items_make_a_has_many_ref() -> None:
    ref = User.transactions[_.amount, _.status == "ok"]
    assert isinstance(ref, HasManyRef)
    assert ref.fqn == "user.transactions"
    assert ref.ref == ref_of(User.transactions)
    assert ref.ref == FeatureRef("user", (), "transactions")
    assert len(ref.items) == 2
    assert ref.items[0].same_as(_.amount)
    assert ref.items[1].same_as(_.status == "ok")


@pytest.mark.parametrize(
    "name",
    ["name", "namespace", "options", "annotation", "owner_class", "implicit", "ref", "window"],
)
def test_every_public_attribute_name_walks_a_relation(name: str) -> None:
    for start, root, path in [
        (Transaction.user, "transaction", ("user",)),
        (Transaction.user.account, "transaction", ("user", "account")),
    ]:
        ref = getattr(start, name)
        assert isinstance(ref, PathRef)
        assert ref_of(ref) == FeatureRef(root, path, name)
        assert ref.fqn == ".".join((root, *path, name))


def test_private_attribute_names_do_not_walk_a_relation() -> None:
    with pytest.raises(AttributeError):
        Transaction.user._private  # noqa: B018


def test_ref_of_reads_every_kind_of_reference() -> None:
    plain = FeatureRef("user", (), "balance")
    assert ref_of(User.balance) == plain
    assert ref_of(plain) is plain
    assert ref_of(Transaction.user.balance) == FeatureRef("transaction", ("user",), "balance")
    assert ref_of(User.txn_count["24h"]) == FeatureRef("user", (), "txn_count", "1d")
    assert ref_of(User.transactions[_.amount]) == FeatureRef("user", (), "transactions")
    for other in ("user.balance", None, 42, User):
        assert ref_of(other) is None


def test_path_refs_compare_by_the_feature_they_name() -> None:
    assert Transaction.user.balance == Transaction.user.balance
    assert hash(Transaction.user.balance) == hash(Transaction.user.balance)
    assert Transaction.user.balance != Transaction.user.score
    assert User.txn_count["24h"] == User.txn_count["1d"]
    assert repr(Transaction.user.balance) == "<feature transaction.user.balance>"


def test_has_many_items_keep_feature_objects() -> None:
    ref = User.transactions[Transaction.amount]
    assert isinstance(ref, HasManyRef)
    assert ref.items == (Transaction.amount,)


# --- instances ----------------------------------------------------------------------------


def test_instances_hold_values() -> None:
    user = User(id="u1", name="x")
    assert user.id == "u1"
    assert user.name == "x"
    assert repr(user) == "User(id='u1', name='x')"


def test_unknown_instance_values_are_definition_errors() -> None:
    with pytest.raises(DefinitionError, match=r"User has no feature 'nmae'; did you mean 'name'\?"):
        User(id="u1", nmae="x")


def test_unknown_instance_values_without_a_near_match() -> None:
    with pytest.raises(DefinitionError) as info:
        User(zzz=1)
    assert str(info.value) == "User has no feature 'zzz'"
    assert isinstance(info.value, TypeError)
