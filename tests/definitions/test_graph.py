# On a feature class `User.balance` is a Feature, not the declared float; mypy reads the latter.
# mypy: disable-error-code="attr-defined, assignment"
"""`Graph.build`: value types, keys, relations, staleness, descriptions, lookups and errors."""

import typing
from datetime import date, datetime, timedelta
from typing import Any

import pytest

from kairos import (
    DataFrame,
    DefinitionError,
    FeatureTime,
    Primary,
    UnknownFeature,
    Windowed,
    _,
    feature,
    features,
    windowed,
)
from kairos.definitions.feature import FeatureRef
from kairos.definitions.graph import Graph
from kairos.definitions.types import ValueType


@features
class Transaction:
    id: str
    user_id: "User.id"
    amount: float
    ts: FeatureTime


@features(max_staleness="1m")
class User:
    id: str
    # the user's display name
    name: str
    # what the user owns,
    # in euros
    balance: float = feature(max_staleness="5m")
    email: str = feature(description="from the signup form")  # not this one
    phone: str  # a trailing comment
    # the comment above wins
    fax: str  # over a trailing one
    # separated from the field by a blank line

    nickname: str
    transactions: DataFrame[Transaction]
    # transactions in the trailing window
    txn_count: Windowed[int] = windowed("1d", "7d", expression=_.transactions.count())
    recent: Windowed[int] = windowed("1h", expression=_.transactions.count(), max_staleness="0s")


GRAPH = Graph.build([User, Transaction])


# --- value types --------------------------------------------------------------------------


@features
class Everything:
    id: int
    count: int
    ratio: float
    label: str
    flag: bool
    seen_at: datetime
    born_on: date
    gap: timedelta
    tags: list[str]
    matrix: list[list[int]]
    things: list  # type: ignore[type-arg]
    extra: dict  # type: ignore[type-arg]
    scores: dict[str, float]
    maybe: float | None
    optional: typing.Optional[str]  # noqa: UP045 - the typing spelling must work too
    anything: Any
    key: Primary[int] | None


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("id", ValueType("int")),
        ("count", ValueType("int")),
        ("ratio", ValueType("float")),
        ("label", ValueType("str")),
        ("flag", ValueType("bool")),
        ("seen_at", ValueType("datetime")),
        ("born_on", ValueType("date")),
        ("gap", ValueType("timedelta")),
        ("tags", ValueType("list", item=ValueType("str"))),
        ("matrix", ValueType("list", item=ValueType("list", item=ValueType("int")))),
        ("things", ValueType("list", item=ValueType("any", nullable=True))),
        ("extra", ValueType("dict")),
        ("scores", ValueType("dict")),
        ("maybe", ValueType("float", nullable=True)),
        ("optional", ValueType("str", nullable=True)),
        ("anything", ValueType("any", nullable=True)),
        ("key", ValueType("int", nullable=True)),
    ],
)
def test_annotations_map_to_value_types(name: str, expected: ValueType) -> None:
    info = Graph.build([Everything]).feature("everything", name)
    assert info.kind == "scalar"
    assert info.type == expected


def test_value_types_print_as_annotations() -> None:
    graph = Graph.build([Everything])
    assert str(graph.feature("everything", "maybe").type) == "float | None"
    assert str(graph.feature("everything", "tags").type) == "list[str]"
    assert str(graph.feature("everything", "flag").type) == "bool"


class Money:
    pass


@pytest.mark.parametrize(
    "annotation",
    [set[int], int | str, object, Money, list[Money], tuple[int, int], "Money"],
    ids=["set", "union", "object", "class", "list-of-class", "tuple", "string-class"],
)
def test_unsupported_annotations_name_the_field_and_the_fix(annotation: Any) -> None:
    @features
    class Wallet:
        id: str
        amount: annotation

    with pytest.raises(DefinitionError) as info:
        Graph.build([Wallet])
    message = str(info.value)
    assert message.startswith("Wallet.amount: unsupported annotation")
    assert "use int, float, str, bool, datetime, date, list[T], dict, T | None" in message


def test_an_unreadable_string_annotation_names_the_field() -> None:
    @features
    class Wallet:
        id: str
        amount: "Decimal"

    with pytest.raises(DefinitionError, match=r"Wallet\.amount: cannot read annotation 'Decimal'"):
        Graph.build([Wallet])


def test_only_feature_classes_can_be_built() -> None:
    class Plain:
        id: str

    with pytest.raises(DefinitionError, match="is not a @features class"):
        Graph.build([Plain])


# --- keys and time ------------------------------------------------------------------------


