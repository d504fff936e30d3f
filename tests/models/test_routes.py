"""The model routes over the real ASGI app: list, versions, aliases, predict over JSON and
Arrow, register an ONNX artifact, and 4xx bodies that name the schema or what exists."""

import hashlib
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import numpy as np
import pyarrow as pa
import pyarrow.ipc
import pytest
from sklearn.linear_model import LogisticRegression

import kairos as kr
from kairos.project.config import Config, ServerConfig
from kairos.server import create_app
from tests.server.fraud import error_of

from .test_model_features import Account, inputs

ARROW = "application/vnd.apache.arrow.stream"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def data() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(3)
    x = rng.normal(size=(200, 2))
    return x, (x[:, 0] > x[:, 1]).astype(int)


@pytest.fixture
def client(tmp_path: Path, data: tuple[np.ndarray, np.ndarray]) -> Iterator[kr.Client]:
    config = Config(base_dir=tmp_path)
    with kr.Client(definitions=[Account, inputs], config=config) as client:
        x, y = data
        client.models.register(
            "score", LogisticRegression().fit(x, y), aliases=["prod"], inputs=["a", "b"]
        )
        yield client


@pytest.fixture
async def http(client: kr.Client) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=create_app(client))
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as http:
        yield http


@pytest.mark.anyio
async def test_predict_json_rows_equal_the_model(
    http: httpx.AsyncClient, client: kr.Client, data: tuple[np.ndarray, np.ndarray]
) -> None:
    x, y = data
    model = LogisticRegression().fit(x, y)
    rows = [{"a": float(r[0]), "b": float(r[1])} for r in x[:5]]
    response = await http.post("/v1/models/score/predict", json={"rows": rows, "alias": "prod"})
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["model"] == "score@v1"
    np.testing.assert_allclose(body["predictions"], model.predict_proba(x[:5])[:, 1])
    as_lists = await http.post("/v1/models/score/predict", json={"rows": x[:5].tolist()})
    assert as_lists.json()["predictions"] == body["predictions"]


@pytest.mark.anyio
async def test_predict_arrow_in_and_out(
    http: httpx.AsyncClient, data: tuple[np.ndarray, np.ndarray]
) -> None:
    x, _ = data
    table = pa.table({"b": x[:4, 1], "a": x[:4, 0]})  # column order does not matter
    sink = pa.BufferOutputStream()
    with pyarrow.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    response = await http.post(
        "/v1/models/score/predict?version=1",
        content=sink.getvalue().to_pybytes(),
        headers={"content-type": ARROW, "accept": ARROW},
    )
    assert response.status_code == 200, response.text
    assert response.headers["x-model"] == "score@v1"
    out = pyarrow.ipc.open_stream(response.content).read_all()
    json_body = await http.post("/v1/models/score/predict", json={"rows": x[:4].tolist()})
    assert out.column("prediction").to_pylist() == json_body.json()["predictions"]


@pytest.mark.anyio
async def test_bad_rows_are_422s_naming_the_schema(http: httpx.AsyncClient) -> None:
    wrong_names = await http.post("/v1/models/score/predict", json={"rows": [{"a": 1, "c": 2}]})
    error = error_of(wrong_names, 422)
    assert "missing 'b'" in error["message"] and "unexpected 'c'" in error["message"]
    assert "a, b" in error["message"]
    wrong_count = await http.post("/v1/models/score/predict", json={"rows": [[1, 2, 3]]})
    assert "the model takes 2 (a, b)" in error_of(wrong_count, 422)["message"]
    wrong_type = await http.post("/v1/models/score/predict", json={"rows": [{"a": "x", "b": 1}]})
    error = error_of(wrong_type, 422)
    assert error["field"] == "a" and "not a number" in error["message"]
    no_rows = await http.post("/v1/models/score/predict", json={"inputs": []})
    assert error_of(no_rows, 422)["field"] == "rows"
    not_arrow = await http.post(
        "/v1/models/score/predict", content=b"nope", headers={"content-type": ARROW}
    )
    assert "not an Arrow IPC stream" in error_of(not_arrow, 422)["message"]


