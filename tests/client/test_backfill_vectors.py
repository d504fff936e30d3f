"""Backfills of a class a `kr.nearest` searches keep its vector index current: documents whose
text comes from a Python or SQL resolver (never written as events), materialized over a grid
of times by the local all-MiniLM-L6-v2, then found as of times inside the grid. One test body
over the embedded index and pgvector (the pgserver fixture of tests/stores/test_vectors.py).
"""

from __future__ import annotations

import sqlite3
import textwrap
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Literal

import pytest
import yaml

import kairos as kr
from kairos import DataFrame, FeatureTime, Vector, _, features, online
from kairos.cli import main
from kairos.client import ray_engine
from kairos.errors import InvalidInput
from kairos.resolvers.llm import CompletionFailed
from tests.resolvers.test_nearest import vectors as vectors  # embedded or pgvector, a fixture
from tests.stores.test_vectors import pg_url as pg_url  # pgvector, a fixture

T0 = datetime(2026, 5, 1, tzinfo=UTC)
DAY = timedelta(days=1)
PASSWORD = "Reset a forgotten password with the link sent to your email."
BREAD = "Knead the bread dough for ten minutes until it is smooth."
INVOICE = "You can download past invoices and their charges as PDF files from the billing page."
GARDEN = "Water tomato plants early in the morning during hot weeks."
QUESTION = "Where do I get a copy of last month's invoice?"

# What a CMS says each page was, from when: (edited_at, title, lang)
HISTORY = {
    "p1": [(T0 - DAY, PASSWORD, "en")],
    "p2": [(T0 - DAY, BREAD, "en"), (T0 + 2 * DAY + timedelta(hours=6), INVOICE, "en")],
    "p3": [(T0 - DAY, GARDEN, "de")],
}


@features(events=True)
class Page:
    id: str
    title: str
    lang: str
    edited_at: FeatureTime
    vector: Vector[Literal[384]] = kr.embedding(model="local/minilm", input=_.title)


@features
class Reader:
    id: str
    lang: str
    question: str
    vector: Vector[Literal[384]] = kr.embedding(model="local/minilm", input=_.question)
    pages: DataFrame[Page] = kr.nearest(Page.vector, query=_.vector, k=3)
    in_lang: DataFrame[Page] = kr.nearest(
        Page.vector, query=_.vector, k=3, where=_.lang == kr.parent.lang
    )


@online
def page_content(pid: Page.id, now: kr.Now) -> kr.Features[Page.title, Page.lang, Page.edited_at]:
    edited_at, title, lang = [v for v in HISTORY[str(pid)] if v[0] <= now][-1]
    return title, lang, edited_at


def pages_client(vectors: str, tmp_path: Path) -> kr.Client:
    return kr.Client(
        definitions=[Page, Reader, page_content],
        query_log="none://",
        offline_store=f"duckdb:///{tmp_path / 'offline.duckdb'}",
        vectors=vectors,
        default_timeout="60s",  # the first call loads the local model
    )


def found(client: kr.Client, output: Any, now: datetime | None, lang: str = "en") -> list[Any]:
    result = client.query(
        {Reader.id: "r1", Reader.lang: lang, Reader.question: QUESTION}, [output], now=now
    )
    assert not result.errors, result.errors
    return [(r["id"], r["title"], r["edited_at"]) for r in result.get_value(output)]


def backfill(client: kr.Client, engine: str = "local", **options: Any) -> Any:
    return client.materialize(
        keys=options.pop("keys", ["p1", "p2", "p3"]),
        start=T0,
        end=T0 + 4 * DAY,
        every="1d",
        features=options.pop("features", [Page.title]),
        engine=engine,
        **options,
    )


def check_point_in_time(client: kr.Client) -> None:
    before = found(client, Reader.pages, T0 + 2 * DAY + timedelta(hours=5))
    assert ("p2", BREAD, T0 - DAY) in before  # the old version until its edit
    assert all(title != INVOICE for _, title, _ in before)
    # the edit is found from its own time on, between grid times (seen at T0 + 3d)
    after = found(client, Reader.pages, T0 + 2 * DAY + timedelta(hours=7))
    assert after[0] == ("p2", INVOICE, T0 + 2 * DAY + timedelta(hours=6))
    assert len(after) == 3
    assert found(client, Reader.pages, None)[0] == after[0]  # as of now: the newest version
    # every attribute the rows and filters read came with the version
    assert [row[0] for row in found(client, Reader.in_lang, None, lang="de")] == ["p3"]
    assert {row[0] for row in found(client, Reader.in_lang, None)} == {"p1", "p2"}


