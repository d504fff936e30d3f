"""Each framework: register, reload in a fresh process, predictions equal to the in-memory
model's; the schema is inferred (inputs, classes, output)."""

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from kairos.models import ModelStore, SchemaMismatch

from .custom_model import Thresholds

COLUMNS = ["amount", "count", "age", "declines"]


def fitted(framework: str, x: np.ndarray, y: np.ndarray) -> tuple[Any, np.ndarray]:
    """A small fitted model of `framework` and what it predicts in memory for `x`."""
    frame = pd.DataFrame(x, columns=COLUMNS)
    if framework == "sklearn":
        from sklearn.linear_model import LogisticRegression
        from sklearn.pipeline import make_pipeline
        from sklearn.preprocessing import StandardScaler

        model = make_pipeline(StandardScaler(), LogisticRegression()).fit(frame, y)
        return model, model.predict_proba(frame)[:, 1]
    if framework == "xgboost":
        import xgboost

        model = xgboost.XGBClassifier(n_estimators=8, max_depth=3).fit(x, y)
        return model, model.predict_proba(x)[:, 1]
    if framework == "lightgbm":
        import lightgbm

        model = lightgbm.LGBMRegressor(n_estimators=8, verbose=-1).fit(x, x[:, 0] * 2.0)
        return model, np.asarray(model.predict(x))
    if framework == "catboost":
        import catboost

        model = catboost.CatBoostClassifier(
            iterations=8, verbose=False, allow_writing_files=False, thread_count=1
        ).fit(x, y)
        return model, model.predict_proba(x)[:, 1]
    if framework == "torch":
        import torch

        torch.manual_seed(0)
        net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
        with torch.no_grad():
            out = net(torch.tensor(x, dtype=torch.float32)).numpy()[:, 0]
        return net, out
    if framework == "onnx":
        from skl2onnx import to_onnx
        from sklearn.linear_model import LogisticRegression

        x32 = x.astype(np.float32)
        sk = LogisticRegression().fit(x32, y)
        onx = to_onnx(sk, x32[:1], options={id(sk): {"zipmap": False}})
        return onx, sk.predict_proba(x32)[:, 1]
    if framework == "custom":
        model = Thresholds({"amount": 0.5, "count": -0.2})
        return model, model.predict(frame)
    raise AssertionError(framework)


FRAMEWORKS = ["sklearn", "xgboost", "lightgbm", "catboost", "torch", "onnx", "custom"]
FORMATS = {
    "sklearn": "skops",
    "xgboost": "xgboost-ubj",
    "lightgbm": "lightgbm-text",
    "catboost": "catboost-cbm",
    "torch": "torch-export",
    "onnx": "onnx",
    "custom": "custom",
}
RELOAD = """
import json, sys
import numpy as np
from kairos.models import ArtifactVolume, ModelStore, model_registry_from_url
folder = sys.argv[1]
store = ModelStore(model_registry_from_url(f"sqlite:///{folder}/models.db"),
                   ArtifactVolume(f"{folder}/vol"))
x = np.load(f"{folder}/x.npy")
out = {}
for name in json.loads(sys.argv[2]):
    record, predictor = store.predictor(name, alias="prod")
    out[name] = predictor.predict(x).tolist()
print(json.dumps(out))
"""


@pytest.mark.slow
def test_every_framework_reloads_in_a_fresh_process_and_predicts_the_same(
    local_store: ModelStore, data: tuple[np.ndarray, np.ndarray], tmp_path: Path
) -> None:
    x, y = data
    expected = {}
    for framework in FRAMEWORKS:
        model, predicted = fitted(framework, x, y)
        inputs = COLUMNS if framework == "custom" else None
        files = [model.save(tmp_path)] if framework == "custom" else []
        version = local_store.register(
            framework, model, aliases=["prod"], inputs=inputs, files=files
        )
        assert (version.framework, version.format) == (framework, FORMATS[framework])
        assert version.schema.n_features == 4
        expected[framework] = predicted
    np.save(tmp_path / "x.npy", x)
    root = Path(__file__).parents[2]
    done = subprocess.run(
        [sys.executable, "-c", RELOAD, str(tmp_path), json.dumps(FRAMEWORKS)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=root,
        env={"PYTHONPATH": f"{root / 'src'}:{root}", "PATH": "/usr/bin:/bin"},
    )
    assert done.returncode == 0, done.stderr
    reloaded = json.loads(done.stdout)
    for framework in FRAMEWORKS:
        tolerance = 1e-5 if framework in ("torch", "onnx") else 1e-9
        np.testing.assert_allclose(
            reloaded[framework], expected[framework], rtol=tolerance, atol=tolerance
        )


def test_schema_is_inferred_from_a_dataframe_fitted_pipeline(
    local_store: ModelStore, data: tuple[np.ndarray, np.ndarray]
) -> None:
    x, y = data
    model, _ = fitted("sklearn", x, y)
    version = local_store.register("risk", model)
    schema = version.schema
    assert schema.inputs == tuple(COLUMNS) and schema.named
    assert schema.classes == (0, 1)
    assert schema.output == "probability" and schema.output_shape == ()
    _, predictor = local_store.predictor("risk")
    row = dict(zip(COLUMNS, x[0].tolist(), strict=True))
    in_memory = model.predict_proba(pd.DataFrame(x[:1], columns=COLUMNS))[0, 1]
    assert predictor.predict([row])[0] == pytest.approx(in_memory)
    with pytest.raises(SchemaMismatch, match=r"missing 'declines'.*amount, count, age, declines"):
        predictor.predict([{"amount": 1.0, "count": 2.0, "age": 3.0}])
    with pytest.raises(SchemaMismatch, match=r"row 0, column 'age': 'old' is not a number"):
        predictor.predict([{**row, "age": "old"}])
    with pytest.raises(SchemaMismatch, match="takes rows of 4 numbers"):
        predictor.predict(np.zeros((2, 3)))


def test_schema_of_a_multiclass_model_and_of_unnamed_inputs(
    local_store: ModelStore, data: tuple[np.ndarray, np.ndarray]
) -> None:
    from sklearn.tree import DecisionTreeClassifier

    x, _ = data
    labels = np.array(["low", "mid", "high"])[(x[:, 0] > 0).astype(int) + (x[:, 1] > 1)]
    model = DecisionTreeClassifier(max_depth=3).fit(x, labels)
    probabilities = local_store.register("tiers", model)
    assert probabilities.schema.inputs == ("x0", "x1", "x2", "x3")
    assert not probabilities.schema.named
    assert probabilities.schema.classes == ("high", "low", "mid")
    assert probabilities.schema.output_shape == (3,)
    named = local_store.register("tiers", model, output="label", inputs=COLUMNS)
    assert named.version == 2 and named.schema.inputs == tuple(COLUMNS)
    _, predictor = local_store.predictor("tiers", version=2)
    assert predictor.predict(x[:20]).tolist() == model.predict(x[:20]).tolist()
    _, first = local_store.predictor("tiers", version=1)
    np.testing.assert_allclose(first.predict(x[:20]), model.predict_proba(x[:20]))


def test_regressor_schema_is_a_value(
    local_store: ModelStore, data: tuple[np.ndarray, np.ndarray]
) -> None:
    from sklearn.linear_model import Ridge

    x, _ = data
    version = local_store.register("amount", Ridge().fit(x, x[:, 1]))
    assert version.schema.classes is None and version.schema.output == "value"
