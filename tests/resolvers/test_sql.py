"""SQL resolvers end to end: one test body per behaviour, run over every kind of source.

Expected values come from the data itself (`CUSTOMERS`, `ORDERS` in conftest), filtered the
slow, obvious way; statements are counted with a spy on the source's real `fetch`.
"""

from __future__ import annotations

import math
import random
import time
from datetime import datetime, timedelta

import pytest

import kairos as kr
from tests.resolvers.conftest import (
    CUSTOMER_SQL,
    CUSTOMERS,
    NAMES,
    NOW,
    ORDERS,
    ORDERS_SQL,
    TIERS,
    Shop,
    Statement,
    as_utc,
    orders_of,
)

SCALARS = ["customer.name", "customer.tier"]
AGGREGATES = ["customer.order_count", "customer.spent"]
MAX_BATCH = 1000  # keys per statement; kairos.resolvers.sql.MAX_BATCH
# A condition that keeps the database busy far longer than the test waits, per dialect.
SLOW = {
    "sqlite": "(with recursive n(x) as (select 1 union all select x + 1 from n "
    "where x < 1000000000) select count(*) from n) > 0",
    "duckdb": "(select sum(i) from range(1000000000000) r(i)) > 0",
    "postgres": "pg_sleep(1) is not null",
}
RETURNS_WITHIN = 0.75  # seconds; under pg_sleep(1)


def on_table(statements: list[Statement], table: str) -> list[Statement]:
    """The statements that read `table`."""
    return [s for s in statements if f" from {table} " in f" {' '.join(s.sql.split())} "]


def spent(customer: str, now: datetime) -> float:
    return sum(amount for _, _, amount, _ in orders_of(customer, now))


# --- 1. scalar features: one row per primary key --------------------------------------------


def test_columns_map_to_features_by_name_and_alias(shop: Shop) -> None:
    client = shop.client()

    result = client.query({"customer.id": "c004"}, SCALARS, now=NOW)

    assert result.errors == []
    assert result.values == {"customer.name": "Customer 4", "customer.tier": TIERS["c004"]}
    assert result.get("customer.tier").source == "customer"  # customer.sql: `level as tier`


def test_a_missing_row_fails_only_that_resolvers_features(shop: Shop) -> None:
    client = shop.client()

    result = client.query({"customer.id": "nobody"}, [*SCALARS, *AGGREGATES], now=NOW)

    assert result.values == {
        "customer.name": None,
        "customer.tier": None,
        "customer.order_count": 0,  # orders.sql found no rows: an empty has-many, not an error
        "customer.spent": 0.0,
    }
    assert sorted(e.feature for e in result.errors) == SCALARS
    for error in result.errors:
        assert error.code == "resolver_error"
        assert error.resolver == "customer"
        assert "found no row for id='nobody'" in error.message


def test_upper_case_column_names_work_in_a_batch(shop: Shop) -> None:
    shop.write_sql(
        "customer.sql",
        """\
        -- resolves: Customer
        -- source: shop
        SELECT ID, NAME, LEVEL AS TIER FROM customers WHERE ID = :id
        """,
    )
    client = shop.client()
    ids = ["c001", "c002", "nobody", "c001"]

    one = client.query({"customer.id": "c001"}, SCALARS, now=NOW)
    bulk = client.query_bulk({"customer.id": ids}, SCALARS, now=NOW)

    assert one.values == {"customer.name": NAMES["c001"], "customer.tier": TIERS["c001"]}
    assert bulk.column("customer.name") == [NAMES.get(i) for i in ids]
    assert [e.row for e in bulk.errors] == [2, 2]


# --- 2. has-many features: rows per foreign key, nothing after `now` ------------------------