@pytest.mark.anyio
async def test_unknown_model_version_and_alias_are_404s_naming_what_exists(
    http: httpx.AsyncClient,
) -> None:
    missing = await http.post("/v1/models/scroe/predict", json={"rows": [[1, 2]]})
    error = error_of(missing, 404)
    assert (
        "did you mean 'score'" in error["message"]
        and "registered models: score" in (error["message"])
    )
    alias = await http.post("/v1/models/score/predict", json={"rows": [[1, 2]], "alias": "beta"})
    assert "its aliases: prod" in error_of(alias, 404)["message"]
    version = await http.get("/v1/models/score/versions/9")
    assert "versions 1 to 1" in error_of(version, 404)["message"]
    assert error_of(await http.get("/v1/models/score/versions/x"), 422)["field"] == "version"


@pytest.mark.anyio
async def test_aliases_move_and_roll_back_over_http(
    http: httpx.AsyncClient, client: kr.Client, data: tuple[np.ndarray, np.ndarray]
) -> None:
    x, y = data
    client.models.register("score", LogisticRegression(C=0.001).fit(x, y), inputs=["a", "b"])
    moved = await http.put("/v1/models/score/aliases/prod", json={"version": 2})
    assert moved.status_code == 200 and moved.json()["previous"] == 1
    value = client.query({Account.id: "acc2"}, [Account.score])
    assert client.log is not None and value.errors == []
    listing = (await http.get("/v1/models")).json()["models"]
    assert listing == [{"name": "score", "latest": 2, "versions": 2, "aliases": {"prod": 2}}]
    back = await http.post("/v1/models/score/aliases/prod/rollback", json={})
    assert back.json()["version"] == 1
    history = (await http.get("/v1/models/score/aliases")).json()["history"]
    assert [(h["action"], h["version"]) for h in history] == [
        ("set", 1),
        ("set", 2),
        ("rollback", 1),
    ]
    # who moved it: this server has no keys, so `local` (registration's move names no one)
    assert [h["changed_by"] for h in history] == [None, "local", "local"]
    bad = await http.put("/v1/models/score/aliases/prod", json={"version": "two"})
    assert error_of(bad, 422)["field"] == "version"
    detail = (await http.get("/v1/models/score")).json()
    assert [v["aliases"] for v in detail["versions"]] == [["prod"], []]


@pytest.mark.anyio
async def test_an_alias_move_records_a_digest_of_the_key_never_the_key(
    client: kr.Client, data: tuple[np.ndarray, np.ndarray]
) -> None:
    x, y = data
    client.models.register("score", LogisticRegression(C=0.001).fit(x, y), inputs=["a", "b"])
    key = "server-key-for-the-alias-history"
    app = create_app(client, ServerConfig(keys=(key,)))
    headers = {"Authorization": f"Bearer {key}"}
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1", headers=headers
    ) as http:
        moved = await http.put("/v1/models/score/aliases/prod", json={"version": 2})
        back = await http.post("/v1/models/score/aliases/prod/rollback", json={})
        history = (await http.get("/v1/models/score/aliases")).json()["history"]
    digest = "key:" + hashlib.sha256(key.encode()).hexdigest()[:8]
    assert moved.json()["changed_by"] == back.json()["changed_by"] == digest
    assert [h["changed_by"] for h in history] == [None, digest, digest]
    assert key not in str(history)


@pytest.mark.anyio
async def test_register_an_onnx_artifact_over_http(
    http: httpx.AsyncClient, data: tuple[np.ndarray, np.ndarray]
) -> None:
    from skl2onnx import to_onnx

    x, y = data
    x32 = x.astype(np.float32)
    sk = LogisticRegression().fit(x32, y)
    onx = to_onnx(sk, x32[:1], options={id(sk): {"zipmap": False}})
    response = await http.post(
        "/v1/models/onnx-score/versions?format=onnx&aliases=canary&inputs=a,b",
        content=onx.SerializeToString(),
        headers={"content-type": "application/octet-stream"},
    )
    assert response.status_code == 201, response.text
    body = response.json()
    assert body["framework"] == "onnx" and body["schema"]["inputs"] == ["a", "b"]
    assert body["aliases"] == ["canary"]
    predicted = await http.post(
        "/v1/models/onnx-score/predict", json={"rows": x[:3].tolist(), "alias": "canary"}
    )
    np.testing.assert_allclose(
        predicted.json()["predictions"], sk.predict_proba(x32[:3])[:, 1], atol=1e-5
    )
    octets = {"content-type": "application/octet-stream"}
    garbage = await http.post(
        "/v1/models/x/versions?format=onnx", content=b"\x00garbage", headers=octets
    )
    assert "not a valid onnx artifact" in error_of(garbage, 422)["message"]
    no_format = await http.post("/v1/models/x/versions", content=b"abc", headers=octets)
    assert error_of(no_format, 422)["field"] == "format"
