"""`kr.nearest`: vector search as a has-many feature, one test body over the embedded index
and pgvector (a pgserver PostgreSQL 16 + pgvector, the fixture of tests/stores/test_vectors.py).

Point in time, filters during the search, the distance column, writes through
`client.write_events` (vectors given or computed by the local all-MiniLM-L6-v2), offline rows
at two times, and tokens per retrieved row in a prompt.
"""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Literal

import numpy as np
import psycopg
import pytest

import kairos as kr
from kairos import DataFrame, FeatureTime, Vector, _, features
from kairos.definitions.graph import Graph
from kairos.errors import DefinitionError, InvalidInput
from kairos.llm.prompts import TEMPLATE
from tests.resolvers.test_llm import Provider, gateway_for, tokens
from tests.resolvers.test_llm import provider as provider  # the fake model, a fixture
from tests.stores.test_vectors import pg_url as pg_url  # pgvector, a fixture

T0 = datetime(2026, 3, 1, tzinfo=UTC)


@features(events=True)
class Doc:
    id: str
    text: str
    lang: str
    year: int
    updated_at: FeatureTime
    embedding: Vector[Literal[3]]


@features
class Ticket:
    id: str
    lang: str
    question_embedding: Vector[Literal[3]]
    related: DataFrame[Doc] = kr.nearest(Doc.embedding, query=_.question_embedding, k=3)
    same_lang: DataFrame[Doc] = kr.nearest(
        Doc.embedding,
        query=_.question_embedding,
        k=3,
        where=(_.lang == kr.parent.lang) & (_.year >= 2020),
    )
    advice: str = kr.completion(
        model="gpt-4",
        messages=[kr.message("user", "Docs:{% for d in related %} [{{ d.text }}]{% endfor %}")],
    )
    advice_usage: dict[str, Any] = kr.completion_usage("advice")


def unit(angle: float) -> list[float]:
    """A vector in the x-y plane at `angle` degrees: cosine distance grows with the angle."""
    return [math.cos(math.radians(angle)), math.sin(math.radians(angle)), 0.0]


def doc(i: int, angle: float, lang: str = "en", year: int = 2024, at: datetime = T0) -> Any:
    return {
        "id": f"d{i}", "text": f"doc {i}", "lang": lang, "year": year, "updated_at": at,
        "embedding": unit(angle),
    }  # fmt: skip


@pytest.fixture(params=["embedded", "pgvector"])
def vectors(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """Where the client keeps its indexes: a folder, or a PostgreSQL with pgvector."""
    if request.param == "embedded":
        yield str(tmp_path / "vectors")
        return
    url: str = request.getfixturevalue("pg_url")
    yield url
    with psycopg.connect(url, autocommit=True) as connection:
        # a client's indexes are tables named after the searched feature: "doc.embedding"
        tables = connection.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = 'public' AND tablename LIKE '%.%'"
        ).fetchall()
        for (table,) in tables:
            connection.execute(f'DROP TABLE IF EXISTS "{table}"')


def client_for(vectors: str, tmp_path: Path, **options: Any) -> kr.Client:
    return kr.Client(
        definitions=[Doc, Ticket],
        query_log="none://",
        offline_store=options.pop("offline_store", "none://"),
        vectors=vectors,
        **options,
    )


def ask(client: kr.Client, output: Any, now: datetime, lang: str = "en") -> Any:
    result = client.query(
        {Ticket.id: "t1", Ticket.lang: lang, Ticket.question_embedding: unit(0)}, [output], now=now
    )
    assert not result.errors, result.errors
    return result


def test_k_rows_nearest_first_each_with_its_features_and_distance(
    vectors: str, tmp_path: Path
) -> None:
    with client_for(vectors, tmp_path) as client:
        client.write_events(Doc, [doc(i, angle) for i, angle in enumerate([50, 10, 80, 30, 5])])
        result = ask(client, Ticket.related, T0 + timedelta(minutes=1))
    rows = result.get_value(Ticket.related)
    assert [r["id"] for r in rows] == ["d4", "d1", "d3"]
    distances = [r["distance"] for r in rows]
    assert distances == sorted(distances)
    assert distances[0] == pytest.approx(1 - math.cos(math.radians(5)), abs=1e-5)
    assert rows[1] == {
        "id": "d1", "text": "doc 1", "lang": "en", "year": 2024, "updated_at": T0,
        "distance": pytest.approx(1 - math.cos(math.radians(10)), abs=1e-5),
    }  # fmt: skip
    assert [n.kind for n in result.trace][:1] == ["nearest"]  # the search has its own timing


