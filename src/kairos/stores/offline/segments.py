"""The DuckDB offline store's files: a folder of tables, each a folder of immutable Parquet
segments that any number of processes add to and read at the same time.

    <root>/.lock                  held while a table is created
    <root>/<table>/table.json     namespace, key kind, feature -> (column, value kind)
    <root>/<table>/.lock          held while a segment is added or segments are merged
    <root>/<table>/ties           present once two events share a (key, observed_at)
    <root>/<table>/merges         how many merges have begun removing segments
    <root>/<table>/<last>_<first>_<earliest>_<latest>_<token>.parquet
                                  a segment: key, observed_at, inserted_at, seq, values; its
                                  name holds the seqs of its rows (first..last) and their
                                  observed_at range (microseconds)

A segment appears whole (written under a hidden name, fsynced, renamed) and never changes. A
write's `seq` is one more than the largest in the table's names, taken under the table's lock,
so seq orders the writes of one table whichever process made them; every row carries it. Small
segments are merged into one covering their seqs (always a run of consecutive seqs, the newest),
which is renamed in before they are removed.

Readers take no lock, so they never hold a writer up. A listing is read again while it may be
torn: when the `merges` count changed during it (a merge removed segments meanwhile), or when
its seqs have a gap (a segment renamed in during the listing that it missed, while it saw a
later one). A segment whose seqs another's cover is a merge's input not removed yet: skipped. A
read skips the segments whose observed_at range it cannot use, so most writes of new events
check their (key, observed_at) pairs against no stored segment at all. The locks are `flock`s:
released by the kernel when a process dies, so a killed writer never wedges the others.

    >>> layout = Layout(Path("/tmp/offline"))  # doctest: +SKIP
    >>> layout.listing("f__user__age__0123456789")  # doctest: +SKIP
    Listing(segments=(Segment(path='...', seq=1, first=1, earliest=..., latest=...),), ties=False)
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import secrets
import shutil
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from kairos.errors import KairosError
from kairos.stores.offline.base import _KEY_TYPES, _VALUE_TYPES, TIMESTAMP

logger = logging.getLogger(__name__)

_META = "table.json"
_TIES = "ties"
_LOCK = ".lock"
_SUFFIX = ".parquet"
_MERGES = "merges"
_ROW_GROUP = 1 << 20  # rows
_LISTING_ATTEMPTS = 50  # a listing torn by a merge or a write under way is read again
_STALE_TEMPORARY = 3600.0  # seconds: a hidden file this old was left by a crashed writer

# value kind -> the Arrow type a segment stores it as: a timedelta as its microseconds (Parquet
# has no duration), list, dict and `any` as their JSON text
_STORED_TYPES = {
    kind: pa.int64() if kind == "timedelta" else arrow for kind, (_, arrow) in _VALUE_TYPES.items()
}


@dataclass(frozen=True)
class TableInfo:
    """One table: a key, observed_at, inserted_at, seq and one column per feature."""

    table: str
    namespace: str
    key_kind: str
    columns: Mapping[str, tuple[str, str]]  # feature -> (column, value kind)
    created: int  # time.time_ns() at creation: tables are listed oldest first

    def schema(self) -> pa.Schema:
        """The Arrow schema every segment of the table has."""
        return pa.schema(
            [
                ("key", _KEY_TYPES[self.key_kind][1]),
                ("observed_at", TIMESTAMP),
                ("inserted_at", TIMESTAMP),
                ("seq", pa.int64()),
                *((column, _STORED_TYPES[kind]) for column, kind in self.columns.values()),
            ]
        )


@dataclass(frozen=True)
class Segment:
    path: str
    seq: int  # the seqs of its rows: first..seq
    first: int
    earliest: int  # its rows' observed_at range, in microseconds since 1970 UTC
    latest: int


@dataclass(frozen=True)
class Listing:
    """A table's segments at one moment, in seq order, and whether it has ties."""

    segments: tuple[Segment, ...]
    ties: bool

    @property
    def seq(self) -> int:
        """The largest seq written so far (0 for none)."""
        return max((segment.seq for segment in self.segments), default=0)


