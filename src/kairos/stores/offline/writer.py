"""Every value an online query computes goes to the offline store, off the query's path:
queries add values to a buffer, and one thread writes them in bulk, one typed write per
feature, every `interval` seconds (and on flush and close)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

from kairos.definitions.types import ValueType
from kairos.stores.offline.base import OfflineStore

logger = logging.getLogger(__name__)

# (namespace, feature, value type, key type, key, observed_at, value)
Observation = tuple[str, str, ValueType, ValueType, Any, datetime, Any]


class OfflineWriter:
    """Buffers observations and writes them to an `OfflineStore` from one background thread.

    `open_store` is called on the first write, so a process that never computes anything
    (a CLI reading the log) never opens the store."""

    def __init__(
        self,
        open_store: Callable[[], OfflineStore],
        *,
        interval: float = 0.2,
        max_buffer: int = 200_000,
    ) -> None:
        self.open_store = open_store
        self.interval = interval
        self.max_buffer = max_buffer
        self.dropped = 0
        self.written = 0
        self._buffer: list[Observation] = []
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._done = threading.Condition(self._lock)
        self._added = 0  # observations accepted so far
        self._handled = 0  # of those, written or given up on
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="kairos-offline-writer", daemon=True)
        self._thread.start()

    def add(self, observations: Sequence[Observation]) -> None:
        """Queue values for the offline store; never blocks on I/O, never raises."""
        with self._lock:
            if self._closed:
                return
            room = self.max_buffer - len(self._buffer)
            if room < len(observations):
                self.dropped += len(observations) - max(room, 0)
                observations = observations[: max(room, 0)]
            self._buffer.extend(observations)
            self._added += len(observations)

    def flush(self, timeout: float = 30.0) -> None:
        """Return once everything added before the call is written (or given up on)."""
        with self._lock:
            target = self._added
            if self._closed or self._handled >= target:
                return
        self._wake.set()
        with self._done:
            self._done.wait_for(lambda: self._handled >= target or self._closed, timeout)

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._wake.set()
        self._thread.join(30.0)

    def _run(self) -> None:
        while True:
            self._wake.wait(self.interval)
            self._wake.clear()
            with self._lock:
                batch, self._buffer = self._buffer, []
                closing = self._closed
            if batch:
                self._write(batch)
            with self._done:
                self._handled += len(batch)
                self._done.notify_all()
            if closing:
                return

    def _write(self, batch: list[Observation]) -> None:
        try:
            store = self.open_store()
        except Exception as error:  # e.g. a PostgreSQL store that is down
            self.dropped += len(batch)
            logger.warning("offline store unavailable, %d values not kept: %s", len(batch), error)
            return
        groups: dict[tuple[str, str], list[Observation]] = {}
        for observation in batch:
            groups.setdefault((observation[0], observation[1]), []).append(observation)
        for (namespace, feature), rows in groups.items():
            try:
                store.write(
                    namespace,
                    feature,
                    rows[0][2],
                    rows[0][3],
                    [row[4] for row in rows],
                    [row[5] for row in rows],
                    [row[6] for row in rows],
                )
                self.written += len(rows)
            except Exception as error:  # one bad feature must not stop the others
                self.dropped += len(rows)
                logger.warning(
                    "offline store: could not write %d values of %s.%s: %s",
                    len(rows),
                    namespace,
                    feature,
                    error,
                )