@pytest.mark.parametrize("sql_filters", [True, False], ids=["sql-filters", "engine-drops"])
@pytest.mark.parametrize("now", [NOW, NOW - timedelta(days=4)], ids=["now", "4d-before"])
def test_has_many_rows_and_their_aggregates_match_the_data(
    shop: Shop, now: datetime, sql_filters: bool
) -> None:
    if not sql_filters:
        shop.write_sql("orders.sql", ORDERS_SQL.replace(" and ts <= :now", ""))
    client = shop.client()
    statements = shop.statements(client)
    # c000 has an order 1h after NOW; o019 (c019) is exactly 4 days before; c027 has none.
    customers = ["c000", "c001", "c009", "c019", "c027"]

    for customer in customers:
        result = client.query({"customer.id": customer}, ["customer.orders", *AGGREGATES], now=now)

        expected = orders_of(customer, now)
        assert result.errors == []
        rows = result.get_value("customer.orders")
        assert sorted((r["id"], r["customer_id"], r["amount"], r["ts"]) for r in rows) == sorted(
            expected
        )
        assert result.get_value("customer.order_count") == len(expected)
        assert result.get_value("customer.spent") == pytest.approx(spent(customer, now))

    assert len(statements) == len(customers)  # one statement per single-entity query
    fetched = [as_utc(row[s.columns.index("ts")]) for s in statements for row in s.rows]
    later = [ts for ts in fetched if ts > now]
    if sql_filters:
        assert all(as_utc(s.params[-1]) == now for s in statements)  # :now is the query's now
        assert later == []
    else:
        assert later  # the database sent rows from after now: the engine dropped them


def test_time_zone_aware_timestamps_fill_feature_time(shop: Shop) -> None:
    ts = "ts" if shop.backend.dialect == "sqlite" else "cast(ts as timestamptz) as ts"
    shop.write_sql("orders.sql", ORDERS_SQL.replace("amount, ts\n", f"amount, {ts}\n"))
    client = shop.client()

    result = client.query({"customer.id": "c001"}, ["customer.orders"], now=NOW)

    assert result.errors == []
    rows = result.get_value("customer.orders")
    assert sorted(r["ts"] for r in rows) == sorted(ts for *_, ts in orders_of("c001", NOW))


# --- 3. bulk: aligned with the input, keys pushed down ------------------------------------


def test_bulk_is_aligned_with_its_input_and_runs_one_statement_per_resolver(shop: Shop) -> None:
    rng = random.Random(7)
    known = list(NAMES)
    ids = [*known, *rng.choices(known, k=10), *[f"ghost{i}" for i in range(7)], "ghost0", "c0"]
    ids.extend(["ghost1"] * (50 - len(ids)))
    rng.shuffle(ids)
    assert len(ids) == 50
    client = shop.client()
    statements = shop.statements(client)

    bulk = client.query_bulk({"customer.id": ids}, [*SCALARS, *AGGREGATES], now=NOW)

    assert len(bulk) == len(ids)
    assert bulk.column("customer.name") == [NAMES.get(i) for i in ids]
    assert bulk.column("customer.tier") == [TIERS.get(i) for i in ids]
    assert bulk.column("customer.order_count") == [len(orders_of(i, NOW)) for i in ids]
    assert bulk.column("customer.spent") == pytest.approx([spent(i, NOW) for i in ids])
    unknown = [row for row, i in enumerate(ids) if i not in NAMES]
    failed = {(e.feature, e.row) for e in bulk.errors}
    assert failed == {(feature, row) for row in unknown for feature in SCALARS}
    for error in bulk.errors:
        assert error.row is not None
        assert error.code == "resolver_error"
        assert f"found no row for id={ids[error.row]!r}" in error.message

    assert len(statements) == 2
    (customers,) = on_table(statements, "customers")
    (orders,) = on_table(statements, "orders")
    assert " IN (" in customers.sql and " IN (" in orders.sql
    distinct = sorted(set(ids))
    assert sorted(customers.params) == distinct  # each key bound once, duplicates dropped
    assert sorted(orders.params[:-1]) == distinct
    assert as_utc(orders.params[-1]) == NOW