class Layout:
    """The folder of one store: its tables, their segments and their locks."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._folder = str(root)
        try:
            root.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise KairosError(
                f"cannot create the offline store folder {str(root)!r}: {error}"
            ) from None
        self._tables: dict[str, TableInfo] = {}

    # --- tables ----------------------------------------------------------------------------

    def tables(self) -> dict[str, TableInfo]:
        """Every table, oldest first (a table made by another process is found here)."""
        known = self._tables
        fresh = {}
        try:
            with os.scandir(self._folder) as entries:
                for entry in entries:
                    if entry.name.startswith(".") or entry.name in known:
                        continue
                    if entry.is_dir():
                        fresh[entry.name] = self._read_meta(entry.name)
        except OSError as error:
            raise KairosError(
                f"cannot list the offline store {str(self.root)!r}: {error}"
            ) from None
        if fresh:
            merged = {**known, **{name: info for name, info in fresh.items() if info is not None}}
            self._tables = dict(sorted(merged.items(), key=lambda item: item[1].created))
        return self._tables

    def create(self, info: TableInfo) -> TableInfo:
        """Make a table's folder whole or not at all; hold `store_lock` around it. A table
        another process made first is returned as it was made."""
        final = self.root / info.table
        if final.exists():
            made = self._read_meta(info.table)
            if made is not None:
                return made
        staging = self.root / f".new-{secrets.token_hex(8)}"
        staging.mkdir()
        try:
            meta = {
                "namespace": info.namespace,
                "key_kind": info.key_kind,
                "columns": [[f, column, kind] for f, (column, kind) in info.columns.items()],
                "created": info.created,
            }
            _write_durably(staging / _META, json.dumps(meta).encode())
            (staging / _LOCK).touch()
            os.rename(staging, final)
        except OSError:
            shutil.rmtree(staging, ignore_errors=True)
            made = self._read_meta(info.table)
            if made is None:
                raise
            return made
        _sync_folder(self.root)
        self._tables = {**self._tables, info.table: info}
        return info

    def _read_meta(self, table: str) -> TableInfo | None:
        try:
            meta = json.loads((self.root / table / _META).read_bytes())
            return TableInfo(
                table,
                str(meta["namespace"]),
                str(meta["key_kind"]),
                {str(f): (str(column), str(kind)) for f, column, kind in meta["columns"]},
                int(meta["created"]),
            )
        except FileNotFoundError:
            return None  # not a table (or one made by hand): ignored
        except (OSError, ValueError, KeyError, TypeError) as error:
            raise KairosError(
                f"offline store table {str(self.root / table)!r} has an unreadable {_META} "
                f"({error}); restore it or move the folder away"
            ) from None

    # --- locks -----------------------------------------------------------------------------

    def store_lock(self) -> contextlib.AbstractContextManager[None]:
        return _flock(os.path.join(self._folder, _LOCK))

    def table_lock(self, table: str) -> contextlib.AbstractContextManager[None]:
        """What writers of one table hold (readers never do)."""
        return _flock(os.path.join(self._folder, table, _LOCK))

    # --- segments --------------------------------------------------------------------------

    def listing(self, table: str) -> Listing:
        """The table's segments now, never a listing torn by a merge or a write under way."""
        folder = os.path.join(self._folder, table)
        for _ in range(_LISTING_ATTEMPTS):
            before = _merges(folder)
            found = []
            try:
                with os.scandir(folder) as entries:
                    for entry in entries:
                        name = entry.name
                        if name.endswith(_SUFFIX) and not name.startswith("."):
                            last, first, earliest, latest, _ = name.split("_", 4)
                            found.append(
                                Segment(
                                    entry.path, int(last), int(first), int(earliest), int(latest)
                                )
                            )
            except FileNotFoundError:
                return Listing((), False)
            except (OSError, ValueError) as error:
                raise KairosError(f"cannot list offline store table {folder!r}: {error}") from None
            # after the files: a segment with ties is renamed in only once the mark exists
            ties = os.path.exists(os.path.join(folder, _TIES))
            if _merges(folder) != before:
                continue
            segments = _covering(found)
            if segments is not None:
                return Listing(segments, ties)
        logger.warning("offline store table %s: its segments' seqs have a gap", folder)
        return Listing(_covering(found, gaps=True) or (), ties)

    def mark_ties(self, table: str) -> None:
        """Record that the table has ties; before the segment that brings them appears."""
        path = self.root / table / _TIES
        if not path.exists():
            _write_durably(path, b"")

    def add(
        self,
        info: TableInfo,
        seqs: tuple[int, int],
        observed: tuple[int, int],
        batches: Iterable[pa.RecordBatch],
    ) -> str:
        """Write a segment of `info`'s table whole (hidden name, fsync, rename), each batch
        cast to the table's schema, its rows of seqs `seqs` (first, last) observed in
        `observed` (microseconds, both ends included); hold the table's lock."""
        folder = self.root / info.table
        token = secrets.token_hex(6)
        name = f"{seqs[1]:016d}_{seqs[0]:016d}_{observed[0]}_{observed[1]}_{token}"
        temporary = folder / f".{name}.tmp"
        final = folder / f"{name}{_SUFFIX}"
        schema = info.schema()
        try:
            with open(temporary, "wb") as sink:
                with pq.ParquetWriter(sink, schema) as writer:
                    pending: list[pa.RecordBatch] = []  # small batches make one row group
                    count = 0
                    for batch in batches:
                        pending.append(batch.cast(schema))
                        count += batch.num_rows
                        if count >= _ROW_GROUP:
                            writer.write_table(pa.Table.from_batches(pending), _ROW_GROUP)
                            pending, count = [], 0
                    if pending:
                        writer.write_table(pa.Table.from_batches(pending, schema), _ROW_GROUP)
                sink.flush()
                os.fsync(sink.fileno())
            os.rename(temporary, final)
        except BaseException:
            with contextlib.suppress(OSError):
                temporary.unlink()
            raise
        _sync_folder(folder)
        return str(final)

    def sizes(self, listing: Listing) -> dict[str, int]:
        sizes = {}
        for segment in listing.segments:
            with contextlib.suppress(FileNotFoundError):
                sizes[segment.path] = os.stat(segment.path).st_size
        return sizes

    def remove(self, table: str, paths: Iterable[str]) -> None:
        """Remove segments a merge covers (and hidden files a crashed writer left); hold the
        table's lock. Readers are told first (`merges`), so none misses their rows."""
        folder = os.path.join(self._folder, table)
        count = _merges(folder) + 1
        staged = os.path.join(folder, f".{_MERGES}.tmp")
        with open(staged, "w") as sink:
            sink.write(str(count))
        os.rename(staged, os.path.join(folder, _MERGES))
        for path in paths:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
        now = time.time()
        with os.scandir(folder) as entries:
            for entry in entries:
                if entry.name.endswith(".tmp") and entry.name.startswith("."):
                    with contextlib.suppress(OSError):
                        if now - entry.stat().st_mtime > _STALE_TEMPORARY:
                            os.unlink(entry.path)
        _sync_folder(Path(folder))


