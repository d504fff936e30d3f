"""SQLite for the gateway: a connection on a thread of its own, so the event loop never waits
on a lock another process holds, and, for the short write transactions of budget holds, a
second connection used right on the loop that never waits at all (busy_timeout 0): when the
file is locked, the call goes to the thread instead. A thread hop costs more than the
transaction itself.

The inline connection never checkpoints the WAL: SQLite runs an automatic checkpoint inside the
commit that grows the WAL past 1,000 pages, and a checkpoint fsyncs. On a busy disk that took
70 ms here (4 ms on a quiet one), and on the event loop it stalled every call in flight, which
is how the gateway came to add 121 ms to one answer and 1.4 s to one stream in a bench run where
a TCP relay never added more than 22 ms. Checkpoints run on the thread instead: a passive one
after every `CHECKPOINT_EVERY` inline writes (it waits for no reader or writer), and, when writes
kept coming faster than it could finish, a restart one once the WAL passes `WAL_PAGES` (writes on
the loop that meet it go to the thread for that moment; the loop itself never waits).
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

from kairos.gateway.errors import AccountingUnavailable

logger = logging.getLogger(__name__)

T = TypeVar("T")
_RETRIES = 20  # about 0.8 s of pauses in all
CHECKPOINT_EVERY = 256  # inline writes between checkpoints on the thread
WAL_PAGES = 2000  # a WAL longer than this after a passive checkpoint is restarted


class SQLiteThread:
    def __init__(
        self,
        path: str,
        schema: str,
        migrate: Callable[[sqlite3.Connection], None] | None = None,
    ) -> None:
        self.path = path
        self._schema = schema
        self._migrate = migrate  # run after the schema, e.g. to add columns a file lacks
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kairos-gateway-db")
        self._connection: sqlite3.Connection | None = None
        self._inline: sqlite3.Connection | None = None
        self._inline_runs = 0
        self._checkpointing = False

    def _connect(self) -> sqlite3.Connection:
        if self._connection is None:
            if self.path != ":memory:":
                Path(self.path).parent.mkdir(parents=True, exist_ok=True)
            connection = sqlite3.connect(self.path, isolation_level=None, timeout=30)
            connection.execute("pragma journal_mode=wal")
            connection.execute("pragma synchronous=normal")
            connection.execute("pragma busy_timeout=30000")
            connection.executescript(self._schema)
            if self._migrate is not None:
                self._migrate(connection)
            self._connection = connection
        return self._connection

    async def run(self, work: Callable[[sqlite3.Connection], T], *, inline: bool = False) -> T:
        """Run `work(connection)` on the connection's thread; with `inline`, first try it on
        the event loop without waiting for locks (`work` must begin with BEGIN IMMEDIATE or
        only read, so a busy file fails it before it changed anything)."""
        if inline and self._connection is not None and self.path != ":memory:":
            if self._inline is None:
                self._inline = sqlite3.connect(
                    self.path, isolation_level=None, timeout=0, check_same_thread=False
                )
                self._inline.execute("pragma synchronous=normal")
                self._inline.execute("pragma wal_autocheckpoint=0")  # never on the loop
            try:
                result = work(self._inline)
            except sqlite3.OperationalError as error:
                if "locked" not in str(error) and "busy" not in str(error):
                    raise AccountingUnavailable(
                        f"the gateway's SQLite store failed ({type(error).__name__}: {error})"
                    ) from None
            except sqlite3.Error as error:
                raise AccountingUnavailable(
                    f"the gateway's SQLite store failed ({type(error).__name__}: {error})"
                ) from None
            else:
                self._inline_runs += 1
                if self._inline_runs % CHECKPOINT_EVERY == 0 and not self._checkpointing:
                    self._checkpointing = True
                    asyncio.get_running_loop().run_in_executor(self._executor, self._checkpoint)
                return result
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self._executor, self._retrying, work)
        except sqlite3.Error as error:  # fail closed, without the file's contents or path
            raise AccountingUnavailable(
                f"the gateway's SQLite store failed ({type(error).__name__}: {error})"
            ) from None

    def _checkpoint(self) -> None:
        """On the thread: copy the WAL into the database as far as no reader needs it."""
        try:
            if self._connection is not None:  # not after close()
                _, pages, _ = self._connection.execute("pragma wal_checkpoint(passive)").fetchone()
                if pages > WAL_PAGES:
                    self._connection.execute("pragma wal_checkpoint(restart)")
        except sqlite3.Error as error:  # no data is lost; the WAL grows until one succeeds
            logger.warning("checkpointing %s failed: %s", Path(self.path).name, error)
        finally:
            self._checkpointing = False

    def _retrying(self, work: Callable[[sqlite3.Connection], T]) -> T:
        """`work` on the thread's connection. A write that finds the file locked although the
        busy timeout should have waited (in WAL mode, a statement whose snapshot another
        connection wrote past: SQLite answers at once) is retried after a short pause; `work`
        fails before it changed anything, so a retry is safe."""
        for attempt in range(_RETRIES - 1):
            try:
                return work(self._connect())
            except sqlite3.OperationalError as error:
                if "locked" not in str(error) and "busy" not in str(error):
                    raise
                time.sleep(min(0.001 * 2**attempt, 0.05))
        return work(self._connect())  # the last try: what fails now is raised

    async def close(self) -> None:
        def shut(connection: sqlite3.Connection) -> None:
            connection.close()
            self._connection = None

        if self._inline is not None:
            self._inline.close()
            self._inline = None
        if self._connection is not None:
            await self.run(shut)
        self._executor.shutdown(wait=False)
