"""The gateway's SQLite writes on the event loop never checkpoint the WAL (a checkpoint fsyncs,
and on a busy disk that stalled every call in flight); the store's thread checkpoints instead,
so the WAL stays bounded and the rows reach the database file."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from pathlib import Path

from kairos.backends.sqlite import WAL_PAGES, SQLiteThread

SCHEMA = "create table if not exists rows (id integer primary key, payload text);"


def test_inline_writes_leave_checkpoints_to_the_thread(tmp_path: Path) -> None:
    path = tmp_path / "gateway.db"

    async def scenario() -> tuple[set[int], int]:
        db = SQLiteThread(str(path), SCHEMA)
        await db.run(lambda c: c.execute("select 1").fetchall())  # opens the thread's connection

        def write(connection: sqlite3.Connection) -> int | None:
            connection.execute("begin immediate")
            connection.execute("insert into rows (payload) values (?)", ("x" * 2000,))
            connection.execute("commit")
            if threading.current_thread() is not threading.main_thread():
                return None  # the file was busy: the thread's connection took the write
            return int(connection.execute("pragma wal_autocheckpoint").fetchone()[0])

        automatic = {await db.run(write, inline=True) for _ in range(3 * 1024)}
        automatic.discard(None)
        await db.run(lambda c: None)  # the thread's queue (with its checkpoints) is done
        wal = (tmp_path / "gateway.db-wal").stat().st_size
        await db.close()
        return {value for value in automatic if value is not None}, wal

    automatic, wal = asyncio.run(scenario())
    assert automatic == {0}  # the connection on the loop never checkpoints
    # ~25 MB went through the WAL; the thread's checkpoints kept it to a few thousand pages
    assert wal < 3 * WAL_PAGES * 4096
    with sqlite3.connect(path) as connection:
        assert connection.execute("select count(*) from rows").fetchone()[0] == 3 * 1024