def test_a_selective_filter_applies_during_the_search_and_still_returns_k_rows(
    vectors: str, tmp_path: Path
) -> None:
    # 60 near documents in German, then 3 far ones in English: a filter after a top-k would
    # find no English document among the 3 nearest
    near = [doc(i, 1 + i / 100, lang="de") for i in range(60)]
    far = [doc(100 + i, 60 + i, lang="en") for i in range(3)]
    old = [doc(200, 0.5, lang="en", year=2019)]  # nearest of all, but too old
    with client_for(vectors, tmp_path) as client:
        client.write_events(Doc, [*near, *far, *old])
        english = ask(client, Ticket.same_lang, T0 + timedelta(minutes=1)).get_value(
            Ticket.same_lang
        )
        german = ask(client, Ticket.same_lang, T0 + timedelta(minutes=1), lang="de").get_value(
            Ticket.same_lang
        )
    assert [r["id"] for r in english] == ["d100", "d101", "d102"]
    assert [r["id"] for r in german] == ["d0", "d1", "d2"]


def test_a_document_observed_after_now_is_invisible_and_an_update_is_found_by_its_newest_version(
    vectors: str, tmp_path: Path
) -> None:
    with client_for(vectors, tmp_path) as client:
        client.write_events(Doc, [doc(1, 10), doc(2, 20), doc(3, 1, at=T0 + timedelta(hours=2))])
        # d2 moves next to the query an hour later: a new version of the same document
        client.write_events(Doc, [doc(2, 2, at=T0 + timedelta(hours=1))])
        before = ask(client, Ticket.related, T0 + timedelta(minutes=30))
        between = ask(client, Ticket.related, T0 + timedelta(minutes=90))
        after = ask(client, Ticket.related, T0 + timedelta(hours=3))
    assert [r["id"] for r in before.get_value(Ticket.related)] == ["d1", "d2"]
    rows = between.get_value(Ticket.related)
    assert [r["id"] for r in rows] == ["d2", "d1"]  # d3 is not there yet; d2 once, its newest
    assert rows[0]["updated_at"] == T0 + timedelta(hours=1)
    assert [r["id"] for r in after.get_value(Ticket.related)] == ["d3", "d2", "d1"]


def test_versions_of_one_document_in_one_write_each_stay_searchable_as_of_their_time(
    vectors: str, tmp_path: Path
) -> None:
    # a corpus loaded at once carries an article's history: the windows keep an id's last
    # row, the index every version
    history = [doc(1, 40), doc(2, 20), doc(1, 1, at=T0 + timedelta(hours=1))]
    with client_for(vectors, tmp_path) as client:
        assert client.write_events(Doc, history) == 2  # events: the id's last row
        before = ask(client, Ticket.related, T0 + timedelta(minutes=30)).get_value(Ticket.related)
        after = ask(client, Ticket.related, T0 + timedelta(hours=2)).get_value(Ticket.related)
    assert [(r["id"], r["updated_at"]) for r in before] == [("d2", T0), ("d1", T0)]
    assert [(r["id"], r["updated_at"]) for r in after] == [
        ("d1", T0 + timedelta(hours=1)),
        ("d2", T0),
    ]


def test_offline_rows_at_two_times_retrieve_the_corpus_as_of_each(
    vectors: str, tmp_path: Path
) -> None:
    with client_for(vectors, tmp_path) as client:
        client.write_events(Doc, [doc(1, 30), doc(2, 5, at=T0 + timedelta(days=1))])
        spine = {
            "ticket.id": ["t1", "t1"],
            "ticket.lang": ["en", "en"],
            "ticket.question_embedding": [unit(0), unit(0)],
            "ts": [T0 + timedelta(hours=1), T0 + timedelta(days=2)],
        }
        result = client.offline_query(spine, [Ticket.related])
    assert not result.errors
    early, late = result.column("ticket.related")
    assert [r["id"] for r in early] == ["d1"]
    assert [r["id"] for r in late] == ["d2", "d1"]


