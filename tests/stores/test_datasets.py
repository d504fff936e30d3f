"""Datasets: offline results saved by name as numbered Parquet files, and the definitions'
fingerprint that records which code made them."""

import json
import os
import subprocess
import sys
import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import kairos as kr
from kairos import features, online
from kairos.errors import InvalidInput
from kairos.project.fingerprint import definitions_fingerprint
from kairos.stores.datasets import METADATA_KEY, DatasetStore, UnknownDataset

T0 = datetime(2026, 1, 10, 12, 30, tzinfo=UTC)
QUERY = {"outputs": ["acct.score"], "timestamp": "ts", "recompute": True, "spine_rows": 3}
ROOT = Path(__file__).resolve().parents[2]


@features
class Acct:
    id: str
    balance: float
    score: float


@online
def score(b: Acct.balance) -> Acct.score:
    return b * 2


def rewritten_score() -> Any:
    @online
    def score(b: Acct.balance) -> Acct.score:  # same name and signature, new code
        return b * 3

    return score


def offline_table() -> pa.Table:
    """A table with every Arrow type an offline result holds, nulls included."""
    txn = pa.struct(
        [("id", pa.string()), ("amount", pa.float64()), ("at", pa.timestamp("us", "UTC"))]
    )
    return pa.table(
        {
            "ts": pa.array([T0, T0 + timedelta(hours=1), None], pa.timestamp("us", "UTC")),
            "acct.id": pa.array(["a1", "a2", None], pa.string()),
            "acct.count": pa.array([3, None, 0], pa.int64()),
            "acct.balance": pa.array([1.5, None, -2.0], pa.float64()),
            "acct.flagged": pa.array([True, False, None], pa.bool_()),
            "acct.txns": pa.array(
                [[{"id": "t1", "amount": 9.5, "at": T0}], [], None], pa.list_(txn)
            ),
        }
    )


def test_round_trip_keeps_every_type_and_null(tmp_path: Path) -> None:
    store = DatasetStore(tmp_path)
    table = offline_table()

    info = store.save("train", table, query=QUERY, definitions_hash="abc123")
    got = store.get("train")

    assert info.version == 1 and info.rows == 3
    assert got.table.schema.remove_metadata() == table.schema
    assert got.table.to_pylist() == table.to_pylist()
    assert got.table.column("acct.txns").to_pylist()[0] == [{"id": "t1", "amount": 9.5, "at": T0}]
    frame = got.to_pandas()
    assert list(frame.columns) == table.column_names and len(frame) == 3
    assert got.to_polars().shape == (3, 6)
    assert (tmp_path / "train" / "v1.parquet").is_file()
    assert (tmp_path / "train" / "v1.json").is_file()


def test_versions_increment_and_get_picks_latest_or_one(tmp_path: Path) -> None:
    store = DatasetStore(tmp_path)
    tables = [pa.table({"x": list(range(n))}) for n in (1, 2, 3)]
    saved = [
        store.save("d", t, query=QUERY, definitions_hash=f"h{i}") for i, t in enumerate(tables)
    ]

    assert [s.version for s in saved] == [1, 2, 3]
    assert [v.version for v in store.versions("d")] == [1, 2, 3]
    assert store.get("d").version == 3 and store.get("d").table.num_rows == 3
    assert store.get("d", 2).table.column("x").to_pylist() == [0, 1]
    assert store.get("d", 1).definitions_hash == "h0"
    assert store.names() == ["d"]
    store.save("another", tables[0], query=QUERY, definitions_hash="h")
    assert store.names() == ["another", "d"]


def test_metadata_round_trips_in_sidecar_and_parquet(tmp_path: Path) -> None:
    store = DatasetStore(tmp_path)
    before = datetime.now(UTC)
    store.save("m", offline_table(), query=QUERY, definitions_hash="f00d")
    after = datetime.now(UTC)

    got = store.get("m")
    assert got.query == QUERY
    assert got.definitions_hash == "f00d"
    assert got.created_at.tzinfo is not None and before <= got.created_at <= after
    sidecar = json.loads((tmp_path / "m" / "v1.json").read_text())
    embedded = json.loads(pq.read_schema(tmp_path / "m" / "v1.parquet").metadata[METADATA_KEY])
    assert sidecar == embedded
    assert sidecar == {
        "name": "m",
        "version": 1,
        "created_at": got.created_at.isoformat(),
        "query": QUERY,
        "definitions_hash": "f00d",
        "rows": 3,
    }
    # Without the sidecar, the Parquet file alone still says what it is.
    (tmp_path / "m" / "v1.json").unlink()
    assert store.get("m").info == got.info