def test_id_is_the_primary_key_by_default() -> None:
    info = GRAPH.cls("user")
    assert info.primary == "id"
    assert GRAPH.feature("user", "id").is_primary
    assert not GRAPH.feature("user", "name").is_primary


def test_primary_marks_a_key_not_called_id() -> None:
    @features
    class Card:
        number: Primary[str]
        id: str

    graph = Graph.build([Card])
    assert graph.cls("card").primary == "number"
    assert graph.feature("card", "number").is_primary
    assert graph.feature("card", "number").type == ValueType("str")
    assert not graph.feature("card", "id").is_primary


def test_a_class_without_primary_key_is_an_error() -> None:
    @features
    class Card:
        number: str

    with pytest.raises(DefinitionError) as info:
        Graph.build([Card])
    assert str(info.value) == "Card has no primary key; add `id: str` or mark one `Primary[str]`"


def test_two_primary_keys_are_an_error() -> None:
    @features
    class Card:
        number: Primary[str]
        code: Primary[str]

    with pytest.raises(DefinitionError, match=r"Card has two primary keys \('number' and 'code'\)"):
        Graph.build([Card])


def test_feature_time_is_recorded() -> None:
    info = GRAPH.cls("transaction")
    assert info.feature_time == "ts"
    ts = GRAPH.feature("transaction", "ts")
    assert ts.is_feature_time
    assert ts.type == ValueType("datetime")
    assert GRAPH.cls("user").feature_time is None


def test_two_feature_times_are_an_error() -> None:
    @features
    class Event:
        id: str
        start: FeatureTime
        end: FeatureTime

    with pytest.raises(DefinitionError, match=r"Event has two FeatureTime fields"):
        Graph.build([Event])


# --- relations ----------------------------------------------------------------------------


def test_foreign_key_takes_the_type_of_its_target() -> None:
    fk = GRAPH.feature("transaction", "user_id")
    assert fk.kind == "scalar"
    assert fk.fk_target == ("user", "id")
    assert fk.type == ValueType("str")


def test_foreign_key_to_an_int_primary_key_is_an_int() -> None:
    @features
    class Shop:
        id: int

    @features
    class Order:
        id: int
        shop_id: "Shop.id"

    assert Graph.build([Shop, Order]).feature("order", "shop_id").type == ValueType("int")


def test_a_nullable_foreign_key_is_a_nullable_foreign_key_of_the_target_type() -> None:
    @features
    class Shop:
        id: int

    @features
    class Order:
        id: int
        shop_id: "Shop.id | None"
        backup_shop_id: Shop.id | None

    graph = Graph.build([Shop, Order])
    for name in ("shop_id", "backup_shop_id"):
        fk = graph.feature("order", name)
        assert fk.kind == "scalar"
        assert fk.fk_target == ("shop", "id")
        assert fk.type == ValueType("int", nullable=True)
    for name in ("shop", "backup_shop"):
        relation = graph.feature("order", name)
        assert relation.kind == "has_one"
        assert relation.target == "shop"
        assert relation.join_key == f"{name}_id"


def test_implicit_has_one_from_a_foreign_key() -> None:
    relation = GRAPH.feature("transaction", "user")
    assert relation.kind == "has_one"
    assert relation.type is None
    assert relation.target == "user"
    assert relation.join_key == "user_id"


def test_explicit_has_one_uses_the_only_foreign_key() -> None:
    @features
    class Order:
        id: str
        buyer_id: "User.id"
        buyer: User

    relation = Graph.build([User, Transaction, Order]).feature("order", "buyer")
    assert (relation.kind, relation.target, relation.join_key) == ("has_one", "user", "buyer_id")


def test_explicit_has_one_prefers_the_foreign_key_named_after_it() -> None:
    @features
    class Order:
        id: str
        seller_id: "User.id"
        buyer_id: "User.id"
        seller: User
        buyer: User

    graph = Graph.build([User, Transaction, Order])
    assert graph.feature("order", "seller").join_key == "seller_id"
    assert graph.feature("order", "buyer").join_key == "buyer_id"


def test_explicit_has_one_without_foreign_key_names_the_fix() -> None:
    @features
    class Order:
        id: str
        user: User

    with pytest.raises(DefinitionError) as info:
        Graph.build([User, Transaction, Order])
    assert str(info.value) == "Order.user: no foreign key to User; add e.g. `user_id: 'User.id'`"


def test_explicit_has_one_with_ambiguous_foreign_keys_names_them() -> None:
    @features
    class Order:
        id: str
        seller_id: "User.id"
        buyer_id: "User.id"
        owner: User

    with pytest.raises(
        DefinitionError, match=r"Order\.owner: several foreign keys to User \(seller_id, buyer_id\)"
    ):
        Graph.build([User, Transaction, Order])


