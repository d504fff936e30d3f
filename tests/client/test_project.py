"""Loading a project folder, and what a malformed one reports."""

from pathlib import Path

import pytest

import kairos as kr

FEATURES = """
from kairos import features

@features
class Thing:
    id: str
    size: int
"""

RESOLVERS = """
from kairos import online
from .features import Thing

@online
def size(tid: Thing.id) -> Thing.size:
    return len(tid)
"""


def write(folder: Path, files: dict[str, str]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (folder / name).write_text(text)
    return folder


def test_a_folder_of_modules_loads_with_relative_imports(tmp_path: Path) -> None:
    folder = write(tmp_path / "proj", {"features.py": FEATURES, "resolvers.py": RESOLVERS})
    with kr.Client(folder) as client:
        assert client.query({"thing.id": "abcd"}, ["thing.size"]).get_value("thing.size") == 4


def test_hidden_and_private_folders_are_never_read(tmp_path: Path) -> None:
    folder = write(tmp_path / "proj", {"features.py": FEATURES, "resolvers.py": RESOLVERS})
    for hidden in (".kairos/offline.duckdb/.new-1", "_scratch", "__pycache__"):
        write(folder / hidden, {"broken.py": "raise SystemExit('imported')", "q.sql": "nope"})
    # a store's writer renames its folders while a client loads: a walk into .kairos/ could
    # meet one that just vanished; the walk never enters it at all
    (folder / ".kairos" / "offline.duckdb" / ".new-1").rename(folder / ".kairos" / "gone")
    with kr.Client(folder) as client:
        assert client.query({"thing.id": "ab"}, ["thing.size"]).get_value("thing.size") == 2


def test_loading_does_not_run_scripts(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    script = f"if __name__ == '__main__':\n    open({str(marker)!r}, 'w').write('x')\n"
    folder = write(tmp_path / "proj", {"features.py": FEATURES, "script.py": script})
    with kr.Client(folder):
        pass
    assert not marker.exists()


def test_missing_folder_names_the_path(tmp_path: Path) -> None:
    with pytest.raises(kr.ProjectError, match="does not exist"):
        kr.Client(tmp_path / "nope")


def test_syntax_error_names_file_and_line(tmp_path: Path) -> None:
    folder = write(tmp_path / "proj", {"features.py": FEATURES, "broken.py": "x = 1\ndef (:\n"})
    with pytest.raises(kr.ProjectError, match=r"broken\.py:2: syntax error"):
        kr.Client(folder)


def test_import_error_names_file_line_and_cause(tmp_path: Path) -> None:
    folder = write(
        tmp_path / "proj",
        {"features.py": FEATURES, "bad.py": "import os\nraise RuntimeError('boom')\n"},
    )
    with pytest.raises(kr.ProjectError, match=r"bad\.py:2: .*RuntimeError: boom"):
        kr.Client(folder)


def test_a_folder_without_feature_classes_is_rejected(tmp_path: Path) -> None:
    folder = write(tmp_path / "proj", {"empty.py": "x = 1\n"})
    with pytest.raises(kr.KairosError, match="declares no @features classes"):
        kr.Client(folder)


def test_a_bad_annotation_names_the_field_and_the_fix(tmp_path: Path) -> None:
    bad = FEATURES.replace("size: int", "size: set")
    folder = write(tmp_path / "proj", {"features.py": bad})
    with pytest.raises(kr.DefinitionError, match=r"Thing\.size: unsupported annotation"):
        kr.Client(folder)
