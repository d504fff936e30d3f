"""The dashboard ships in the wheel: every template and stylesheet is package data, so a
`pip install kairos-inference` serves /ui with nothing fetched from elsewhere."""

import zipfile
from pathlib import Path

import pytest

from tests.test_wheel import build_wheel

ROOT = Path(__file__).parents[2]
UI = ROOT / "src" / "kairos" / "ui"


@pytest.mark.slow
def test_the_wheel_holds_every_template_and_stylesheet(tmp_path: Path) -> None:
    wheel = build_wheel(tmp_path)
    names = set(zipfile.ZipFile(wheel).namelist())
    assets = [p for folder in ("templates", "static") for p in (UI / folder).iterdir()]
    assert len(assets) >= 10
    missing = {f"kairos/ui/{p.parent.name}/{p.name}" for p in assets} - names
    assert not missing, missing


def test_the_stylesheet_loads_nothing_from_elsewhere() -> None:
    css = (UI / "static" / "kairos.css").read_text()
    assert "url(" not in css and "@import" not in css
    for template in (UI / "templates").iterdir():
        text = template.read_text()
        assert "<script" not in text and "style=" not in text, template
        assert "http://" not in text and "https://" not in text and "//cdn" not in text, template