def test_has_many_joins_on_the_childs_foreign_key() -> None:
    relation = GRAPH.feature("user", "transactions")
    assert relation.kind == "has_many"
    assert relation.type is None
    assert relation.target == "transaction"
    assert relation.join_key == "user_id"


def test_has_many_whose_child_has_no_foreign_key_names_the_fix() -> None:
    @features
    class Comment:
        id: str
        text: str

    @features
    class Post:
        id: str
        comments: DataFrame[Comment]

    with pytest.raises(DefinitionError) as info:
        Graph.build([Post, Comment])
    assert str(info.value) == (
        "Post.comments: Comment has no foreign key to Post; add `post_id: 'Post.id'` to it"
    )


def test_has_many_whose_child_has_two_foreign_keys_is_an_error() -> None:
    @features
    class Post:
        id: str
        comments: "DataFrame[Comment]"

    @features
    class Comment:
        id: str
        post_id: "Post.id"
        reply_to_id: "Post.id"

    with pytest.raises(
        DefinitionError,
        match=r"Post\.comments: Comment has several foreign keys to Post \(post_id, reply_to_id\)",
    ):
        Graph.build([Post, Comment])


def test_dataframe_of_something_else_is_an_error() -> None:
    @features
    class Post:
        id: str
        comments: DataFrame[str]

    with pytest.raises(DefinitionError, match=r"Post\.comments: DataFrame\[\.\.\.\] needs a"):
        Graph.build([Post])


def test_has_many_child_outside_the_project_is_a_definition_error() -> None:
    with pytest.raises(DefinitionError, match="Transaction"):
        Graph.build([User])


def test_has_many_accepts_a_forward_reference_to_the_child() -> None:
    @features
    class Post:
        id: str
        comments: DataFrame["Comment"]

    @features
    class Comment:
        id: str
        post_id: "Post.id"

    assert Graph.build([Post, Comment]).feature("post", "comments").join_key == "post_id"


def test_fully_quoted_dataframe_annotation_is_a_forward_reference() -> None:
    @features
    class Post:
        id: str
        comments: "DataFrame[Comment]"

    @features
    class Comment:
        id: str
        post_id: "Post.id"

    relation = Graph.build([Post, Comment]).feature("post", "comments")
    assert (relation.kind, relation.target, relation.join_key) == ("has_many", "comment", "post_id")


def test_foreign_key_to_a_class_outside_the_project_is_an_error() -> None:
    with pytest.raises(
        DefinitionError, match=r"Transaction\.user_id is a foreign key to user\.id, whose class"
    ):
        Graph.build([Transaction])


def test_foreign_key_to_a_missing_feature_is_an_error() -> None:
    @features
    class Order:
        id: str
        user_id: "User.uid"

    with pytest.raises(
        DefinitionError, match=r"Order\.user_id: cannot read annotation 'User\.uid'"
    ):
        Graph.build([User, Transaction, Order])


# --- namespaces ---------------------------------------------------------------------------


def test_two_classes_with_one_namespace_are_an_error() -> None:
    @features(namespace="user")
    class Customer:
        id: str

    with pytest.raises(DefinitionError) as info:
        Graph.build([User, Customer])
    message = str(info.value)
    assert message.startswith("two feature classes use namespace 'user': ")
    assert "tests.definitions.test_graph.User and " in message
    assert "test_two_classes_with_one_namespace_are_an_error.<locals>.Customer" in message
    assert message.endswith("rename one or pass @features(namespace=...)")


def test_one_class_passed_twice_is_fine() -> None:
    graph = Graph.build([User, Transaction, User])
    assert set(graph.classes) == {"user", "transaction"}


def test_namespace_of_a_class() -> None:
    assert GRAPH.namespace_of(User) == "user"

    @features
    class Other:
        id: str

    with pytest.raises(UnknownFeature, match="feature class 'Other' is not part of this project"):
        GRAPH.namespace_of(Other)


def test_a_custom_namespace_is_followed_by_relations() -> None:
    @features(namespace="acct")
    class Account:
        id: str
        entries: "DataFrame[Entry]"

    @features
    class Entry:
        id: str
        account_id: "Account.id"

    graph = Graph.build([Account, Entry])
    assert graph.feature("entry", "account_id").fk_target == ("acct", "id")
    assert graph.feature("entry", "account").target == "acct"
    assert graph.feature("acct", "entries").join_key == "account_id"


# --- staleness, tags, owner ---------------------------------------------------------------


