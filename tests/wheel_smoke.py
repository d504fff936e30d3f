"""What each extra brings, exercised through kairos in a venv that has only the wheel and that
extra: `python wheel_smoke.py EXTRA FOLDER` (FOLDER: a `kairos init` project to work in).
tests/test_wheel.py runs it once per extra; it prints `ok EXTRA` when everything held."""

from __future__ import annotations

import asyncio
import json
import math
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np

import kairos as kr
from kairos import telemetry
from kairos.errors import BackendUnavailable
from kairos.llm.embeddings import LocalEmbedder
from kairos.llm.tokens import gguf_tokenizer
from kairos.models import ArtifactVolume, ModelStore, model_registry_from_url
from kairos.project.llm import packaged_gemma
from kairos.sources.postgres import postgres_source
from kairos.sources.streams import stream_from_config
from kairos.stores.vectors import Document, EmbeddedVectorIndex

NOW = datetime.now(UTC)
SPINE: dict[str, list[Any]] = {"user.id": ["u1", "u2", "u3"], "ts": [NOW, NOW, NOW]}


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def reloaded_predictions(folder: Path, models: dict[str, Any], x: Any) -> dict[str, list[float]]:
    """Register each model, then load it from its artifact in a second store and predict."""
    registry = f"sqlite:///{folder / 'models.db'}"
    volume = f"memory://{folder.name}"  # an fsspec volume ([models] brings fsspec)
    with_models = ModelStore(model_registry_from_url(registry), ArtifactVolume(volume))
    for name, model in models.items():
        with_models.register(name, model, aliases=["prod"])
    with_models.close()
    fresh = ModelStore(model_registry_from_url(registry), ArtifactVolume(volume))
    try:
        return {name: fresh.predictor(name, alias="prod")[1].predict(x).tolist() for name in models}
    finally:
        fresh.close()


def with_models(folder: Path) -> None:
    import catboost
    import lightgbm
    import xgboost
    from skl2onnx import to_onnx
    from sklearn.linear_model import LogisticRegression

    rng = np.random.default_rng(3)
    x = rng.normal(size=(200, 4)).astype(np.float32)
    y = (x[:, 0] - x[:, 1] > 0).astype(int)
    fitted = {
        "sklearn": LogisticRegression().fit(x, y),
        "xgboost": xgboost.XGBClassifier(n_estimators=4, max_depth=2).fit(x, y),
        "lightgbm": lightgbm.LGBMClassifier(n_estimators=4, verbose=-1).fit(x, y),
        "catboost": catboost.CatBoostClassifier(
            iterations=4, verbose=False, allow_writing_files=False, thread_count=1
        ).fit(x, y),
    }
    expected = {name: m.predict_proba(x)[:, 1] for name, m in fitted.items()}
    sklearn_model = fitted["sklearn"]
    onnx_model = to_onnx(sklearn_model, x[:1], options={id(sklearn_model): {"zipmap": False}})
    expected["onnx"] = expected["sklearn"]
    got = reloaded_predictions(folder, {**fitted, "onnx": onnx_model}, x)
    for name, want in expected.items():
        np.testing.assert_allclose(got[name], want, rtol=1e-5, atol=1e-5, err_msg=name)


