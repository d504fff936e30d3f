"""Artifacts: content-addressed, hash-checked on load, pickle only when opted in, any fsspec
URL as the volume."""

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from sklearn.linear_model import LogisticRegression

from kairos.models import (
    ArtifactVolume,
    ModelStore,
    TamperedArtifact,
    UnsupportedModel,
    model_registry_from_url,
)

from .custom_model import Pickled, Thresholds


def fitted(data: tuple[np.ndarray, np.ndarray]) -> LogisticRegression:
    x, y = data
    return LogisticRegression().fit(x, y)


def test_same_bytes_are_stored_once_by_sha256(
    local_store: ModelStore, data: tuple[np.ndarray, np.ndarray], tmp_path: Path
) -> None:
    import xgboost

    x, y = data
    booster = xgboost.XGBClassifier(n_estimators=3).fit(x, y)  # its UBJ is byte-stable
    first = local_store.register("a", booster)
    second = local_store.register("b", booster)
    assert first.sha256 == second.sha256 and first.version == second.version == 1
    stored = list((tmp_path / "vol" / "sha256").rglob("*"))
    assert [p.name for p in stored if p.is_file()] == [first.sha256]


def test_a_tampered_artifact_refuses_to_load(
    local_store: ModelStore, data: tuple[np.ndarray, np.ndarray]
) -> None:
    version = local_store.register("risk", fitted(data))
    path = Path(local_store.volume.path(version.sha256))
    content = bytearray(path.read_bytes())
    content[-10] ^= 0xFF
    path.write_bytes(bytes(content))
    fresh = ModelStore(local_store.registry, local_store.volume)
    with pytest.raises(TamperedArtifact, match=rf"not the sha256:{version.sha256} recorded"):
        fresh.predictor("risk")


def test_pickle_is_refused_without_the_opt_in(local_store: ModelStore, tmp_path: Path) -> None:
    with pytest.raises(UnsupportedModel, match="allow_pickle=True"):
        local_store.register("scaled", Pickled(2.0), inputs=["amount"])
    assert local_store.names() == []
    version = local_store.register("scaled", Pickled(2.0), inputs=["amount"], allow_pickle=True)
    assert version.format == "custom-pickle"
    fresh = ModelStore(local_store.registry, local_store.volume)
    _, predictor = fresh.predictor("scaled")
    assert predictor.predict([[3.0]]).tolist() == [6.0]


def test_a_user_class_with_files_loads_without_pickle(
    local_store: ModelStore, tmp_path: Path
) -> None:
    model = Thresholds({"a": 2.0, "b": -1.0})
    weights = model.save(tmp_path)
    version = local_store.register("th", model, inputs=["a", "b"], files=[weights])
    assert version.format == "custom"
    weights.write_text('{"a": 100.0, "b": 100.0}')  # the stored copy is what loads
    _, predictor = ModelStore(local_store.registry, local_store.volume).predictor("th")
    frame = pd.DataFrame({"a": [1.0, 2.0], "b": [0.5, 4.0]})
    assert predictor.predict(frame).tolist() == [1.5, 0.0]


def test_unknown_objects_are_refused_with_the_frameworks_kairos_takes(
    local_store: ModelStore,
) -> None:
    with pytest.raises(UnsupportedModel, match="scikit-learn, XGBoost, LightGBM"):
        local_store.register("x", object())
    with pytest.raises(UnsupportedModel, match="is not fitted"):
        local_store.register("x", LogisticRegression())


def test_an_fsspec_volume_stores_and_checks_artifacts(
    tmp_path: Path, data: tuple[np.ndarray, np.ndarray]
) -> None:
    volume = ArtifactVolume("memory://kairos-test-models")
    store = ModelStore(model_registry_from_url(f"sqlite:///{tmp_path / 'm.db'}"), volume)
    clf = fitted(data)
    version = store.register("risk", clf)
    assert volume.path(version.sha256).startswith("memory://kairos-test-models/sha256/")
    x, _ = data
    _, predictor = store.predictor("risk")
    np.testing.assert_allclose(predictor.predict(x), clf.predict_proba(x)[:, 1])
    import fsspec

    fs = fsspec.filesystem("memory")
    fs.pipe(volume.path(version.sha256).removeprefix("memory://"), b"not the model")
    with pytest.raises(TamperedArtifact):
        ModelStore(store.registry, volume).predictor("risk")
    store.close()