def test_tokens_per_retrieved_row_are_attributed_in_the_prompt(
    vectors: str, tmp_path: Path, provider: tuple[Provider, str]
) -> None:
    gateway = gateway_for(provider[1], tmp_path)
    plain, _ = asyncio.run(gateway.create_key(name="rag", models=["gpt-4"]))
    with client_for(vectors, tmp_path, gateway=gateway, llm_key=plain) as client:
        client.write_events(Doc, [doc(1, 10), doc(2, 20)])
        client.write_events(Doc, [{**doc(3, 30), "text": "a much longer third document"}])
        usage = ask(client, Ticket.advice_usage, T0 + timedelta(minutes=1)).get_value(
            Ticket.advice_usage
        )
    by_feature = usage["tokens_by_feature"]
    full = "Docs: [doc 1] [doc 2] [a much longer third document]"
    assert set(by_feature) == {
        "related", "related[0]", "related[1]", "related[2]", TEMPLATE, "(format)"
    }  # fmt: skip
    assert by_feature["related[0]"] == tokens(full) - tokens(full.replace(" [doc 1]", ""))
    assert by_feature["related[2]"] == tokens(full) - tokens(
        full.replace(" [a much longer third document]", "")
    )
    assert by_feature["related[2]"] > by_feature["related[0]"]
    assert sum(by_feature.values()) == usage["prompt_tokens"]


# --- the local embedding model, end to end --------------------------------------------------

TOPICS = {
    "billing": [
        "How do I update the credit card used for my subscription?",
        "Your invoice lists every charge of the last billing period.",
        "Refunds for a cancelled plan reach your card within ten days.",
        "You can download past invoices as PDF files from the billing page.",
        "A failed payment is retried three times before the plan is paused.",
        "Change the billing currency before the next invoice is issued.",
        "Annual plans are charged once a year on the renewal date.",
        "Taxes on your invoice depend on the billing address you gave.",
        "A coupon code lowers the price of your next three invoices.",
        "Prorated charges appear when you upgrade in the middle of a month.",
    ],
    "password": [
        "Reset a forgotten password with the link sent to your email.",
        "Passwords must have at least twelve characters and one digit.",
        "Two-factor authentication asks for a code from your phone at login.",
        "After five wrong passwords the account is locked for fifteen minutes.",
        "Use the security page to sign out of every other device.",
        "A password reset link expires after one hour.",
        "Recovery codes let you log in when you lose your phone.",
        "Single sign-on users change their password with their company.",
        "We never ask for your password in an email or a phone call.",
        "Login alerts tell you when someone signs in from a new device.",
    ],
    "shipping": [
        "Orders ship within two business days from our warehouse.",
        "Track your parcel with the number in the shipping email.",
        "International deliveries may be held by customs for a few days.",
        "Express shipping arrives the next day when ordered before noon.",
        "A damaged package can be returned for a free replacement.",
        "Change the delivery address until the order leaves the warehouse.",
        "Free shipping applies to orders above fifty dollars.",
        "Parcels to remote islands take up to two weeks to arrive.",
        "The courier leaves a note when nobody is home to sign.",
        "Combine several orders into one shipment to save on postage.",
    ],
    "garden": [
        "Water tomato plants early in the morning during hot weeks.",
        "Roses need pruning at the end of winter before new shoots.",
        "Compost turns kitchen scraps into rich soil for the beds.",
        "Plant tulip bulbs in autumn, a hand's depth into the ground.",
        "Slugs eat young lettuce; beer traps keep them away.",
        "Mulch keeps the soil moist and stops weeds from growing.",
        "Apple trees bloom in spring and bear fruit in late summer.",
        "Basil grows best in a sunny spot sheltered from the wind.",
        "Cut the lawn high in dry weather so the grass stays green.",
        "Seedlings should harden off outside before they are planted out.",
    ],
    "cooking": [
        "Knead the bread dough for ten minutes until it is smooth.",
        "Roast the vegetables at two hundred degrees for half an hour.",
        "A pinch of salt brings out the sweetness of a caramel sauce.",
        "Let the steak rest for five minutes before slicing it.",
        "Whisk the eggs with sugar until the mixture turns pale.",
        "Simmer the tomato sauce slowly so the flavours deepen.",
        "Soak dried beans overnight before cooking them.",
        "Toast the spices in a dry pan to release their aroma.",
        "Fold the flour in gently to keep the batter airy.",
        "Cool the cake completely before adding the frosting.",
    ],
}


@features(events=True)
class Article:
    id: str
    topic: str
    text: str
    updated_at: FeatureTime
    vector: Vector[Literal[384]] = kr.embedding(model="local/minilm", input=_.text)


