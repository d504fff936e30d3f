"""The PostgreSQL offline store: the DuckDB store's oracle and behaviour tests, run again
against a schema of its own in database `test`, plus reopening, URLs and password hiding."""

import uuid
from collections.abc import Iterator

import psycopg
import pytest
from psycopg import sql

from kairos.errors import KairosError
from kairos.stores.offline import offline_store_from_url
from kairos.stores.offline.postgres import PostgresOfflineStore, postgres_table_name
from tests.conftest import POSTGRES_URL, need_postgres
from tests.stores.test_offline_store import (
    INT,
    STR,
    minutes,
)

# The same test bodies, collected here with this module's `store` fixture.
from tests.stores.test_offline_store import (
    test_a_feature_never_written_is_all_null as test_a_feature_never_written_is_all_null,
)
from tests.stores.test_offline_store import (
    test_a_later_write_of_one_feature_overrides_the_group_it_was_written_in as test_a_later_write_of_one_feature_overrides_the_group_it_was_written_in,  # noqa: E501
)
from tests.stores.test_offline_store import (
    test_asof_matches_a_brute_force_oracle as test_asof_matches_a_brute_force_oracle,
)
from tests.stores.test_offline_store import (
    test_bad_writes_are_refused_with_the_fix as test_bad_writes_are_refused_with_the_fix,
)
from tests.stores.test_offline_store import (
    test_empty_spine_and_empty_write as test_empty_spine_and_empty_write,
)
from tests.stores.test_offline_store import (
    test_every_value_type_round_trips as test_every_value_type_round_trips,
)
from tests.stores.test_offline_store import (
    test_features_written_together_and_apart_match_the_oracle as test_features_written_together_and_apart_match_the_oracle,  # noqa: E501
)
from tests.stores.test_offline_store import (
    test_int_and_str_keys_are_different_features_and_never_mixed as test_int_and_str_keys_are_different_features_and_never_mixed,  # noqa: E501
)
from tests.stores.test_offline_store import (
    test_sql_looking_names_and_keys_are_only_data as test_sql_looking_names_and_keys_are_only_data,
)
from tests.stores.test_offline_store import (
    test_threads_write_and_read_at_once as test_threads_write_and_read_at_once,
)
from tests.stores.test_offline_store import (
    test_ties_inside_one_batch_go_to_the_row_written_last as test_ties_inside_one_batch_go_to_the_row_written_last,  # noqa: E501
)
from tests.stores.test_offline_store import (
    test_ttl_excludes_exactly_ttl_old_and_includes_just_newer as test_ttl_excludes_exactly_ttl_old_and_includes_just_newer,  # noqa: E501
)
from tests.stores.test_offline_store import (
    test_write_many_refuses_mixed_lengths_and_changed_types as test_write_many_refuses_mixed_lengths_and_changed_types,  # noqa: E501
)


def drop_schema(schema: str) -> None:
    with psycopg.connect(POSTGRES_URL, autocommit=True) as connection:
        connection.execute(
            sql.SQL("drop schema if exists {} cascade").format(sql.Identifier(schema))
        )


@pytest.fixture(scope="session")
def postgres_schemas() -> Iterator[str]:
    """A prefix for this session's schemas; every schema under it is dropped at the end."""
    need_postgres()
    prefix = f"kairos_offline_{uuid.uuid4().hex[:8]}"
    yield prefix
    with psycopg.connect(POSTGRES_URL, autocommit=True) as connection:
        schemas = connection.execute(
            "select nspname from pg_namespace where starts_with(nspname, %s)", (prefix,)
        ).fetchall()
        for (schema,) in schemas:
            connection.execute(
                sql.SQL("drop schema if exists {} cascade").format(sql.Identifier(schema))
            )


@pytest.fixture
def schema(postgres_schemas: str) -> Iterator[str]:
    """A fresh schema for one test, so tests never see each other's features."""
    name = f"{postgres_schemas}_{uuid.uuid4().hex[:8]}"
    yield name
    drop_schema(name)