def _merges(folder: str) -> int:
    try:
        with open(os.path.join(folder, _MERGES)) as source:
            return int(source.read() or 0)
    except FileNotFoundError:
        return 0
    except (OSError, ValueError) as error:
        raise KairosError(f"cannot read {folder!r}/{_MERGES}: {error}") from None


def _covering(found: list[Segment], gaps: bool = False) -> tuple[Segment, ...] | None:
    """The segments in seq order without those another covers (a merge's inputs not removed
    yet), or None when their seqs have a gap (a listing that missed a segment), unless
    `gaps` (a segment lost for good: read what is there, each row once)."""
    found.sort(key=lambda segment: (segment.first, -segment.seq))
    kept: list[Segment] = []
    reached = 0
    for segment in found:
        if segment.seq <= reached:
            continue  # covered by a merged segment before it
        if segment.first != reached + 1 and not gaps:
            return None
        kept.append(segment)
        reached = segment.seq
    return tuple(kept)


@contextlib.contextmanager
def _flock(path: Path | str) -> Iterator[None]:
    try:
        descriptor = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as error:
        raise KairosError(f"cannot lock {str(path)!r}: {error}") from None
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX)
        yield
    finally:
        os.close(descriptor)  # releases the lock


def _write_durably(path: Path, data: bytes) -> None:
    with open(path, "wb") as sink:
        sink.write(data)
        sink.flush()
        os.fsync(sink.fileno())


def _sync_folder(folder: Path) -> None:
    """fsync a folder, so a rename into it survives a power loss."""
    descriptor = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
