"""`kairos models ...` on a project folder: register an artifact file, move and roll back an
alias, predict, score a Parquet file; errors are one line, not a traceback."""

import getpass
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from skl2onnx import to_onnx
from sklearn.linear_model import LinearRegression

from kairos.cli import main


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "features.py").write_text(
        "from kairos import features\n\n@features\nclass Item:\n    id: str\n    price: float\n"
    )
    return tmp_path


def onnx_file(folder: Path, slope: float) -> Path:
    x = np.array([[0, 0], [1, 0], [0, 1], [1, 1], [2, 3]], dtype=np.float32)
    model = LinearRegression().fit(x, x[:, 0] * slope)
    path = folder / f"m{slope}.onnx"
    path.write_bytes(to_onnx(model, x[:1]).SerializeToString())
    return path


def test_models_cli_round_trip(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    p = ["--project", str(project)]
    assert main(["models", "register", "price", str(onnx_file(project, 2.0)), *p,
                 "--alias", "prod", "--inputs", "a,b", "--meta", "team=pricing"]) == 0  # fmt: skip
    assert "registered price@v1" in capsys.readouterr().out
    assert main(["models", "register", "price", str(onnx_file(project, 3.0)), *p,
                 "--inputs", "a,b"]) == 0  # fmt: skip
    assert main(["models", "alias", "price", "prod", "2", *p]) == 0
    assert "prod -> v2 (was v1)" in capsys.readouterr().out
    assert main(["models", "predict", "price", "--rows", "[[1, 0]]", "--alias", "prod", *p]) == 0
    out = capsys.readouterr().out.strip().splitlines()[-1]
    assert json.loads(out)["model"] == "price@v2"
    assert json.loads(out)["predictions"] == pytest.approx([3.0], abs=1e-4)
    assert main(["models", "rollback", "price", "prod", *p]) == 0
    assert main(["models", "history", "price", *p]) == 0
    history = capsys.readouterr().out
    assert "rollback  prod: v2 -> v1" in history
    assert f"v1 -> v2  by {getpass.getuser()}" in history  # the OS user who moved it
    data = project / "in.parquet"
    pq.write_table(pa.table({"a": [1.0, 2.0], "b": [0.0, 0.0]}), data)
    out_file = project / "out.parquet"
    assert main(["models", "score", "price", "--data", str(data), "--output", str(out_file),
                 "--alias", "prod", *p]) == 0  # fmt: skip
    assert pq.read_table(out_file).column("prediction").to_pylist() == pytest.approx(
        [2.0, 4.0], abs=1e-4
    )
    assert main(["models", "show", "price", *p]) == 0
    shown = capsys.readouterr().out
    assert "price@v1  onnx/onnx" in shown and '"team": "pricing"' in shown


def test_models_cli_errors_are_one_line(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    p = ["--project", str(project)]
    assert main(["models", "predict", "nope", "--rows", "[[1]]", *p]) == 2
    err = capsys.readouterr().err
    assert err.startswith("kairos: no model named 'nope'") and "Traceback" not in err
    assert main(["models", "register", "x", str(project / "missing.onnx"), *p]) == 2
    assert "no artifact file" in capsys.readouterr().err