def with_torch(folder: Path) -> None:
    import torch

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    x = np.random.default_rng(4).normal(size=(16, 4)).astype(np.float32)
    with torch.no_grad():
        want = net(torch.tensor(x)).numpy()[:, 0]
    got = reloaded_predictions(folder, {"net": net}, x)["net"]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def with_llm(folder: Path) -> None:
    """Gemma 3 270M from its package, served by kairos's llama.cpp worker, completes a prompt."""

    model = packaged_gemma()
    assert gguf_tokenizer(model).count("The capital of France is") > 3
    port = free_port()
    worker = subprocess.Popen(
        [sys.executable, "-m", "kairos.serving.worker", "--model", model, "--name", "gemma",
         "--port", str(port), "--threads", "2", "--ctx", "512"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(f"{url}/health", worker)
        body = {"prompt": "The capital of Germany is Berlin. The capital of France is",
                "max_tokens": 3, "temperature": 0}  # fmt: skip
        answer = post(f"{url}/v1/completions", body)
    finally:
        worker.terminate()
        worker.communicate(timeout=30)
    assert answer["choices"][0]["text"].startswith(" Paris"), answer


def with_embeddings(folder: Path) -> None:

    cat, kitten, tax = (np.array(v) for v in LocalEmbedder().embed(["a cat", "a kitten", "taxes"]))
    assert cat.shape == (384,) and math.isclose(float(cat @ cat), 1.0, rel_tol=1e-4)
    assert cat @ kitten > cat @ tax


def with_vectors(folder: Path) -> None:

    rng = np.random.default_rng(5)
    points = rng.normal(size=(50, 8))
    then = NOW - timedelta(days=1)

    async def nearest(write: bool) -> list[str]:
        index = EmbeddedVectorIndex(folder / "vectors", "docs", dimensions=8, exact_below=0)
        try:
            if write:
                await index.write([Document(f"d{i}", then, p) for i, p in enumerate(points)])
            return [hit.id for hit in await index.search(points[7], 3, as_of=NOW)]
        finally:
            await index.close()

    first = asyncio.run(nearest(write=True))  # the graph (hnswlib): exact search is off
    assert first[0] == "d7" and len(first) == 3
    assert asyncio.run(nearest(write=False)) == first  # the index reopened from its folder


def with_streams(folder: Path) -> None:
    """NATS and Kafka streams get to connecting (to a port nothing listens on): their clients
    are installed, so the error is the broker's absence, not a missing package."""

    for kind, scheme in (("nats", "nats"), ("kafka", "kafka")):
        raw = {"kind": kind, "url": f"{scheme}://127.0.0.1:{free_port()}", "stream": "events",
               "events": "Event"}  # fmt: skip
        stream = stream_from_config(f"smoke_{kind}", raw)

        async def read(stream: Any = stream) -> None:
            try:
                await stream.read(1, 1.0)
            finally:
                await stream.close()

        try:
            asyncio.run(read())
        except BackendUnavailable as error:
            assert "pip install" not in str(error), error
        else:
            raise AssertionError(f"{kind}: a read from a closed port succeeded")


def client_query(folder: Path, check: Callable[[kr.Client], None]) -> None:
    with kr.Client(folder) as client:
        check(client)


def with_pandas(folder: Path) -> None:
    def check(client: kr.Client) -> None:
        frame = client.offline_query(SPINE, ["user.available"]).to_pandas()
        assert frame["user.available"].tolist() == [750.0, 20.0, 200.0], frame

    client_query(folder, check)


def with_polars(folder: Path) -> None:
    def check(client: kr.Client) -> None:
        frame = client.offline_query(SPINE, ["user.available"]).to_polars()
        assert frame["user.available"].to_list() == [750.0, 20.0, 200.0], frame

    client_query(folder, check)


def with_ray(folder: Path) -> None:
    # a local Ray's node may take longer than its 30 s default to start on a busy 2-core machine
    os.environ.setdefault("RAY_raylet_start_wait_time_s", "300")
    import ray

    def check(client: kr.Client) -> None:
        result = client.offline_query(SPINE, ["user.available"], engine="ray")
        assert result.column("user.available") == [750.0, 20.0, 200.0], result.errors

    try:
        client_query(folder, check)
    finally:
        ray.shutdown()


def with_eval(folder: Path) -> None:
    import jsonschema

    def check(client: kr.Client) -> None:
        users = SPINE["user.id"]
        ids = [client.query({"user.id": u}, ["user.available"]).meta.query_id for u in users]
        replayed = client.replay(ids, recompute=["user.available"])
        labels = {"query_id": ids, "label": [1, 0, 1]}
        scores = client.evaluate(replayed, labels, metrics=["auc", "mae"], report=folder / "eval")
        assert scores.metrics["user.available"]["auc"]["logged"] == 1.0, scores.metrics
        assert (folder / "eval" / "report.md").exists()
        assert (folder / "eval" / "scores.png").read_bytes()[:4] == b"\x89PNG"

    client_query(folder, check)
    jsonschema.validate({"verdict": "ok"}, {"type": "object", "required": ["verdict"]})


def with_postgres_arrow(folder: Path) -> None:
    """A PostgreSQL source reads a result as Arrow columns through the ADBC driver."""

    async def read() -> Any:
        source = postgres_source("pg", "postgresql://postgres@127.0.0.1:5432/test")
        try:
            return await source.fetch_arrow("select generate_series(1, $1::int) as n", [3])
        finally:
            await source.close()

    table = asyncio.run(read())
    assert table is not None and table.column("n").to_pylist() == [1, 2, 3], table


def with_otel(folder: Path) -> None:
    """A query traced through the SDK; the OTLP exporter kairos configures is importable."""
    import opentelemetry.exporter.otlp.proto.http.trace_exporter  # noqa: F401
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    telemetry.configure(provider)

    def check(client: kr.Client) -> None:
        assert client.query({"user.id": "u1"}, ["user.available"]).get_value("user.available")

    try:
        client_query(folder, check)
    finally:
        telemetry.configure(None)
    assert exporter.get_finished_spans(), "a query made no span"


def wait_for(url: str, process: subprocess.Popen[str], seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while True:
        try:
            with urllib.request.urlopen(url, timeout=5):
                return
        except OSError:
            if process.poll() is not None:
                output = process.communicate()[0]
                raise AssertionError(f"exited {process.returncode}: {output}") from None
            assert time.monotonic() < deadline, f"{url} did not answer in {seconds} s"
            time.sleep(0.2)


def post(url: str, body: dict[str, Any]) -> Any:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                     headers={"content-type": "application/json"})  # fmt: skip
    with urllib.request.urlopen(request, timeout=120) as response:
        return json.loads(response.read())


SMOKES: dict[str, Callable[[Path], None]] = {
    "models": with_models,
    "torch": with_torch,
    "llm": with_llm,
    "embeddings": with_embeddings,
    "vectors": with_vectors,
    "streams": with_streams,
    "pandas": with_pandas,
    "polars": with_polars,
    "ray": with_ray,
    "eval": with_eval,
    "postgres-arrow": with_postgres_arrow,
    "otel": with_otel,
}

if __name__ == "__main__":
    extra, folder = sys.argv[1], Path(sys.argv[2])
    SMOKES[extra](folder)
    print(f"ok {extra}")