@pytest.mark.parametrize("distinct", [MAX_BATCH, MAX_BATCH + 1, 2500])
def test_a_batch_over_the_limit_is_split_into_statements(shop: Shop, distinct: int) -> None:
    known = list(NAMES)
    ids = [*known, *(f"x{i:04d}" for i in range(distinct - len(known))), *known[:5]]
    client = shop.client()
    statements = shop.statements(client)

    bulk = client.query_bulk(
        {"customer.id": ids}, ["customer.name", "customer.order_count"], now=NOW
    )

    assert bulk.column("customer.name") == [NAMES.get(i) for i in ids]
    assert bulk.column("customer.order_count") == [len(orders_of(i, NOW)) for i in ids]
    expected = math.ceil(distinct / MAX_BATCH)
    customers = on_table(statements, "customers")
    orders = on_table(statements, "orders")
    assert (len(customers), len(orders), len(statements)) == (expected, expected, 2 * expected)
    for chunk in [s.params for s in customers] + [s.params[:-1] for s in orders]:
        assert 0 < len(chunk) <= MAX_BATCH
    assert sorted(k for s in customers for k in s.params) == sorted(set(ids))
    assert sorted(k for s in orders for k in s.params[:-1]) == sorted(set(ids))


def test_offline_rows_each_see_their_own_now_in_one_statement(shop: Shop) -> None:
    """A spine whose rows have their own times: `:now` is bound per row. DuckDB and
    PostgreSQL answer all rows from one lateral statement; SQLite runs one per (key, now).
    An aggregate in the SQL (not rewritable into IN (...)) is evaluated per row too."""
    shop.write_sql(
        "latest.sql",
        """\
        -- resolves: Customer
        -- source: shop
        select max(amount) as top from orders where customer_id = :id and ts <= :now
        """,
    )
    features_py = shop.folder / "features.py"
    features_py.write_text(
        features_py.read_text().replace("    name: str\n", "    name: str\n    top: float | None\n")
    )
    rng = random.Random(3)
    customers = [*rng.choices(list(NAMES), k=40), "ghost"]
    times = [NOW - timedelta(hours=rng.randint(-30, 400)) for _ in customers]
    client = shop.client()
    statements = shop.statements(client)

    result = client.offline_query(
        {"customer.id": customers, "ts": times},
        ["customer.order_count", "customer.spent", "customer.top"],
        recompute=True,
    )

    pairs = list(zip(customers, times, strict=True))
    assert result.column("customer.order_count") == [len(orders_of(c, t)) for c, t in pairs]
    assert result.column("customer.spent") == pytest.approx([spent(c, t) for c, t in pairs])
    tops = [max((a for _, _, a, _ in orders_of(c, t)), default=None) for c, t in pairs]
    assert result.column("customer.top") == tops
    orders = on_table(statements, "orders")
    if shop.backend.dialect == "sqlite":
        assert len(orders) == 2 * len(set(pairs))
    else:
        assert len(orders) == 2  # one per resolver, every row's :now bound in it
        assert all(" lateral " in " ".join(s.sql.lower().split()) for s in orders)


# --- 4. hostile input is a value, never SQL ------------------------------------------------

HOSTILE = [
    "x' OR '1'='1",
    "1; DROP TABLE customers; --",
    "' UNION SELECT id, name, level FROM customers --",
    "c001' --",
    'c001" --',
    ":id",
    "$1",
    "?",
    "%s",
]


def test_injection_strings_match_nothing_and_leave_the_tables_intact(shop: Shop) -> None:
    client = shop.client()
    outputs = [*SCALARS, "customer.order_count"]

    for hostile in HOSTILE:
        result = client.query({"customer.id": hostile}, outputs, now=NOW)

        assert result.values == {
            "customer.name": None,
            "customer.tier": None,
            "customer.order_count": 0,
        }
        assert [e.code for e in result.errors] == ["resolver_error"] * 2
        assert all(f"found no row for id={hostile!r}" in e.message for e in result.errors)
    bulk = client.query_bulk({"customer.id": [*HOSTILE, "c001"]}, outputs, now=NOW)
    assert bulk.column("customer.name") == [None] * len(HOSTILE) + [NAMES["c001"]]
    assert bulk.column("customer.order_count") == [0] * len(HOSTILE) + [len(orders_of("c001", NOW))]
    assert {e.row for e in bulk.errors} == set(range(len(HOSTILE)))
    client.close()

    assert shop.backend.count("customers") == len(CUSTOMERS)
    assert shop.backend.count("orders") == len(ORDERS)