@features
class Question:
    id: str
    text: str
    vector: Vector[Literal[384]] = kr.embedding(model="local/minilm", input=_.text)
    answers: DataFrame[Article] = kr.nearest(Article.vector, query=_.vector, k=5)
    in_topic: DataFrame[Article] = kr.nearest(
        Article.vector, query=_.vector, k=5, where=_.topic.is_in(["garden"])
    )


def test_the_local_model_embeds_written_rows_in_one_batch_and_finds_the_topic(
    tmp_path: Path,
) -> None:
    rows = [
        {"id": f"{topic}{i}", "topic": topic, "text": text, "updated_at": T0}
        for topic, texts in TOPICS.items()
        for i, text in enumerate(texts)
    ]
    assert len(rows) == 50
    with kr.Client(
        definitions=[Article, Question],
        query_log="none://",
        offline_store="none://",
        vectors=str(tmp_path / "vectors"),
    ) as client:
        embedded: list[int] = []
        real_embed = client.llm.embed

        async def counted(body: dict[str, Any]) -> dict[str, Any]:
            embedded.append(len(body["input"]))
            return await real_embed(body)

        client.llm.embed = counted  # type: ignore[method-assign]
        assert client.write_events(Article, rows) == 50
        assert embedded == [50]  # one call for the batch, not one per row
        result = client.query(
            {Question.id: "q1", Question.text: "My card payment failed, will you charge again?"},
            [Question.answers, Question.in_topic],
            now=T0 + timedelta(minutes=1),
        )
    assert not result.errors
    answers = result.get_value(Question.answers)
    assert len(answers) == 5 and "vector" not in answers[0]
    assert [r["topic"] for r in answers[:3]] == ["billing"] * 3
    assert answers[0]["id"] == "billing4"  # "A failed payment is retried three times..."
    garden = result.get_value(Question.in_topic)
    assert len(garden) == 5 and {r["topic"] for r in garden} == {"garden"}


def test_a_row_whose_embedding_fails_fails_the_write_naming_it_and_nothing_is_kept(
    tmp_path: Path,
) -> None:
    @features(events=True, namespace="note")
    class Note:
        id: str
        text: str
        at: FeatureTime
        vector: Vector[Literal[8]] = kr.embedding(model="local/minilm", input=_.text)

    @features(namespace="reader")
    class Reader:
        id: str
        vector: Vector[Literal[8]]
        notes: DataFrame[Note] = kr.nearest(Note.vector, query=_.vector, k=2)

    with kr.Client(
        definitions=[Note, Reader],
        query_log="none://",
        offline_store=f"duckdb:///{tmp_path / 'offline.duckdb'}",
        vectors=str(tmp_path / "vectors"),
    ) as client:
        given = {"id": "n0", "text": "given", "at": T0, "vector": [1.0] * 8}
        with pytest.raises(
            InvalidInput, match=r"row 1: the embedding of note.vector .*8 floats, got 384"
        ):
            client.write_events(Note, [given, {"id": "n1", "text": "computed", "at": T0}])
        result = client.query({Reader.id: "r1", Reader.vector: [1.0] * 8}, [Reader.notes], now=T0)
        assert result.get_value(Reader.notes) == []  # n0 was not kept either
        assert client.offline_store().latest_rows("note", ["at"]).num_rows == 0


def test_vector_values_are_checked_naming_the_feature_and_the_lengths(tmp_path: Path) -> None:
    with client_for(str(tmp_path / "vectors"), tmp_path) as client:
        with pytest.raises(InvalidInput, match=r"event 0, 'embedding'.*3 floats, got 2"):
            client.write_events(Doc, [{**doc(1, 0), "embedding": [1.0, 0.0]}])
        with pytest.raises(InvalidInput, match=r"item 1 is str 'x', not a number"):
            client.write_events(Doc, [{**doc(1, 0), "embedding": [1.0, "x", 0.0]}])
        client.write_events(Doc, [{**doc(1, 0), "embedding": np.array([1, 0, 0], np.float32)}])
        result = client.query(
            {Ticket.id: "t", Ticket.lang: "en", Ticket.question_embedding: (1, 0, 0)},
            [Ticket.question_embedding, Ticket.related],
            now=T0,
        )
    assert result.get_value(Ticket.question_embedding) == [1.0, 0.0, 0.0]
    assert [r["id"] for r in result.get_value(Ticket.related)] == ["d1"]


# --- bad definitions -------------------------------------------------------------------------