@pytest.mark.parametrize("name", ["../x", "a/b", "", "..", ".", "a\\b", "x" * 101, "a..b"])
def test_bad_names_are_refused(tmp_path: Path, name: str) -> None:
    store = DatasetStore(tmp_path / "store")
    with pytest.raises(InvalidInput, match="invalid dataset name") as error:
        store.save(name, pa.table({"x": [1]}), query=QUERY, definitions_hash="h")
    assert repr(name) in str(error.value) and "letters, digits" in str(error.value)
    with pytest.raises(InvalidInput):
        store.get(name)
    assert list(tmp_path.rglob("*.parquet")) == []


def test_unknown_name_or_version_lists_what_exists(tmp_path: Path) -> None:
    store = DatasetStore(tmp_path)
    with pytest.raises(UnknownDataset, match="unknown dataset 'nope'; none saved"):
        store.get("nope")
    for _ in range(2):
        store.save("training", pa.table({"x": [1]}), query=QUERY, definitions_hash="h")

    with pytest.raises(UnknownDataset) as error:
        store.get("trainng")
    assert str(error.value) == (
        "unknown dataset 'trainng'; did you mean 'training'?; datasets: training"
    )
    with pytest.raises(UnknownDataset) as error:
        store.get("training", 7)
    assert str(error.value) == "dataset 'training' has no version 7; versions: 1, 2"
    assert isinstance(error.value, KeyError)


def test_concurrent_saves_get_distinct_versions(tmp_path: Path) -> None:
    store = DatasetStore(tmp_path)
    start = threading.Barrier(8)
    versions: list[int] = []
    lock = threading.Lock()

    def save(i: int) -> None:
        start.wait()
        info = store.save("c", pa.table({"i": [i]}), query=QUERY, definitions_hash="h")
        with lock:
            versions.append(info.version)

    threads = [threading.Thread(target=save, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert sorted(versions) == list(range(1, 9))
    # Each file holds the row its own save wrote, under its own version number.
    rows = {
        v.version: store.get("c", v.version).table.column("i")[0].as_py()
        for v in store.versions("c")
    }
    assert sorted(rows.values()) == list(range(8))


def test_a_crash_mid_write_leaves_no_version(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = DatasetStore(tmp_path)
    store.save("x", pa.table({"a": [1]}), query=QUERY, definitions_hash="h")

    def crash(table: pa.Table, where: Any, **options: Any) -> None:
        where.write(b"PAR1 half a file")
        raise OSError("disk full")

    monkeypatch.setattr(pq, "write_table", crash)
    with pytest.raises(OSError, match="disk full"):
        store.save("x", pa.table({"a": [2]}), query=QUERY, definitions_hash="h")
    monkeypatch.undo()

    assert [v.version for v in store.versions("x")] == [1]
    assert not (tmp_path / "x" / "v2.parquet").exists()
    assert not list((tmp_path / "x").glob("*.tmp"))
    assert store.save("x", pa.table({"a": [3]}), query=QUERY, definitions_hash="h").version == 2


def test_stray_files_are_not_versions(tmp_path: Path) -> None:
    store = DatasetStore(tmp_path)
    store.save("s", pa.table({"a": [1]}), query=QUERY, definitions_hash="h")
    folder = tmp_path / "s"
    for stray in (".v2.parquet.0123.tmp", "v3.parquet.tmp", "v4.json", "v05.parquet", "notes"):
        (folder / stray).write_bytes(b"junk")
    (tmp_path / "empty").mkdir()

    assert [v.version for v in store.versions("s")] == [1]
    assert store.names() == ["s"]
    assert store.save("s", pa.table({"a": [2]}), query=QUERY, definitions_hash="h").version == 2


def test_fingerprint_is_stable_and_follows_resolver_code() -> None:
    first = kr.Client(definitions=[Acct, score])
    second = kr.Client(definitions=[Acct, score])
    try:
        fingerprint = definitions_fingerprint(first.graph, first.resolvers)
        assert len(fingerprint) == 16 and int(fingerprint, 16) >= 0
        assert definitions_fingerprint(second.graph, second.resolvers) == fingerprint
    finally:
        first.close()
        second.close()

    changed = kr.Client(definitions=[Acct, rewritten_score()])
    try:
        assert definitions_fingerprint(changed.graph, changed.resolvers) != fingerprint
    finally:
        changed.close()

    # Another process (another hash seed) computes the same fingerprint.
    code = (
        "import kairos as kr\n"
        "from kairos.project.fingerprint import definitions_fingerprint\n"
        "from tests.stores.test_datasets import Acct, score\n"
        "c = kr.Client(definitions=[Acct, score])\n"
        "print(definitions_fingerprint(c.graph, c.resolvers))\n"
        "c.close()\n"
    )
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == fingerprint
