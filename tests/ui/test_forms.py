"""The dashboard's forms: a deep link keeps its whole query through the sign-in form, a form's
POST signs in back to the dashboard (not to a URL only POST answers), a form body past its
limit is refused before it is read whole, and an alias form's version that is no plain small
number is a 400 naming the field (never a 500)."""

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest

import kairos as kr
from kairos.project.config import ServerConfig
from kairos.server import create_app
from kairos.ui.app import MAX_FORM
from tests.models.test_model_features import Account, config, inputs, linear

KEY = "review-test-key-0123456789"
pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def client(tmp_path: Path) -> Iterator[kr.Client]:
    """A project of its own (registry and log in tmp_path) with model `score` v1 (prod)."""
    with kr.Client(definitions=[Account, inputs], config=config(tmp_path)) as client:
        client.models.register("score", linear(1.0, 1.0), aliases=["prod"], inputs=["a", "b"])
        yield client


@pytest.fixture
async def keyed(client: kr.Client) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(client, ServerConfig(keys=(KEY,)))
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as http:
        yield http


async def sign_in(http: httpx.AsyncClient, next_: str = "/") -> httpx.Response:
    await http.get("/ui/login")
    form = {"csrf": str(http.cookies["kairos_csrf"]), "key": KEY, "next": next_}
    return await http.post("/ui/login", data=form)


async def test_a_deep_link_keeps_its_whole_query_through_sign_in(
    keyed: httpx.AsyncClient,
) -> None:
    page = "/ui/decisions?entity=account.id%3Aacc1&since=1h&limit=5"
    response = await keyed.get(page)
    assert response.status_code == 303
    login = await keyed.get(response.headers["location"])
    assert 'value="/decisions?entity=account.id%3Aacc1&amp;since=1h&amp;limit=5"' in login.text
    signed = await sign_in(keyed, "/decisions?entity=account.id%3Aacc1&since=1h&limit=5")
    assert signed.headers["location"] == page


async def test_a_post_without_a_key_signs_in_back_to_the_dashboard(
    keyed: httpx.AsyncClient,
) -> None:
    response = await keyed.post("/ui/models/score/alias", data={"alias": "prod", "version": "1"})
    assert response.status_code == 303
    assert response.headers["location"] == "/ui/login?next=/&admin=0"


async def test_a_form_past_its_limit_is_refused(keyed: httpx.AsyncClient) -> None:
    await keyed.get("/ui/login")
    declared = await keyed.post(
        "/ui/login",
        content=b"a" * (MAX_FORM + 1),
        headers={"content-type": "application/x-www-form-urlencoded"},
    )
    assert declared.status_code == 413

    sent = 0

    async def chunks() -> AsyncIterator[bytes]:  # no content-length: refused as it arrives
        nonlocal sent
        for _ in range(64):
            sent += 1
            yield b"a" * 4096

    streamed = await keyed.post(
        "/ui/login", content=chunks(), headers={"content-type": "application/x-www-form-urlencoded"}
    )
    assert streamed.status_code == 413 and f"form over {MAX_FORM} bytes" in streamed.text
    assert sent <= MAX_FORM // 4096 + 2  # not read to its end first


@pytest.mark.parametrize("version", ["²", "99999999999999999999", "0", "-1", "1.0"])
async def test_an_alias_version_that_is_no_plain_number_is_a_400(
    keyed: httpx.AsyncClient, client: kr.Client, version: str
) -> None:
    await sign_in(keyed)
    form = {"csrf": str(keyed.cookies["kairos_csrf"]), "alias": "prod", "version": version}
    response = await keyed.post("/ui/models/score/alias", data=form)
    assert response.status_code == 400, response.text
    assert "must be a version number" in response.text and "internal error" not in response.text
    assert client.models.aliases("score") == {"prod": 1}