# --- 5. definition errors at Client creation -----------------------------------------------

CUSTOMER_HEADER = "-- resolves: Customer\n-- source: shop\n"
DEFINITION_ERRORS = {
    "missing-resolves": (
        "-- source: shop\nselect id, name from customers where id = :id\n",
        ["add a header line `-- resolves: ClassName`"],
    ),
    "unknown-class": (
        "-- resolves: Custmer\n-- source: shop\nselect id, name from customers where id = :id\n",
        ["`-- resolves: Custmer` names no feature class", "did you mean 'Customer'?"],
    ),
    "unknown-column": (
        CUSTOMER_HEADER + "select id, nmae from customers where id = :id\n",
        ["column 'nmae' is not a feature of customer", "did you mean 'name'?", "with `as`"],
    ),
    "select-star": (
        CUSTOMER_HEADER + "select * from customers where id = :id\n",
        ["name every selected column", "`select *` cannot be planned"],
    ),
    "unknown-parameter": (
        CUSTOMER_HEADER
        + "select id, level as tier from customers where id = :id and name = :nmae\n",
        ["parameter :nmae is not a feature of customer", "did you mean 'name'?", "(or :now)"],
    ),
    "two-key-parameters": (
        "-- resolves: Order\n-- source: shop\n"
        "select id, amount from orders where id = :id and customer_id = :customer_id\n",
        ["compare exactly one key parameter", "found :id, :customer_id"],
    ),
    "no-key-parameter": (
        CUSTOMER_HEADER + "select id, level as tier from customers where name = :name\n",
        ["compare exactly one key parameter", "`where id = :id`", "found none"],
    ),
    "unknown-source": (
        "-- resolves: Customer\n-- source: warehouse\n"
        "select id, name from customers where id = :id\n",
        ["source 'warehouse' is not configured in kairos.yaml", "configured: shop"],
    ),
    "unknown-header-key": (
        CUSTOMER_HEADER + "-- timout: 2s\nselect id, name from customers where id = :id\n",
        ["unknown header key(s) timout", "use resolves, source, type, timeout, name"],
    ),
}


@pytest.mark.parametrize("case", list(DEFINITION_ERRORS))
def test_a_bad_sql_file_fails_client_creation_naming_it_and_the_fix(shop: Shop, case: str) -> None:
    text, fragments = DEFINITION_ERRORS[case]
    (shop.folder / "bad.sql").write_text(text)

    with pytest.raises(kr.DefinitionError) as raised:
        shop.client()

    message = str(raised.value)
    assert str(shop.folder / "bad.sql") in message
    for fragment in fragments:
        assert fragment in message


# --- 6. timeouts ------------------------------------------------------------------------


def test_a_slow_query_past_its_timeout_fails_only_its_features(shop: Shop) -> None:
    slow = CUSTOMER_SQL.replace("-- source: shop\n", "-- source: shop\n-- timeout: 50ms\n")
    slow = slow.replace("where id = :id", f"where id = :id and {SLOW[shop.backend.dialect]}")
    shop.write_sql("customer.sql", slow)
    client = shop.client()

    started = time.perf_counter()
    result = client.query({"customer.id": "c004"}, [*SCALARS, *AGGREGATES], now=NOW)
    elapsed = time.perf_counter() - started

    assert elapsed < RETURNS_WITHIN
    assert result.values == {
        "customer.name": None,
        "customer.tier": None,
        "customer.order_count": len(orders_of("c004", NOW)),
        "customer.spent": pytest.approx(spent("c004", NOW)),
    }
    assert sorted(e.feature for e in result.errors) == SCALARS
    for error in result.errors:
        assert error.code == "timeout"
        assert error.resolver == "customer"
        assert "0.05s" in error.message


# --- 7. statements read by sqlglot, in the source's dialect ---------------------------------


