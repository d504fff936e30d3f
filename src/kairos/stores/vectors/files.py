"""The files of an embedded index: a snapshot of every version, and a log of writes since.

    <folder>/<name>/
      LOCK              held (flock) while an index is open: one writer per folder
      CURRENT           the number N of the snapshot in force, written by rename
      snapshot-N/       rows.arrow (id, observed_at µs, attributes JSON), vectors.npy
                        (float32, one unit row per version), graph.hnsw (when built)
      log-N             the writes after snapshot N: records of (header, vectors)

A write appends one record to the log and flushes it (no fsync per write: a crash of the
machine may lose the last writes, a crash of the process does not). A snapshot is written to
a new folder, then CURRENT names it, then the old snapshot and log go, so a crash at any point
leaves one consistent snapshot and the log of writes after it. A torn record at the end of
the log (a crash mid-write) is dropped on reopening.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.ipc

from kairos.errors import BackendUnavailable
from kairos.stores.vectors.checks import Vector

_RECORD = struct.Struct("<QQ")  # header bytes, vector bytes
FORMAT = 1


@dataclass(frozen=True, slots=True)
class Rows:
    """Versions as stored: parallel lists and one (n, dimensions) array."""

    ids: list[str]
    observed: list[int]  # µs since 1970 UTC
    attributes: list[dict[str, Any]]
    vectors: Vector


class IndexFiles:
    """The folder of one embedded index, locked while open."""

    def __init__(self, folder: Path, dimensions: int) -> None:
        self.folder = folder
        self.dimensions = dimensions
        try:
            folder.mkdir(parents=True, exist_ok=True)
            self._lock: IO[bytes] | None = open(folder / "LOCK", "ab")  # noqa: SIM115
        except OSError as error:
            raise BackendUnavailable(
                f"vector index folder {str(folder)!r} cannot be created or written "
                f"({error.strerror}); point the index at a writable folder"
            ) from None
        try:
            fcntl.flock(self._lock.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._lock.close()
            self._lock = None
            raise BackendUnavailable(
                f"vector index {str(folder)!r} is already open (in this process or "
                "another); close it first, or open one index per folder and share it"
            ) from None
        self.number = self._current()
        self._log: IO[bytes] | None = None

    def _current(self) -> int:
        try:
            return int((self.folder / "CURRENT").read_text().strip())
        except FileNotFoundError:
            return 0

    @property
    def snapshot(self) -> Path:
        return self.folder / f"snapshot-{self.number}"

    @property
    def graph(self) -> Path | None:
        """The saved ANN graph of the current snapshot, if it has one."""
        path = self.snapshot / "graph.hnsw"
        return path if path.exists() else None

    def load(self) -> tuple[Rows, int]:
        """The snapshot's rows followed by the log's, and how many came from the snapshot."""
        ids: list[str] = []
        observed: list[int] = []
        attributes: list[dict[str, Any]] = []
        blocks: list[Vector] = []
        if self.number:
            meta = orjson.loads((self.snapshot / "meta.json").read_bytes())
            if meta["dimensions"] != self.dimensions:
                raise BackendUnavailable(
                    f"vector index {str(self.folder)!r} holds vectors of "
                    f"{meta['dimensions']} dimensions, not {self.dimensions}; open it with "
                    f"dimensions={meta['dimensions']} or use another name"
                )
            table = pyarrow.ipc.open_file(str(self.snapshot / "rows.arrow")).read_all()
            ids = table.column("id").to_pylist()
            observed = table.column("observed_at").to_pylist()
            attributes = [orjson.loads(text) for text in table.column("attributes").to_pylist()]
            blocks.append(np.load(self.snapshot / "vectors.npy"))
        in_snapshot = len(ids)
        for header, vectors in self._records():
            ids.extend(header["ids"])
            observed.extend(header["observed"])
            attributes.extend(header["attributes"])
            blocks.append(vectors)
        vectors = np.concatenate(blocks) if blocks else np.empty((0, self.dimensions), np.float32)
        return Rows(ids, observed, attributes, vectors), in_snapshot

    def _records(self) -> Iterator[tuple[dict[str, Any], Vector]]:
        path = self.folder / f"log-{self.number}"
        if not path.exists():
            return
        with open(path, "r+b") as log:
            data = log.read()
            at = 0
            while at + _RECORD.size <= len(data):
                head, body = _RECORD.unpack_from(data, at)
                end = at + _RECORD.size + head + body
                if end > len(data):
                    break
                header = orjson.loads(data[at + _RECORD.size : at + _RECORD.size + head])
                vectors = np.frombuffer(
                    data[at + _RECORD.size + head : end], dtype=np.float32
                ).reshape(-1, self.dimensions)
                yield header, vectors
                at = end
            if at < len(data):  # a torn record: the process died writing it
                log.truncate(at)

    def append(self, rows: Rows) -> int:
        """Log one write; returns the log's size in bytes."""
        if self._log is None:
            self._log = open(self.folder / f"log-{self.number}", "ab")  # noqa: SIM115
        header = orjson.dumps(
            {"ids": rows.ids, "observed": rows.observed, "attributes": rows.attributes}
        )
        body = np.ascontiguousarray(rows.vectors, dtype=np.float32).tobytes()
        self._log.write(_RECORD.pack(len(header), len(body)) + header + body)
        self._log.flush()
        return self._log.tell()

    def write_snapshot(self, rows: Rows, save_graph: Any) -> None:
        """A new snapshot of `rows` (and the graph, `save_graph(path)` when not None)."""
        number = self.number + 1
        folder = self.folder / f"snapshot-{number}"
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir()
        table = pa.table(
            {
                "id": pa.array(rows.ids, pa.string()),
                "observed_at": pa.array(rows.observed, pa.int64()),
                "attributes": pa.array(
                    [orjson.dumps(a).decode() for a in rows.attributes], pa.string()
                ),
            }
        )
        with (
            pa.OSFile(str(folder / "rows.arrow"), "wb") as sink,
            pyarrow.ipc.new_file(sink, table.schema) as writer,
        ):
            writer.write_table(table)
        np.save(folder / "vectors.npy", rows.vectors)
        if save_graph is not None:
            save_graph(str(folder / "graph.hnsw"))
        (folder / "meta.json").write_bytes(
            orjson.dumps({"format": FORMAT, "dimensions": self.dimensions, "rows": len(rows.ids)})
        )
        _fsync_tree(folder)
        current = self.folder / "CURRENT.tmp"
        current.write_text(str(number))
        _fsync(current)
        os.replace(current, self.folder / "CURRENT")
        _fsync(self.folder)
        old = self.number
        if self._log is not None:
            self._log.close()
            self._log = None
        self.number = number
        shutil.rmtree(self.folder / f"snapshot-{old}", ignore_errors=True)
        with contextlib.suppress(FileNotFoundError):
            (self.folder / f"log-{old}").unlink()

    def close(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None
        if self._lock is not None:
            self._lock.close()  # releases the flock
            self._lock = None


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_tree(folder: Path) -> None:
    for child in folder.iterdir():
        _fsync(child)
    _fsync(folder)
