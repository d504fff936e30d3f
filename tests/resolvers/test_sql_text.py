"""Reading a `.sql` resolver's text: its `:name` parameters, its output columns, and the
`col IN (...)` rewrite that pushes a batch of keys down into one statement."""

from __future__ import annotations

import pytest

from kairos.resolvers.sql import SqlText, batch_text, selected_columns, split_parameters


def dollars(index: int) -> str:
    return f"${index}"


# --- split_parameters -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("sql", "params", "rendered"),
    [
        (
            "select id from orders where customer_id = :customer_id and ts <= :now",
            ("customer_id", "now"),
            "select id from orders where customer_id = $1 and ts <= $2",
        ),
        ("select a from t where b=:id", ("id",), "select a from t where b=$1"),
        (":id", ("id",), "$1"),
        (
            "select id, ':fake' as tag from t where id = :id",
            ("id",),
            "select id, ':fake' as tag from t where id = $1",
        ),
        (
            "select 'it''s :fake' as tag from t where id = :id",
            ("id",),
            "select 'it''s :fake' as tag from t where id = $1",
        ),
        (
            'select ":fake" from t where id = :id',
            ("id",),
            'select ":fake" from t where id = $1',
        ),
        (
            "select id -- ends at :fake\nfrom t where id = :id",
            ("id",),
            "select id -- ends at :fake\nfrom t where id = $1",
        ),
        (
            "select id /* :fake\n :also */ from t where id = :id",
            ("id",),
            "select id /* :fake\n :also */ from t where id = $1",
        ),
        (
            "select id::text as id from t where id = :id::text",
            ("id",),
            "select id::text as id from t where id = $1::text",
        ),
        (
            "select a[1:2] as a from t where id = :id",
            ("id",),
            "select a[1:2] as a from t where id = $1",
        ),
        ("select ':open", (), "select ':open"),  # an unterminated string runs to the end
    ],
    ids=[
        "two-params",
        "no-spaces",
        "only-a-param",
        "single-quoted",
        "doubled-quote",
        "double-quoted",
        "line-comment",
        "block-comment",
        "postgres-cast",
        "array-slice",
        "unterminated",
    ],
)
def test_split_parameters_finds_only_real_parameters(
    sql: str, params: tuple[str, ...], rendered: str
) -> None:
    text = split_parameters(sql)

    assert text.params == params
    assert len(text.parts) == len(params) + 1
    assert text.render(dollars) == rendered
    assert text.render(lambda _: "") == "".join(text.parts)  # nothing but params removed


def test_render_escapes_percent_only_when_asked() -> None:
    text = split_parameters("select id from t where name like 'a%' and id = :id")

    assert text.render(lambda _: "%s", escape_percent=True) == (
        "select id from t where name like 'a%%' and id = %s"
    )
    assert text.render(lambda _: "?") == "select id from t where name like 'a%' and id = ?"


def test_a_colon_inside_a_dollar_quoted_string_is_not_a_parameter() -> None:
    text = split_parameters("select $$ :fake $$ as tag from t where id = :id")

    assert text.params == ("id",)


# --- selected_columns -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("sql", "columns"),
    [
        ("select id, name, level as tier from customers", ["id", "name", "tier"]),
        ("SELECT ID, Level AS Tier FROM customers", ["ID", "Tier"]),
        ('select c.id, c."name", count(*) as n from customers c', ["id", "name", "n"]),
        ('select amount as "Amount" from orders', ["Amount"]),
        ("select distinct customer_id from orders", ["customer_id"]),
        (
            "select id, (select count(*) from orders o where o.customer_id = c.id) as n "
            "from customers c",
            ["id", "n"],
        ),
        ("select id, extract(epoch from ts) as epoch from orders", ["id", "epoch"]),
        ("with recent as (select * from orders) select id, amount from recent", ["id", "amount"]),
        ("select id, -- the from here is a comment\n name from t", ["id", "name"]),
        ("select id, /* from */ name from t", ["id", "name"]),
        ("select id, ':x' as tag, 'a, b' as pair from t", ["id", "tag", "pair"]),
        ("select id::text as id from t", ["id"]),
    ],
)
def test_selected_columns_names_the_output_columns(sql: str, columns: list[str]) -> None:
    assert selected_columns(sql) == columns


@pytest.mark.parametrize(
    "sql",
    [
        "select * from customers",
        "select id, c.* from customers c",
        "select id, count(*) from orders",
        "select id, name",  # no from
        "delete from customers",
    ],
)
def test_selected_columns_is_none_when_a_column_has_no_name(sql: str) -> None:
    assert selected_columns(sql) is None


@pytest.mark.parametrize(
    ("sql", "columns"),
    [
        ("select id, coalesce(name, '--') as name from customers", ["id", "name"]),
        ("select id, 'from the web' as channel from customers", ["id", "channel"]),
    ],
    ids=["dashes-in-literal", "from-in-literal"],
)
def test_selected_columns_skips_string_literals(sql: str, columns: list[str]) -> None:
    assert selected_columns(sql) == columns


# --- batch_text -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("sql", "key", "rewritten", "column"),
    [
        (
            "select id, name from customers where id = :id",
            "id",
            "select id, name from customers where id IN ($1)",
            "id",
        ),
        (
            "select id, name from customers where id=:id and level <> 'x'",
            "id",
            "select id, name from customers where id IN ($1) and level <> 'x'",
            "id",
        ),
        (
            "select o.id from orders o where o.customer_id = :customer_id and o.ts <= :now",
            "customer_id",
            "select o.id from orders o where o.customer_id IN ($1) and o.ts <= $2",
            "customer_id",
        ),
        (
            'select id from orders where "customer_id" = :customer_id',
            "customer_id",
            'select id from orders where "customer_id" IN ($1)',
            "customer_id",
        ),
    ],
    ids=["primary-key", "no-spaces", "qualified", "quoted"],
)
def test_batch_text_turns_the_key_comparison_into_in(
    sql: str, key: str, rewritten: str, column: str
) -> None:
    found = batch_text(split_parameters(sql), key)

    assert found is not None
    text, compared = found
    assert isinstance(text, SqlText)
    assert compared == column
    assert text.params.count("__keys__") == 1
    assert text.render(dollars) == rewritten


@pytest.mark.parametrize(
    "sql",
    [
        "select id from customers where id = :id or parent = :id",  # the key twice
        "select id from customers where :id = id",  # key on the left
        "select id from customers where id >= :id",
        "select id from customers where id != :id",
        "select id from customers where lower(id) = :id",
        "select id from customers where level = :level",  # no key at all
    ],
)
def test_batch_text_leaves_other_comparisons_alone(sql: str) -> None:
    assert batch_text(split_parameters(sql), "id") is None