def test_a_backfill_writes_each_changed_version_and_a_search_finds_it_as_of_its_time(
    vectors: str, tmp_path: Path
) -> None:
    with pages_client(vectors, tmp_path) as client:
        assert found(client, Reader.pages, T0 + DAY) == []  # nothing written yet
        report = backfill(client)
        # 3 pages x 5 days, but p1 and p3 never change and p2 changes once: 4 versions
        assert (report.rows, report.errors, report.documents) == (15, 0, 4)
        # the backfill computed the vector and every scalar feature too, into the offline store
        assert report.values == 15 * 4
        check_point_in_time(client)
        again = backfill(client)  # the same grid again adds no version (same observed_at)
        assert again.documents == 4
        check_point_in_time(client)


def test_a_backfill_on_ray_workers_writes_the_index_here(
    tmp_path: Path, ray_cluster: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ray_engine, "ROWS_PER_PART", 8)  # the grid split across both workers
    with pages_client(str(tmp_path / "vectors"), tmp_path) as client:
        report = backfill(client, "ray", features=[Page.vector])
        assert (report.rows, report.errors, report.documents) == (15, 0, 4)
        check_point_in_time(client)


def test_a_row_whose_embedding_fails_is_an_error_and_not_a_version(tmp_path: Path) -> None:
    with pages_client(str(tmp_path / "vectors"), tmp_path) as client:
        real_embed = client.llm.embed

        async def failing(body: dict[str, Any]) -> dict[str, Any]:
            if INVOICE in body["input"]:
                raise CompletionFailed("the embedding model is down")
            return await real_embed(body)

        client.llm.embed = failing  # type: ignore[method-assign]
        report = backfill(client, features=[Page.vector])
        # p2's invoice version failed at T0+3d and T0+4d: two errors, no version of it
        assert (report.rows, report.errors, report.documents) == (15, 2, 3)
        now = found(client, Reader.pages, None)
        assert ("p2", BREAD, T0 - DAY) in now and all(t != INVOICE for _, t, _ in now)


@features(events=True, namespace="memo")
class Memo:
    id: str
    text: str
    owner: str  # written with events only: no resolver computes it
    at: FeatureTime
    vector: Vector[Literal[384]] = kr.embedding(model="local/minilm", input=_.text)


@features(namespace="memo_reader")
class MemoReader:
    id: str
    vector: Vector[Literal[384]]
    memos: DataFrame[Memo] = kr.nearest(Memo.vector, query=_.vector, k=2)


@online
def memo_text(mid: Memo.id) -> Memo.text:
    return f"memo {mid}"


def test_a_feature_the_versions_need_but_nothing_computes_is_refused_naming_it(
    tmp_path: Path,
) -> None:
    with (
        kr.Client(
            definitions=[Memo, MemoReader, memo_text],
            query_log="none://",
            offline_store=f"duckdb:///{tmp_path / 'offline.duckdb'}",
            vectors=str(tmp_path / "vectors"),
        ) as client,
        pytest.raises(
            InvalidInput,
            match=r"writes whole documents to the vector index of memo.vector, and memo.owner "
            r"cannot be computed from memo.id: .*give memo.owner a resolver",
        ),
    ):
        client.materialize(keys=["m1"], start=T0, end=T0, every="1d", features=[Memo.text])


# --- from a SQL resolver, a class whose FeatureTime nothing computes --------------------------

FAQ_FEATURES = """
from typing import Literal

import kairos as kr
from kairos import DataFrame, FeatureTime, Vector, _, features


@features(events=True)
class Faq:
    id: str
    answer: str
    topic: str
    at: FeatureTime
    vector: Vector[Literal[384]] = kr.embedding(model="local/minilm", input=_.answer)


@features
class Asker:
    id: str
    question: str
    vector: Vector[Literal[384]] = kr.embedding(model="local/minilm", input=_.question)
    faqs: DataFrame[Faq] = kr.nearest(Faq.vector, query=_.vector, k=2)
"""

FAQ_SQL = """\
-- resolves: Faq
-- source: cms
select id, answer, topic from faq_versions
where id = :id and valid_from <= :now
order by valid_from desc limit 1
"""