def ticket_with(**search: Any) -> type:
    options = {"query": _.question_embedding, "k": 3, **search}
    vector = options.pop("vector", Doc.embedding)

    @features(namespace="bad_ticket")
    class BadTicket:
        id: str
        lang: str
        text: str
        question_embedding: Vector[Literal[3]]
        related: DataFrame[Doc] = kr.nearest(vector, **options)

    return BadTicket


@pytest.mark.parametrize(
    ("search", "message"),
    [
        ({"k": 0}, r"BadTicket.related = kr.nearest\(...\): k=0 must be a positive int"),
        ({"k": "5"}, r"k='5' must be a positive int"),
        ({"query": _.text}, r"query=_.text is not a vector; declare it e.g. `text: Vector\[3\]"),
        ({"query": _.nope}, r"bad_ticket has no feature 'nope'"),
        ({"vector": Doc.text}, r"doc.text is not a vector"),
        ({"where": _.text.str.contains("x")}, r"where=.*supported are comparisons"),
        ({"where": (_.lang == "en") | (_.year > 1)}, r"supported are .* joined with &"),
        ({"where": _.lang == _.text}, r"supported are"),
        ({"where": _.langg == "en"}, r"_.langg, which is not a feature of doc; did you mean"),
        ({"where": _.lang == kr.parent.nope}, r"kr.parent.nope, which is not a feature of bad"),
    ],
)
def test_bad_searches_fail_when_the_project_loads_naming_the_feature(
    search: dict[str, Any], message: str
) -> None:
    with pytest.raises(DefinitionError, match=message):
        Graph.build([Doc, ticket_with(**search)])


def test_the_documents_must_be_written_as_events() -> None:
    @features(namespace="page")
    class Page:
        id: str
        at: FeatureTime
        vector: Vector[Literal[3]]

    @features(namespace="visitor")
    class Visitor:
        id: str
        vector: Vector[Literal[3]]
        pages: DataFrame[Page] = kr.nearest(Page.vector, query=_.vector)

    with pytest.raises(DefinitionError, match=r"declare Page @features\(events=True\)"):
        Graph.build([Page, Visitor])


def test_vector_dimensions_must_be_a_positive_int() -> None:
    with pytest.raises(DefinitionError, match=r"Vector\[0\]: give the number of dimensions"):
        Vector[0]


def test_the_vectors_setting_is_a_folder_under_the_project_or_a_postgres_url(
    tmp_path: Path,
) -> None:
    from kairos.errors import ProjectError
    from kairos.project.config import Config

    assert Config.load(tmp_path).vectors == str(tmp_path / ".kairos" / "vectors")
    (tmp_path / "kairos.yaml").write_text("vectors: indexes\n")
    assert Config.load(tmp_path).vectors == str(tmp_path / "indexes")
    (tmp_path / "kairos.yaml").write_text("vectors: postgresql://app@db/bank\n")
    assert Config.load(tmp_path).vectors == "postgresql://app@db/bank"
    (tmp_path / "kairos.yaml").write_text("vectors: 3\n")
    with pytest.raises(ProjectError, match="`vectors` is a folder"):
        Config.load(tmp_path)


def test_a_vector_computed_at_write_is_kept_with_the_event_in_the_offline_store(
    tmp_path: Path,
) -> None:
    with kr.Client(
        definitions=[Article, Question],
        query_log="none://",
        offline_store=f"duckdb:///{tmp_path / 'offline.duckdb'}",
        vectors=str(tmp_path / "vectors"),
    ) as client:
        client.write_events(
            Article,
            [
                {"id": "a1", "topic": "garden", "text": "old text", "updated_at": T0},
                {"id": "a1", "topic": "garden", "text": TOPICS["garden"][0], "updated_at": T0},
            ],
        )
        kept = client.offline_store().latest_rows("article", ["text", "vector"]).to_pylist()
        found = client.query(
            {Question.id: "q", Question.text: TOPICS["garden"][0]},
            [Question.vector, Question.answers],
            now=T0 + timedelta(minutes=1),
        )
    assert len(kept) == 1 and kept[0]["text"] == TOPICS["garden"][0]
    assert kept[0]["vector"] is not None  # the embedding the write computed, not a null
    stored = np.array(json.loads(kept[0]["vector"]))
    asked = np.array(found.get_value(Question.vector))
    assert stored.shape == (384,)
    assert float(stored @ asked / np.linalg.norm(stored) / np.linalg.norm(asked)) > 0.999
