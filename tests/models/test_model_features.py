"""Models in the feature graph: `kr.predict` features run the registered version, the query
log names it, alias moves (here and in another process) and rollbacks are followed, and a
model that fails is that feature's error."""

import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from sklearn.linear_model import LinearRegression
from threadpoolctl import ThreadpoolController

import kairos as kr
from kairos import Features, _, features, online
from kairos.engine import resolving
from kairos.models import ArtifactVolume, ModelStore, model_registry_from_url
from kairos.project.config import Config, ModelsConfig

from .custom_model import Raising, SlowToLoad


@features
class Account:
    id: str
    a: float
    b: float
    score: float = kr.predict("score", inputs=[_.a, _.b], alias="prod")
    pinned: float = kr.predict("score", inputs=[_.a, _.b], version=1)
    broken: float = kr.predict("broken", inputs=[_.a, _.b])


@online
def inputs(aid: Account.id) -> Features[Account.a, Account.b]:
    key = str(aid)
    n = float(key.removeprefix("acc"))
    return (-n if key.endswith("9") else n), n / 2


def linear(wa: float, wb: float) -> LinearRegression:
    x = np.array([[0.0, 0.0], [1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    return LinearRegression().fit(x, x @ np.array([wa, wb]))


def config(folder: Path, refresh: str = "5s") -> Config:
    return Config(
        base_dir=folder,
        query_log=f"sqlite:///{folder / 'log.db'}",
        models=ModelsConfig(refresh=timedelta(seconds=float(refresh.rstrip("s")))),
    )


@pytest.fixture
def client(tmp_path: Path) -> Iterator[kr.Client]:
    with kr.Client(definitions=[Account, inputs], config=config(tmp_path)) as client:
        yield client


def test_an_unregistered_model_is_that_features_error(client: kr.Client) -> None:
    result = client.query({Account.id: "acc4"}, [Account.a, Account.score])
    assert result.get_value(Account.a) == 4.0
    [error] = result.errors
    assert error.feature == "account.score"
    assert "no model named 'score'" in error.message


def test_values_come_from_the_version_the_alias_points_at(client: kr.Client) -> None:
    client.models.register("score", linear(1.0, 1.0), aliases=["prod"], inputs=["a", "b"])
    client.models.register("score", linear(10.0, 0.0), inputs=["a", "b"])
    first = client.query({Account.id: "acc4"}, [Account.score, Account.pinned])
    assert first.get_value(Account.score) == pytest.approx(6.0)  # 4 + 2, version 1
    client.models.set_alias("score", "prod", 2)
    moved = client.query({Account.id: "acc4"}, [Account.score, Account.pinned])
    assert moved.get_value(Account.score) == pytest.approx(40.0)
    assert moved.get_value(Account.pinned) == pytest.approx(6.0)  # pinned to version 1
    client.models.rollback("score", "prod")
    back = client.query({Account.id: "acc4"}, [Account.score])
    assert back.get_value(Account.score) == pytest.approx(6.0)
    versions = [
        client.log.get(r.meta.query_id).outputs["account.score"].version  # type: ignore[union-attr]
        for r in (first, moved, back)
    ]
    assert versions == ["score@v1", "score@v2", "score@v1"]


def test_bulk_and_offline_queries_run_the_model_in_one_batch(client: kr.Client) -> None:
    client.models.register("score", linear(1.0, 1.0), aliases=["prod"], inputs=["a", "b"])
    ids = [f"acc{i}" for i in range(1, 8)]
    bulk = client.query_bulk({Account.id: ids}, [Account.score])
    expected = [i + i / 2 for i in range(1, 8)]
    assert bulk.columns["account.score"].values == pytest.approx(expected)
    now = datetime.now(UTC)
    offline = client.offline_query({"account.id": ids, "ts": [now] * 7}, [Account.score])
    assert offline.to_pandas()["account.score"].tolist() == pytest.approx(expected)
    record = client.models.get("score", alias="prod")
    predictor = client.models.store.predictor_for(record)
    assert predictor.batches <= 2  # the bulk query once, the offline query once


def test_a_model_that_raises_is_that_features_error(client: kr.Client) -> None:
    client.models.register("broken", Raising(), inputs=["a", "b"])
    fine = client.query({Account.id: "acc4"}, [Account.broken, Account.a])
    assert fine.get_value(Account.broken) == pytest.approx(6.0)
    failing = client.query({Account.id: "acc9"}, [Account.broken, Account.a])  # a = -9
    assert failing.get_value(Account.a) == -9.0
    [error] = failing.errors
    assert (error.feature, error.code) == ("account.broken", "resolver_error")
    assert "RuntimeError" in error.message and "weights only cover a >= 0" in error.message


@features
class Slow:
    id: str
    a: float
    b: float
    doubled: float = kr.predict("slow", inputs=[_.a, _.b], timeout="300ms")


@online
def slow_inputs(sid: Slow.id) -> Features[Slow.a, Slow.b]:
    return 21.0, 0.0


def test_a_models_first_load_is_not_spent_from_its_timeout(tmp_path: Path) -> None:
    # a fresh process loads the artifact on its first query; the 300 ms bound is the call's
    with kr.Client(definitions=[Slow, slow_inputs], config=config(tmp_path)) as client:
        client.models.register("slow", SlowToLoad(), inputs=["a", "b"])
    with kr.Client(definitions=[Slow, slow_inputs], config=config(tmp_path)) as client:
        started = time.perf_counter()
        result = client.query({Slow.id: "s1"}, [Slow.doubled])
        assert time.perf_counter() - started >= SlowToLoad.LOAD_SECONDS  # it did load here
        assert result.errors == [] and result.get_value(Slow.doubled) == 42.0


def test_a_load_past_the_prepare_limit_is_left_to_the_calls_timeout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a load that hangs does not hang the query: past the limit the call's 300 ms runs
    monkeypatch.setattr(resolving, "PREPARE_LIMIT", timedelta(milliseconds=100))
    with kr.Client(definitions=[Slow, slow_inputs], config=config(tmp_path)) as client:
        client.models.register("slow", SlowToLoad(), inputs=["a", "b"])
    with kr.Client(definitions=[Slow, slow_inputs], config=config(tmp_path)) as client:
        started = time.perf_counter()
        [error] = client.query({Slow.id: "s1"}, [Slow.doubled]).errors
        assert time.perf_counter() - started < SlowToLoad.LOAD_SECONDS
        assert (error.feature, error.code) == ("slow.doubled", "timeout")


def test_a_model_with_the_wrong_number_of_inputs_is_a_clear_feature_error(
    client: kr.Client,
) -> None:
    x = np.arange(9.0).reshape(3, 3)
    client.models.register("score", LinearRegression().fit(x, x[:, 0]), aliases=["prod"])
    [error] = client.query({Account.id: "acc4"}, [Account.score]).errors
    assert "takes 3 inputs (x0, x1, x2) but account.score" in error.message


def test_an_alias_moved_by_another_process_is_followed(tmp_path: Path) -> None:
    with kr.Client(definitions=[Account, inputs], config=config(tmp_path, "0.05s")) as client:
        client.models.register("score", linear(1.0, 1.0), aliases=["prod"], inputs=["a", "b"])
        assert client.query({Account.id: "acc2"}, [Account.score]).get_value(Account.score) == 3.0
        elsewhere = ModelStore(
            model_registry_from_url(f"sqlite:///{tmp_path / '.kairos' / 'models.db'}"),
            ArtifactVolume(tmp_path / ".kairos" / "models"),
        )
        elsewhere.register("score", linear(0.0, 100.0), aliases=["prod"], inputs=["a", "b"])
        elsewhere.close()
        deadline = time.monotonic() + 10
        value = None
        while time.monotonic() < deadline:
            time.sleep(0.06)
            value = client.query({Account.id: "acc2"}, [Account.score]).get_value(Account.score)
            if value == pytest.approx(100.0):
                break
        assert value == pytest.approx(100.0)


def test_batch_scoring_of_an_offline_result_and_a_parquet_file(
    client: kr.Client, tmp_path: Path
) -> None:
    client.models.register("score", linear(2.0, 1.0), aliases=["prod"], inputs=["a", "b"])
    ids = [f"acc{i}" for i in range(1, 5)]
    training = client.offline_query(
        {"account.id": ids, "ts": [datetime.now(UTC)] * 4}, [Account.a, Account.b]
    )
    scored = client.models.score(
        "score", training, alias="prod", inputs={"a": "account.a", "b": "account.b"}
    )
    assert scored.column("prediction").to_pylist() == pytest.approx(
        [2 * i + i / 2 for i in range(1, 5)]
    )
    assert scored.schema.metadata[b"kairos.model"] == b"score@v1"
    source = tmp_path / "in.parquet"
    pq.write_table(scored.select(["account.a", "account.b"]), source)
    out = tmp_path / "out.parquet"
    client.models.score("score", source, inputs=["account.a", "account.b"], output=out)
    assert pq.read_table(out).column("prediction").to_pylist() == pytest.approx(
        [2 * i + i / 2 for i in range(1, 5)]
    )
    with pytest.raises(kr.InvalidInput, match=r"no column 'a'.*takes a, b"):
        client.models.score("score", source)


def test_the_trace_tells_model_time_from_the_rest(client: kr.Client) -> None:
    client.models.register("score", linear(1.0, 1.0), aliases=["prod"], inputs=["a", "b"])
    result = client.query({Account.id: "acc4"}, [Account.score])
    kinds = {t.label: t.kind for t in result.trace}
    assert kinds["model:score:account.score"] == "model"
    assert kinds["inputs"] == "python"
    assert "model" in client.explain([Account.id], [Account.score])


def test_models_threads_sizes_the_openmp_pool_of_the_features_model_calls(tmp_path: Path) -> None:
    if not ThreadpoolController().select(user_api="openmp").info():
        pytest.skip("no OpenMP runtime loaded")  # scikit-learn, imported above, brings one
    seen: list[int] = []

    def counted(rows: np.ndarray) -> np.ndarray:  # a + b, noting the OpenMP threads it gets
        info = ThreadpoolController().select(user_api="openmp").info()
        seen.append(int(info[0]["num_threads"]))
        return np.asarray(rows @ np.array([1.0, 1.0]))

    settings = Config(base_dir=tmp_path, models=ModelsConfig(threads=3))
    with kr.Client(definitions=[Account, inputs], config=settings) as client:
        client.models.register("score", linear(1.0, 1.0), aliases=["prod"], inputs=["a", "b"])
        _, predictor = client.models.store.predictor("score")
        predictor.infer = counted
        result = client.query({Account.id: "acc4"}, [Account.score])
    assert result.get_value(Account.score) == pytest.approx(6.0)
    assert seen == [3]
