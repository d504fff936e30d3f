"""The Models pages over a real SQLite registry with two registered scikit-learn versions and
a decision log of real queries: versions, schema, aliases, latency and calls from the log,
alias moves and rollbacks through the forms (CSRF enforced), and the history saying who."""

import hashlib
import html
import re
import sqlite3
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest

import kairos as kr
from kairos.project.config import ServerConfig
from kairos.server import create_app
from kairos.ui import models as models_page
from kairos.ui.models import WINDOW, window_stats
from kairos.ui.traffic import percentile
from tests.models.test_model_features import Account, config, inputs, linear
from tests.ui.cells import cells

pytestmark = pytest.mark.anyio
KEY = "server-key-for-the-models-page"
QUERIES = 4


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def client(tmp_path: Path) -> Iterator[kr.Client]:
    """Model `score`: v1 (alias prod, queried QUERIES times) and v2; `<script>` in metadata."""
    with kr.Client(definitions=[Account, inputs], config=config(tmp_path)) as client:
        client.models.register(
            "score", linear(1.0, 1.0), aliases=["prod"], inputs=["a", "b"],
            metadata={"team": "risk <script>alert(1)</script>", "auc": 0.91},
        )  # fmt: skip
        client.models.register("score", linear(10.0, 0.0), inputs=["a", "b"])
        for i in range(QUERIES):
            result = client.query({Account.id: f"acc{i + 1}"}, [Account.score])
            assert result.errors == []
        client.log.store.flush()
        yield client


async def served(client: kr.Client, keys: tuple[str, ...] = ()) -> httpx.AsyncClient:
    app = create_app(client, ServerConfig(keys=keys))
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://localhost")


@pytest.fixture
async def http(client: kr.Client) -> AsyncIterator[httpx.AsyncClient]:
    async with await served(client) as http:
        yield http


def csrf_of(page: str) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', page)
    assert found, "the page has no CSRF field"
    return found.group(1)


def history(page: str) -> list[list[str]]:
    table = page.split('class="models-history"', 1)[1].split("</table>", 1)[0]
    return [
        [
            html.unescape(re.sub(r"<[^>]+>", "", cell)).strip()
            for cell in re.findall(r"<td[^>]*>(.*?)</td>", r, re.S)
        ]
        for r in re.findall(r"<tr>(.*?)</tr>", table, re.S)
        if "<td" in r
    ]


async def test_models_page_lists_versions_aliases_and_calls(http: httpx.AsyncClient) -> None:
    response = await http.get("/ui/models")
    assert response.status_code == 200, response.text
    page = response.text
    row = cells(page, 'href="/ui/models/score"')
    assert row[0] == "score" and row[1] == "2"  # two versions
    assert row[2].startswith("v2") and "sklearn" in row[2]
    assert row[3] == "prod → v1"
    assert row[4] == str(QUERIES) and row[5] == str(QUERIES)  # decisions, predictions (v1's)
    assert row[6].endswith("ms") and row[7].endswith("ms")  # p50, p99 from the traces
    assert f"the newest {QUERIES} decisions in the log" in page
    assert "set" in row[8] and "by unknown" in row[8]  # registration's move names no one


async def test_a_models_page_shows_each_version_schema_and_metadata(
    http: httpx.AsyncClient, client: kr.Client
) -> None:
    response = await http.get("/ui/models/score")
    assert response.status_code == 200, response.text
    page = response.text
    v1, v2 = client.models.get("score", 1), client.models.get("score", 2)
    for version in (v1, v2):
        assert f'id="v{version.version}"' in page
        assert version.sha256[:12] in page and version.sha256 in page  # short, and in full
    assert page.count("sklearn") >= 2 and v1.format in page
    assert cells(page, '<td class="mono">a</td>') == ["0", "a", "float64"]  # schema inputs
    assert cells(page, '<td class="mono">b</td>') == ["1", "b", "float64"]
    # the features it serves, with their types, and the latency of v1 in the window
    uses = cells(page, 'href="/ui/features/account.score"')
    assert uses[:3] == ["account.score", "float", "alias=prod"]
    assert uses[3] == "account.a: float, account.b: float"
    assert "v1 p50" in page and "v1 p99" in page and "v2 p50" not in page
    assert f"{QUERIES} <span" in page.split('id="v1"', 1)[1].split("decisions</dt>")[1][:40]
    # metadata is escaped, never markup
    assert "<script>alert(1)</script>" not in page
    assert "risk &lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "0.91" in page
    assert "script-src" not in response.headers["content-security-policy"]
    assert "default-src 'none'" in response.headers["content-security-policy"]


