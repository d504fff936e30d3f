"""`kr.predict(...)` declarations and the `models:` block of kairos.yaml: mistakes are errors
that name the feature or setting and the fix."""

from datetime import timedelta
from pathlib import Path

import pytest

import kairos as kr
from kairos import _, features
from kairos.project.config import Config


def test_predict_needs_a_model_name_and_feature_inputs() -> None:
    with pytest.raises(kr.DefinitionError, match="lists the features the model reads"):
        kr.predict("risk", inputs=[])
    with pytest.raises(kr.DefinitionError, match="input 3 is not a feature"):
        kr.predict("risk", inputs=[_.a, 3])
    with pytest.raises(kr.DefinitionError, match="not both"):
        kr.predict("risk", inputs=[_.a], version=1, alias="prod")
    with pytest.raises(kr.DefinitionError, match="versions start at 1"):
        kr.predict("risk", inputs=[_.a], version=0)


def test_an_unknown_input_feature_fails_when_the_project_loads(tmp_path: Path) -> None:
    @features
    class Card:
        id: str
        limit: float
        risk: float = kr.predict("risk", inputs=[_.limit, _.limt])

    with pytest.raises(kr.DefinitionError, match=r"card\.risk = kr\.predict.*'card\.limt'"):
        kr.Client(definitions=[Card], config=Config(base_dir=tmp_path))


def test_the_models_block_of_kairos_yaml(tmp_path: Path) -> None:
    (tmp_path / "kairos.yaml").write_text(
        "models:\n  registry: sqlite:///m/models.db\n  volume: m/artifacts\n"
        "  max_batch: 64\n  max_wait: 2ms\n  threads: 2\n  refresh: 1s\n"
    )
    models = Config.load(tmp_path).models
    assert models.registry == f"sqlite:///{tmp_path / 'm' / 'models.db'}"
    assert models.volume == str(tmp_path / "m" / "artifacts")
    assert (models.max_batch, models.max_wait) == (64, timedelta(milliseconds=2))
    assert models.refresh == timedelta(seconds=1)
    assert models.threads == 2
    (tmp_path / "kairos.yaml").write_text("models:\n  threads: null\n")
    assert Config.load(tmp_path).models.threads is None  # the process's own pools
    (tmp_path / "kairos.yaml").write_text("models:\n  threads: 0\n")
    with pytest.raises(kr.ProjectError, match=r"models\.threads.* got 0"):
        Config.load(tmp_path)
    (tmp_path / "kairos.yaml").write_text("models:\n  max_batch: 0\n")
    with pytest.raises(kr.ProjectError, match=r"models\.max_batch"):
        Config.load(tmp_path)
    (tmp_path / "kairos.yaml").write_text("models:\n  batch: 3\n")
    with pytest.raises(kr.ProjectError, match="`models` takes max_batch, max_wait"):
        Config.load(tmp_path)