@pytest.fixture
def store(schema: str) -> Iterator[PostgresOfflineStore]:
    opened = PostgresOfflineStore(POSTGRES_URL, schema)
    yield opened
    opened.close()


def test_a_store_keeps_its_values_and_tie_breaks_across_reopening(schema: str) -> None:
    first = PostgresOfflineStore(POSTGRES_URL, schema)
    first.write("user", "x", INT, STR, ["u", "v"], [minutes(0), minutes(0)], [1, 5])
    first.write("user", "x", INT, STR, ["u"], [minutes(0)], [2])
    first.close()
    first.close()  # twice is harmless
    with pytest.raises(KairosError, match="closed"):
        first.asof("user", "x", ["u"], [minutes(1)])
    second = offline_store_from_url(f"{POSTGRES_URL}?schema={schema}")
    try:
        assert second.value_kind("user", "x") == "int"
        got = second.asof("user", "x", ["u", "v", "u"], [minutes(1)] * 3).to_pylist()
        assert got == [2, 5, 2]
    finally:
        second.close()


def test_url_with_a_schema_opens_a_store_in_that_schema(schema: str) -> None:
    store = offline_store_from_url(f"postgres://postgres@127.0.0.1:5432/test?schema={schema}")
    try:
        assert isinstance(store, PostgresOfflineStore) and store.schema == schema
        store.write("user", "age", INT, STR, ["u"], [minutes(0)], [41])
    finally:
        store.close()
    with psycopg.connect(POSTGRES_URL) as connection:
        tables = {
            row[0]
            for row in connection.execute(
                "select table_name from information_schema.tables where table_schema = %s",
                (schema,),
            )
        }
    assert tables == {"kairos_offline_features", postgres_table_name("user", "age")}


def test_a_password_never_shows_in_repr_or_errors(schema: str) -> None:
    url = f"postgresql://postgres:s3cret-pw@127.0.0.1:5432/test?schema={schema}"
    # trust auth ignores the password: the store opens, and its repr hides it
    store = offline_store_from_url(url)
    try:
        assert "s3cret-pw" not in repr(store) and "***" in repr(store)
    finally:
        store.close()
    with pytest.raises(KairosError, match="cannot open offline store") as raised:
        offline_store_from_url("postgresql://postgres:s3cret-pw@127.0.0.1:5432/no_such_db_kairos")
    assert "s3cret-pw" not in str(raised.value) and "no_such_db_kairos" in str(raised.value)
    with pytest.raises(KairosError, match="cannot open offline store") as raised:
        PostgresOfflineStore("host=127.0.0.1 dbname=no_such_db_kairos user=x password=s3cret-pw")
    assert "s3cret-pw" not in str(raised.value)
    with pytest.raises(KairosError, match="empty"):
        offline_store_from_url(f"{POSTGRES_URL}?schema=")


def test_long_names_keep_their_own_tables(store: PostgresOfflineStore) -> None:
    # PostgreSQL cuts names at 63 characters: the hash must survive the cut
    long = "n" * 60
    assert len(postgres_table_name(long, long + "a")) <= 63
    assert postgres_table_name(long, long + "a") != postgres_table_name(long, long + "b")
    store.write(long, long + "a", INT, STR, ["u"], [minutes(0)], [1])
    store.write(long, long + "b", INT, STR, ["u"], [minutes(0)], [2])
    assert store.asof(long, long + "a", ["u"], [minutes(1)]).to_pylist() == [1]
    assert store.asof(long, long + "b", ["u"], [minutes(1)]).to_pylist() == [2]


def test_all_null_keys_and_a_huge_ttl(store: PostgresOfflineStore) -> None:
    store.write("user", "x", INT, INT, [1], [minutes(0)], [7])
    assert store.asof("user", "x", [None, None], [minutes(1)] * 2).to_pylist() == [None, None]
    huge = minutes(0) - minutes(0).min.replace(tzinfo=minutes(0).tzinfo)
    got = store.asof("user", "x", [1, 1], [minutes(1), minutes(-1)], ttl=huge * 100)
    assert got.to_pylist() == [7, None]