async def test_move_and_roll_back_an_alias_through_the_forms(
    http: httpx.AsyncClient, client: kr.Client
) -> None:
    page = (await http.get("/ui/models/score")).text
    token = csrf_of(page)
    moved = await http.post(
        "/ui/models/score/alias", data={"csrf": token, "alias": "prod", "version": "2"}
    )
    assert moved.status_code == 303, moved.text
    assert moved.headers["location"] == "/ui/models/score?moved=prod#history"
    assert client.models.get("score", alias="prod").version == 2
    # the feature follows the alias (the client re-binds on a move)
    assert client.query({Account.id: "acc4"}, [Account.score]).get_value(
        Account.score
    ) == pytest.approx(40.0)
    page = (await http.get(moved.headers["location"])).text
    assert "Alias prod now points at v2." in page
    assert cells(page, '<td class="mono">prod</td>')[:2] == ["prod", "v2"]
    assert history(page)[0][1:] == ["prod", "set", "v1", "v2", "dashboard"]

    back = await http.post("/ui/models/score/rollback", data={"csrf": token, "alias": "prod"})
    assert back.status_code == 303, back.text
    assert client.models.get("score", alias="prod").version == 1
    page = (await http.get("/ui/models/score")).text
    rows = history(page)
    assert [r[1:] for r in rows] == [
        ["prod", "rollback", "v2", "v1", "dashboard"],
        ["prod", "set", "v1", "v2", "dashboard"],
        ["prod", "set", "–", "v1", "–"],
    ]
    # a new alias from the form below the table
    canary = await http.post(
        "/ui/models/score/alias", data={"csrf": token, "alias": "canary", "version": "2"}
    )
    assert canary.status_code == 303
    assert client.models.aliases("score") == {"canary": 2, "prod": 1}


async def test_forms_without_the_csrf_token_are_refused(
    http: httpx.AsyncClient, client: kr.Client
) -> None:
    page = (await http.get("/ui/models/score")).text
    token = csrf_of(page)
    for data in ({"alias": "prod", "version": "2"}, {"csrf": "x" * 40, "alias": "prod"}):
        for path in ("/ui/models/score/alias", "/ui/models/score/rollback"):
            refused = await http.post(path, data=data)
            assert refused.status_code == 403, refused.text
            assert "CSRF token" in refused.text and "<code>csrf</code>" in refused.text
    other_site = await http.post(
        "/ui/models/score/alias", data={"csrf": token, "alias": "prod", "version": "2"},
        headers={"Origin": "http://evil.example"},
    )  # fmt: skip
    assert other_site.status_code == 403
    assert client.models.get("score", alias="prod").version == 1
    assert [c.changed_by for c in client.models.history("score")] == [None]


async def test_bad_form_input_is_a_page_naming_the_field(http: httpx.AsyncClient) -> None:
    token = csrf_of((await http.get("/ui/models/score")).text)
    cases = [
        ("/ui/models/score/alias", {"alias": "prod", "version": "9"}, 400, "version",
         "has no version 9; it has versions 1 to 2"),
        ("/ui/models/score/alias", {"alias": "prod", "version": "two"}, 400, "version",
         "must be a version number"),
        ("/ui/models/score/alias", {"alias": "2", "version": "1"}, 400, "alias",
         "numbers are versions"),
        ("/ui/models/nope/alias", {"alias": "prod", "version": "1"}, 404, "model",
         "no model named 'nope'"),
        ("/ui/models/score/rollback", {"alias": "prod"}, 400, "alias",
         "no earlier version to roll back to"),
        ("/ui/models/score/rollback", {"alias": "nope"}, 400, "alias", "has no alias 'nope'"),
    ]  # fmt: skip
    for path, data, status, field, message in cases:
        response = await http.post(path, data={"csrf": token, **data})
        assert response.status_code == status, (path, data, response.text)
        text = html.unescape(response.text)
        assert message in text and f"field: <code>{field}</code>" in text, text
        assert "Traceback" not in text
    missing = await http.get("/ui/models/nope")
    assert missing.status_code == 404 and "no model named" in html.unescape(missing.text)


