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


# --- read by sqlglot: what the hand-written lexer and the keyword regexes got wrong -----------
# Without a dialect the text reads as PostgreSQL; a resolver reads it in its source's dialect.


@pytest.mark.parametrize("dialect", [None, "duckdb"], ids=["default", "duckdb"])
@pytest.mark.parametrize(
    ("sql", "rendered"),
    [
        (
            r"select id, E'it\'s = :fake' as note from t where id = :id",
            r"select id, E'it\'s = :fake' as note from t where id = $1",
        ),
        (
            r"select id, E'it\'s -- :fake' as note from t where id = :id",
            r"select id, E'it\'s -- :fake' as note from t where id = $1",
        ),
        (
            "select id /* outer /* inner */ :fake */ from t where id = :id",
            "select id /* outer /* inner */ :fake */ from t where id = $1",
        ),
    ],
    ids=["escape-string", "comment-dashes-in-escape-string", "nested-comment"],
)
def test_escape_strings_and_nested_comments_hide_their_colons(
    sql: str, rendered: str, dialect: str | None
) -> None:
    text = split_parameters(sql) if dialect is None else split_parameters(sql, dialect)

    assert text.params == ("id",)
    assert text.render(dollars) == rendered


def test_sqlite_quoted_names_hide_their_colons() -> None:
    text = split_parameters(
        "select `odd :fake` as a, [odd :also] as b from t where id = :id", "sqlite"
    )

    assert text.params == ("id",)
    assert text.render(dollars) == "select `odd :fake` as a, [odd :also] as b from t where id = $1"


def test_selected_columns_reads_escape_strings_whole() -> None:
    sql = r"select id, E'it\'s, a pair' as pair, name from t"

    assert selected_columns(sql) == ["id", "pair", "name"]


@pytest.mark.parametrize(
    ("sql", "rewritten"),
    [
        (
            r"select id, E'it\'s = ' as note from t where id = :id",
            r"select id, E'it\'s = ' as note from t where id IN ($1)",
        ),
        (
            r"select id, E'it\'s the max' as note from t where id = :id",
            r"select id, E'it\'s the max' as note from t where id IN ($1)",
        ),
        (
            "select id, (select amount from orders o where o.customer_id = c.id "
            "order by ts desc limit 1) as last from customers c where id = :id",
            "select id, (select amount from orders o where o.customer_id = c.id "
            "order by ts desc limit 1) as last from customers c where id IN ($1)",
        ),
        (
            "select id, (select max(amount) from orders o where o.customer_id = c.id) as top "
            "from customers c where id = :id",
            "select id, (select max(amount) from orders o where o.customer_id = c.id) as top "
            "from customers c where id IN ($1)",
        ),
        (
            "select id, n from (select id, row_number() over (order by score) as n "
            "from customers) ranked where id = :id and n <= 10",
            "select id, n from (select id, row_number() over (order by score) as n "
            "from customers) ranked where id IN ($1) and n <= 10",
        ),
        (
            "with top as (select id from customers order by score desc limit 10) "
            "select c.id from customers c where c.id = :id and c.id in (select id from top)",
            "with top as (select id from customers order by score desc limit 10) "
            "select c.id from customers c where c.id IN ($1) and c.id in (select id from top)",
        ),
        (
            "with c as (select * from customers where id = :id) select id, name from c",
            "with c as (select * from customers where id IN ($1)) select id, name from c",
        ),
    ],
    ids=[
        "escape-string",
        "aggregate-name-in-escape-string",
        "limit-in-correlated-subquery",
        "aggregate-in-correlated-subquery",
        "window-in-derived-table",
        "limit-in-cte",
        "key-in-cte-read-once",
    ],
)
def test_batch_text_judges_each_subquery_on_its_own(sql: str, rewritten: str) -> None:
    found = batch_text(split_parameters(sql), "id")

    assert found is not None
    assert found[0].render(dollars) == rewritten
    assert found[1] == "id"


@pytest.mark.parametrize(
    "sql",
    [
        "select id, rank() over (order by score) as r from customers where id = :id",
        "select id, name from (select id, name from customers where id = :id limit 1) c",
        "select id, n from (select id, row_number() over () as n from customers "
        "where id = :id) ranked",
        "with c as (select * from customers where id = :id) "
        "select a.id from c a join c b on a.name <> b.name",
        "select id from customers where id = :id or level = 'gold'",
        "select id from customers where not (id = :id)",
        "select id from customers where level in (select level from customers where id = :id)",
        "select c.id from customers c left join orders o on o.customer_id = :id",
    ],
    ids=[
        "window",
        "key-inside-limit",
        "key-inside-window",
        "key-in-cte-read-twice",
        "key-under-or",
        "key-under-not",
        "key-in-in-subquery",
        "key-in-join-condition",
    ],
)
def test_batch_text_refuses_where_a_key_would_see_another_keys_rows(sql: str) -> None:
    assert batch_text(split_parameters(sql), "id") is None


def test_unreadable_sql_has_no_parameters_and_no_batch() -> None:
    assert split_parameters("select id from t where id = :id and note = 'open").params == ()
    assert selected_columns("select id, name from t where (") is None
    assert batch_text(split_parameters("select id from t where id = :id and ("), "id") is None