def test_documents_from_a_sql_resolver_are_observed_at_the_grid_time_once_each(
    vectors: str, tmp_path: Path
) -> None:
    folder = tmp_path / "faq"
    folder.mkdir()
    (folder / "features.py").write_text(FAQ_FEATURES)
    (folder / "faq.sql").write_text(textwrap.dedent(FAQ_SQL))
    database = tmp_path / "cms.sqlite"
    with sqlite3.connect(database) as cms:
        cms.execute("create table faq_versions (id text, answer text, topic text, valid_from)")
        cms.executemany(
            "insert into faq_versions values (?, ?, ?, ?)",
            [
                ("f1", PASSWORD, "login", (T0 - DAY).isoformat()),
                ("f2", BREAD, "kitchen", (T0 - DAY).isoformat()),
                ("f2", INVOICE, "billing", (T0 + DAY + timedelta(hours=6)).isoformat()),
            ],
        )
    settings = {
        "sources": {"cms": f"sqlite:///{database}"},
        "query_log": "none://",
        "offline_store": f"duckdb:///{tmp_path / 'offline.duckdb'}",
        "vectors": vectors,
        "resolver_timeout": "60s",  # the first call loads the local model
    }
    (folder / "kairos.yaml").write_text(yaml.safe_dump(settings))
    with kr.Client(folder) as client:
        report = client.materialize(
            keys=["f1", "f2"], start=T0, end=T0 + 4 * DAY, every="1d", features=["faq.answer"]
        )
        assert (report.rows, report.errors, report.documents) == (10, 0, 3)

        def faqs(now: datetime) -> list[tuple[str, str, str, datetime]]:
            result = client.query(
                {"asker.id": "a1", "asker.question": QUESTION}, ["asker.faqs"], now=now
            )
            assert not result.errors, result.errors
            return [
                (r["id"], r["answer"], r["topic"], r["at"]) for r in result.get_value("asker.faqs")
            ]

        assert faqs(T0 - timedelta(hours=1)) == []  # observed at the first grid time
        assert ("f2", BREAD, "kitchen", T0) in faqs(T0 + DAY + timedelta(hours=12))
        # the edit is seen at the next grid time; an unchanged f1 stays its first version
        assert faqs(T0 + 4 * DAY)[0] == ("f2", INVOICE, "billing", T0 + 2 * DAY)
        assert ("f1", PASSWORD, "login", T0) in faqs(T0 + 4 * DAY)


@online
def corrected_content(
    pid: Page.id, now: kr.Now
) -> kr.Features[Page.title, Page.lang, Page.edited_at]:
    """A CMS that fixed p2's text on day 2 without moving its edit time."""
    title = BREAD if pid == "p2" and now < T0 + 2 * DAY else INVOICE if pid == "p2" else GARDEN
    return title, "en", T0 - DAY


def test_a_corrected_document_with_an_unchanged_time_replaces_that_version(
    vectors: str, tmp_path: Path
) -> None:
    with kr.Client(
        definitions=[Page, Reader, corrected_content],
        query_log="none://",
        offline_store=f"duckdb:///{tmp_path / 'offline.duckdb'}",
        vectors=vectors,
        default_timeout="60s",  # the first call loads the local model
    ) as client:
        report = backfill(client, keys=["p2", "p3"])
        assert report.documents == 3  # p2 twice (its text changed), p3 once
        rows = found(client, Reader.pages, None)
    assert ("p2", INVOICE, T0 - DAY) in rows and all(title != BREAD for _, title, _ in rows)


NOTES = """
from datetime import datetime, timezone
from typing import Literal

import kairos as kr
from kairos import DataFrame, FeatureTime, Vector, _, features, online


@features(events=True)
class Note:
    id: str
    text: str
    written_at: FeatureTime
    vector: Vector[Literal[2]]


@features
class Asker:
    id: str
    vector: Vector[Literal[2]]
    notes: DataFrame[Note] = kr.nearest(Note.vector, query=_.vector, k=2)


@online
def note(nid: Note.id) -> kr.Features[Note.text, Note.written_at, Note.vector]:
    at = datetime(2026, 4, 30, tzinfo=timezone.utc)
    return f"note {nid}", at, [1.0, 0.0] if nid == "n1" else [0.0, 1.0]
"""


def test_kairos_materialize_says_how_many_document_versions_it_indexed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    project = tmp_path / "notes"
    project.mkdir()
    (project / "features.py").write_text(NOTES)
    span = ["--start", T0.isoformat(), "--end", (T0 + DAY).isoformat(), "--every", "1d"]
    argv = ["materialize", "note.text", "--project", str(project), "--keys", "n1,n2", *span]
    assert main(argv) == 0
    assert "2 document versions into vector indexes, 0 errors" in capsys.readouterr().out
    with kr.Client(project) as client:
        result = client.query({"asker.id": "a", "asker.vector": [0.9, 0.1]}, ["asker.notes"])
    assert [row["id"] for row in result.get_value("asker.notes")] == ["n1", "n2"]