async def test_a_signed_in_move_records_a_digest_of_the_key(client: kr.Client) -> None:
    async with await served(client, keys=(KEY,)) as http:
        assert (await http.get("/ui/models")).status_code == 303  # to the login form
        login = await http.get("/ui/login")
        signed = await http.post(
            "/ui/login", data={"csrf": csrf_of(login.text), "key": KEY, "next": "/models"}
        )
        assert signed.status_code == 303
        page = (await http.get("/ui/models/score")).text
        token = csrf_of(page)
        moved = await http.post(
            "/ui/models/score/alias", data={"csrf": token, "alias": "prod", "version": "2"}
        )
        assert moved.status_code == 303
        page = (await http.get("/ui/models/score")).text
    digest = hashlib.sha256(KEY.encode()).hexdigest()[:8]
    assert history(page)[0][-1] == f"dashboard key:{digest}"
    assert client.models.history("score")[-1].changed_by == f"dashboard key:{digest}"
    assert KEY not in page


async def test_the_pages_read_a_bounded_window_of_a_large_log(
    client: kr.Client, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """100k logged decisions: the pages read the newest WINDOW, in under 300 ms."""
    monkeypatch.setattr(models_page, "STATS_TTL", 0.0)  # each request reads the log again
    log = tmp_path / "log.db"
    with sqlite3.connect(log) as db:
        columns = [row[1] for row in db.execute("pragma table_info(kairos_query_log)")]
        rest = ", ".join(c for c in columns if c != "query_id")
        db.execute(
            f"insert into kairos_query_log (query_id, {rest}) "
            "with recursive n(i) as (select 1 union all select i + 1 from n where i < 100000) "
            f"select 'copy-' || i, {rest} from n, "
            "(select * from kairos_query_log order by rowid desc limit 1)"
        )
        assert db.execute("select count(*) from kairos_query_log").fetchone()[0] > 100_000
    async with await served(client) as http:
        timings = []
        for path in ("/ui/models", "/ui/models/score"):
            tries = []
            for _ in range(3):  # the fastest of three reads: one can stall behind other work
                response = await http.get(path)
                assert response.status_code == 200
                tries.append(float(response.headers["server-timing"].split("dur=")[1]))
            timings.append(min(tries))
        page = response.text
    assert f"the newest {WINDOW:,} decisions in the log" in page
    assert max(timings) < 300, timings


def test_window_stats_count_calls_and_each_model_step_once(client: kr.Client) -> None:
    """A bulk query's rows share one trace: its model step counts once, its rows each."""
    result = client.query_bulk({Account.id: ["acc7", "acc8", "acc9"]}, [Account.score])
    assert result.errors == []
    client.log.store.flush()
    records = client.log.store.recent(WINDOW)
    stats = window_stats(records)
    v1 = stats.of("score@v1")
    assert (v1.decisions, v1.predictions) == (QUERIES + 3, QUERIES + 3)
    steps = [
        step["duration_ms"]
        for record in records
        if not record.query_id.endswith(("-1", "-2"))  # a bulk query's other rows
        for step in record.trace
        if step["kind"] == "model"
    ]
    assert sorted(v1.times) == sorted(steps) and len(steps) == QUERIES + 1
    assert v1.p50 == percentile(sorted(steps), 50) and v1.p99 == max(steps)
    assert stats.of("score@v2").decisions == 0 and stats.decisions == len(records)
