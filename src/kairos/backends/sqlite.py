"""SQLite off the event loop, for stores that write: a connection on a thread of its own, so
the event loop never waits on a lock another process holds, and, for short write
transactions, a second connection used right on the loop that never waits at all
(busy_timeout 0): when the file is locked, the call goes to the thread instead. A thread hop
costs more than the transaction itself.

The inline connection never checkpoints the WAL: SQLite runs an automatic checkpoint inside the
commit that grows the WAL past 1,000 pages, and a checkpoint fsyncs. On a busy disk that took
70 ms here (4 ms on a quiet one), and on the event loop it stalled every call in flight, which
is how the gateway came to add 121 ms to one answer and 1.4 s to one stream in a bench run where
a TCP relay never added more than 22 ms. Checkpoints run on the thread instead: a passive one
after every `CHECKPOINT_EVERY` inline writes (it waits for no reader or writer), and, when writes
kept coming faster than it could finish, a restart one once the WAL passes `WAL_PAGES` (writes on
the loop that meet it go to the thread for that moment; the loop itself never waits).

Readers of many files at once (the SQL sources) use `ConnectionThreads` directly, a pool of
threads each with its own connection (threads.py).
"""

from __future__ import annotations

import logging
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from kairos.backends.threads import ConnectionThreads
from kairos.errors import BackendUnavailable

logger = logging.getLogger(__name__)

T = TypeVar("T")
_RETRIES = 20  # about 0.8 s of pauses in all
CHECKPOINT_EVERY = 256  # inline writes between checkpoints on the thread
WAL_PAGES = 2000  # a WAL longer than this after a passive checkpoint is restarted


class SQLiteThread:
    """A SQLite file in WAL mode with `schema` applied (then `migrate`, e.g. to add columns a
    file lacks) on first use. A failure raises `unavailable("{name} failed (...)")`, which
    names neither the file's contents nor its path.

    >>> db = SQLiteThread(".kairos/gateway.db", SCHEMA, name="the gateway's SQLite store")
    >>> await db.run(lambda connection: connection.execute("select 1").fetchall())
    [(1,)]
    """

    def __init__(
        self,
        path: str,
        schema: str,
        migrate: Callable[[sqlite3.Connection], None] | None = None,
        *,
        name: str = "the SQLite store",
        unavailable: Callable[[str], Exception] = BackendUnavailable,
        thread_name: str = "kairos-db",
    ) -> None:
        self.path = path
        self._schema = schema
        self._migrate = migrate
        self._name = name
        self._unavailable = unavailable
        self._thread = ConnectionThreads(
            self._open,
            size=1,
            thread_name=thread_name,
            closed=lambda: unavailable(f"{name} is closed"),
            interrupt_on_cancel=False,  # a write once begun ends, whoever stopped waiting
        )
        self._opened = False  # the schema is in place: the loop may write inline
        self._inline: sqlite3.Connection | None = None
        self._inline_runs = 0
        self._checkpointing = False
        self._restarting = False  # a restart checkpoint waits for the writer lock: writes queue

    def _open(self) -> sqlite3.Connection:
        return _retrying(self._connect)  # the schema's statements may meet a locked file too

    def _connect(self) -> sqlite3.Connection:
        if self.path != ":memory:":
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        connection = sqlite3.connect(
            self.path, isolation_level=None, timeout=30, check_same_thread=False
        )  # used on its thread only; closed once that thread has stopped
        connection.execute("pragma journal_mode=wal")
        connection.execute("pragma synchronous=normal")
        connection.execute("pragma busy_timeout=30000")
        connection.executescript(self._schema)
        if self._migrate is not None:
            self._migrate(connection)
        self._opened = True
        return connection

    def _failed(self, error: sqlite3.Error) -> Exception:
        return self._unavailable(f"{self._name} failed ({type(error).__name__}: {error})")

    async def run(self, work: Callable[[sqlite3.Connection], T], *, inline: bool = False) -> T:
        """Run `work(connection)` on the connection's thread; with `inline`, first try it on
        the event loop without waiting for locks (`work` must begin with BEGIN IMMEDIATE or
        only read, so a busy file fails it before it changed anything)."""
        # while a restart checkpoint runs, writes queue behind it on the thread: on the loop,
        # back-to-back commits could keep it from the lock until the WAL had grown without bound
        if inline and self._opened and self.path != ":memory:" and not self._restarting:
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
                    raise self._failed(error) from None
            except sqlite3.Error as error:
                raise self._failed(error) from None
            else:
                self._inline_runs += 1
                if self._inline_runs % CHECKPOINT_EVERY == 0 and not self._checkpointing:
                    self._checkpointing = True
                    self._thread.submit(self._checkpoint)
                return result
        try:
            return await self._thread.run(lambda connection: _retrying(lambda: work(connection)))
        except sqlite3.Error as error:  # fail closed, without the file's contents or path
            raise self._failed(error) from None

    def _checkpoint(self, connection: sqlite3.Connection) -> None:
        """On the thread: copy the WAL into the database as far as no reader needs it."""
        try:
            _, pages, _ = connection.execute("pragma wal_checkpoint(passive)").fetchone()
            if pages > WAL_PAGES:
                self._restarting = True
                try:
                    connection.execute("pragma wal_checkpoint(restart)")
                finally:
                    self._restarting = False
        except sqlite3.Error as error:  # no data is lost; the WAL grows until one succeeds
            logger.warning("checkpointing %s failed: %s", Path(self.path).name, error)
        finally:
            self._checkpointing = False

    async def close(self) -> None:
        """Close both connections once the queued work has ended. Idempotent."""
        self._opened = False
        if self._inline is not None:
            self._inline.close()
            self._inline = None
        await self._thread.close()


def _retrying(work: Callable[[], T]) -> T:
    """`work()` on the thread. A write that finds the file locked although the busy timeout
    should have waited (in WAL mode, a statement whose snapshot another connection wrote past:
    SQLite answers at once) is retried after a short pause; `work` fails before it changed
    anything, so a retry is safe."""
    for attempt in range(_RETRIES - 1):
        try:
            return work()
        except sqlite3.OperationalError as error:
            if "locked" not in str(error) and "busy" not in str(error):
                raise
            time.sleep(min(0.001 * 2**attempt, 0.05))
    return work()  # the last try: what fails now is raised