def test_a_limit_in_a_correlated_subquery_still_pushes_the_keys_down(shop: Shop) -> None:
    shop.write_sql(
        "customer.sql",
        """\
        -- resolves: Customer
        -- source: shop
        select id, name, level as tier from customers c
        where id = :id and exists (select 1 from orders o where o.customer_id = c.id limit 1)
        """,
    )
    client = shop.client()
    statements = shop.statements(client)
    ids = [*NAMES, "ghost"]
    buyers = {customer for _, customer, _, _ in ORDERS}

    bulk = client.query_bulk({"customer.id": ids}, ["customer.name"], now=NOW)

    assert bulk.column("customer.name") == [NAMES[i] if i in buyers else None for i in ids]
    (customers,) = on_table(statements, "customers")
    assert " IN (" in customers.sql
    assert sorted(customers.params) == sorted(ids)


def test_a_window_in_a_derived_table_is_computed_over_all_rows_in_a_batch(shop: Shop) -> None:
    shop.write_sql(
        "customer.sql",
        """\
        -- resolves: Customer
        -- source: shop
        select id, name, tier
        from (select id, name, level as tier, row_number() over (order by id) as n
              from customers) ranked
        where id = :id and n <= 10
        """,
    )
    client = shop.client()
    statements = shop.statements(client)
    ids = [*NAMES, "ghost"]
    first_ten = sorted(NAMES)[:10]

    bulk = client.query_bulk({"customer.id": ids}, ["customer.name"], now=NOW)

    assert bulk.column("customer.name") == [NAMES[i] if i in first_ten else None for i in ids]
    (customers,) = statements  # `from customers) ranked`: the window saw every customer
    assert " IN (" in customers.sql


def test_a_postgres_escape_string_is_read_as_one_string(shop: Shop) -> None:
    if shop.backend.dialect == "sqlite":
        pytest.skip("SQLite has no E'...' strings")
    shop.write_sql(
        "customer.sql",
        r"""
        -- resolves: Customer
        -- source: shop
        select id, name, level as tier from customers where name <> E'it\'s -- :id' and id = :id
        """,
    )
    client = shop.client()
    statements = shop.statements(client)

    one = client.query({"customer.id": "c004"}, SCALARS, now=NOW)
    bulk = client.query_bulk({"customer.id": ["c001", "c002"]}, SCALARS, now=NOW)

    assert one.values == {"customer.name": NAMES["c004"], "customer.tier": TIERS["c004"]}
    assert bulk.column("customer.name") == [NAMES["c001"], NAMES["c002"]]
    assert [s.params for s in on_table(statements, "customers")] == [["c004"], ["c001", "c002"]]


UNREADABLE = {
    "unbalanced-parenthesis": (
        CUSTOMER_HEADER + "select id, name from customers\nwhere id = :id and (\n",
        ["cannot parse the statement as {dialect} SQL", "line 4", "fix the SQL"],
    ),
    "unterminated-string": (
        CUSTOMER_HEADER + "select id, name from customers where id = :id and name = 'open\n",
        ["cannot read the statement as {dialect} SQL", "close the quote"],
    ),
    "two-statements": (
        CUSTOMER_HEADER + "select id, name from customers where id = :id;\nselect 1 from t;\n",
        ["the file holds 2 statements; keep one SELECT"],
    ),
}


@pytest.mark.parametrize("case", list(UNREADABLE))
def test_sql_sqlglot_cannot_read_fails_client_creation_naming_the_file(
    shop: Shop, case: str
) -> None:
    text, fragments = UNREADABLE[case]
    (shop.folder / "bad.sql").write_text(text)

    with pytest.raises(kr.DefinitionError) as raised:
        shop.client()

    message = str(raised.value)
    assert f"sql resolver 'bad' ({shop.folder / 'bad.sql'}:3)" in message
    for fragment in fragments:
        assert fragment.format(dialect=shop.backend.dialect) in message
    assert "\n" not in message and "Traceback" not in message
    assert raised.value.__cause__ is None  # sqlglot's error is told, not chained
    assert raised.value.__context__ is None or raised.value.__suppress_context__