def test_feature_max_staleness_wins_over_the_class() -> None:
    assert GRAPH.feature("user", "balance").max_staleness == timedelta(minutes=5)
    assert GRAPH.feature("user", "recent[1h]").max_staleness == timedelta(0)


def test_class_max_staleness_is_the_fallback() -> None:
    assert GRAPH.feature("user", "name").max_staleness == timedelta(minutes=1)
    assert GRAPH.feature("user", "txn_count[7d]").max_staleness == timedelta(minutes=1)
    assert GRAPH.feature("user", "transactions").max_staleness == timedelta(minutes=1)


def test_max_staleness_defaults_to_zero() -> None:
    assert GRAPH.feature("transaction", "amount").max_staleness == timedelta(0)
    assert GRAPH.feature("transaction", "user").max_staleness == timedelta(0)


def test_tags_add_up_and_the_feature_owner_wins() -> None:
    @features(owner="ledger", tags=["core"])
    class Account:
        id: str
        balance: float = feature(tags=["money"], owner="risk")
        name: str

    graph = Graph.build([Account])
    balance = graph.feature("account", "balance")
    assert (balance.tags, balance.owner) == (("money", "core"), "risk")
    name = graph.feature("account", "name")
    assert (name.tags, name.owner) == (("core",), "ledger")


def test_feature_options_reach_the_graph() -> None:
    @features
    class Account:
        id: str
        balance: float = feature(default=0.0, min=0, max=10)
        limit: float = 100.0

    graph = Graph.build([Account])
    balance = graph.feature("account", "balance")
    assert (balance.default, balance.min, balance.max) == (0.0, 0, 10)
    assert graph.feature("account", "limit").default == 100.0


# --- windows ------------------------------------------------------------------------------


def test_each_window_is_a_feature() -> None:
    info = GRAPH.cls("user")
    assert info.windowed == frozenset({"txn_count", "recent"})
    one_day = GRAPH.feature("user", "txn_count[1d]")
    assert one_day.window == timedelta(days=1)
    assert one_day.type == ValueType("int")
    assert one_day.fqn == "user.txn_count[1d]"
    assert GRAPH.feature("user", "txn_count[7d]").window == timedelta(days=7)
    assert "txn_count" not in info.features


def test_windowed_annotation_needs_windowed() -> None:
    @features
    class Account:
        id: str
        logins: Windowed[int]

    with pytest.raises(DefinitionError, match=r"Account\.logins: Windowed\[\.\.\.\] features need"):
        Graph.build([Account])


def test_windowed_needs_a_windowed_annotation() -> None:
    @features
    class Account:
        id: str
        logins: int = windowed("1d", expression=_.id.str.len())

    with pytest.raises(DefinitionError, match=r"Account\.logins: a windowed\(\.\.\.\) feature is"):
        Graph.build([Account])


def test_windowed_with_an_unsupported_item_type_is_an_error() -> None:
    @features
    class Account:
        id: str
        logins: Windowed[set[int]] = windowed("1d", expression=_.id.str.len())

    with pytest.raises(DefinitionError, match="unsupported annotation"):
        Graph.build([Account])


# --- lookups ------------------------------------------------------------------------------


def test_unknown_feature_suggests_a_near_match() -> None:
    with pytest.raises(UnknownFeature) as info:
        GRAPH.feature("user", "blance")
    assert str(info.value) == "unknown feature 'user.blance'; did you mean 'user.balance'?"
    assert isinstance(info.value, KeyError)


def test_unknown_feature_without_near_match() -> None:
    with pytest.raises(UnknownFeature) as info:
        GRAPH.feature("user", "zzzzzz")
    assert str(info.value) == "unknown feature 'user.zzzzzz'"


def test_a_windowed_feature_without_window_names_the_windows() -> None:
    with pytest.raises(UnknownFeature) as info:
        GRAPH.feature("user", "txn_count")
    assert str(info.value) == (
        "user.txn_count is windowed; pick a window: user.txn_count[1d], user.txn_count[7d]"
    )


def test_an_undeclared_window_is_unknown() -> None:
    with pytest.raises(UnknownFeature, match=r"unknown feature 'user\.txn_count\[30d\]'"):
        GRAPH.feature("user", "txn_count[30d]")


def test_unknown_namespace_suggests_a_near_match() -> None:
    with pytest.raises(UnknownFeature, match=r"^unknown namespace 'usr'; did you mean 'user'\?$"):
        GRAPH.cls("usr")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("user.balance", FeatureRef("user", (), "balance")),
        ("  user.balance ", FeatureRef("user", (), "balance")),
        ("user.txn_count[7d]", FeatureRef("user", (), "txn_count", "7d")),
        ("user.txn_count[24h]", FeatureRef("user", (), "txn_count", "1d")),
        ("user.txn_count['24h']", FeatureRef("user", (), "txn_count", "1d")),
        ('user.txn_count["1w"]', FeatureRef("user", (), "txn_count", "7d")),
        ("transaction.user.name", FeatureRef("transaction", ("user",), "name")),
        ("transaction.user.txn_count[1d]", FeatureRef("transaction", ("user",), "txn_count", "1d")),
    ],
)
def test_parse(text: str, expected: FeatureRef) -> None:
    assert GRAPH.parse(text) == expected


@pytest.mark.parametrize("text", ["balance", "", "user.", ".balance", "user..name"])
def test_parse_rejects_malformed_names(text: str) -> None:
    with pytest.raises(UnknownFeature, match=r"is not a feature name; write 'namespace\.feature'"):
        GRAPH.parse(text)


def test_parse_suggests_a_feature_for_a_misspelled_namespace() -> None:
    with pytest.raises(UnknownFeature) as info:
        GRAPH.parse("usr.balance")
    assert str(info.value) == "unknown feature 'usr.balance'; did you mean 'user.balance'?"


def test_parse_names_an_unknown_namespace() -> None:
    with pytest.raises(UnknownFeature) as info:
        GRAPH.parse("zzz.qqq")
    assert str(info.value) == "unknown namespace 'zzz' in 'zzz.qqq'"


def test_parse_rejects_a_bad_window() -> None:
    with pytest.raises(DefinitionError, match="window='soon'"):
        GRAPH.parse("user.txn_count[soon]")


def test_ref_accepts_features_refs_and_names() -> None:
    expected = FeatureRef("user", (), "balance")
    assert GRAPH.ref(User.balance) == expected
    assert GRAPH.ref(expected) is expected
    assert GRAPH.ref("user.balance") == expected
    assert GRAPH.ref(User.transactions[_.amount]) == FeatureRef("user", (), "transactions")
    assert GRAPH.ref(User.txn_count["24h"]) == GRAPH.ref("user.txn_count[1d]")
    assert GRAPH.ref(Transaction.user.name) == FeatureRef("transaction", ("user",), "name")


@pytest.mark.parametrize("obj", [42, None, User])
def test_ref_rejects_other_objects(obj: Any) -> None:
    with pytest.raises(UnknownFeature, match="is not a feature; pass a feature such as"):
        GRAPH.ref(obj)


def test_walk_follows_has_one_hops() -> None:
    spaces, info = GRAPH.walk(GRAPH.ref(Transaction.user.balance))
    assert spaces == ("transaction", "user")
    assert info.fqn == "user.balance"
    assert GRAPH.info(GRAPH.parse("transaction.user.txn_count[24h]")).fqn == "user.txn_count[1d]"


def test_walk_refuses_a_has_many_hop() -> None:
    with pytest.raises(UnknownFeature, match=r"user\.transactions is not a has-one relation"):
        GRAPH.walk(FeatureRef("user", ("transactions",), "amount"))


def test_walk_refuses_a_scalar_hop() -> None:
    with pytest.raises(UnknownFeature, match=r"user\.name is not a has-one relation"):
        GRAPH.walk(FeatureRef("user", ("name",), "x"))


# --- descriptions -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "description"),
    [
        ("name", "the user's display name"),
        ("balance", "what the user owns, in euros"),
        ("email", "from the signup form"),
        ("phone", "a trailing comment"),
        ("fax", "the comment above wins"),
        ("nickname", None),
        ("id", None),
        ("txn_count[1d]", "transactions in the trailing window"),
        ("txn_count[7d]", "transactions in the trailing window"),
    ],
)
def test_descriptions_come_from_options_or_comments(name: str, description: str | None) -> None:
    assert GRAPH.description("user", name) == description


def test_descriptions_of_a_class_defined_in_a_function() -> None:
    @features
    class Account:
        id: str
        # money on the account
        balance: float
        limit: float  # the overdraft limit

    graph = Graph.build([Account])
    assert graph.description("account", "balance") == "money on the account"
    assert graph.description("account", "limit") == "the overdraft limit"


def test_description_of_an_unknown_feature_is_an_error() -> None:
    with pytest.raises(UnknownFeature, match=r"did you mean 'user\.balance'"):
        GRAPH.description("user", "blance")


def test_a_hash_inside_a_default_is_not_a_comment() -> None:
    @features
    class Theme:
        id: str
        color: str = "#ffffff"
        tint: str = "#fff"  # the tint

    graph = Graph.build([Theme])
    assert graph.description("theme", "tint") == "the tint"
    assert graph.description("theme", "color") is None
