"""A Kafka-protocol broker on this machine (the PyPI package noida-db, dev only), for the
stream tests and bench/streams.py: the consumer code knows nothing of it.

    >>> with kafka_broker(tmp_path) as url:   # kafka://127.0.0.1:<free port>
    ...     ...
"""

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def kafka_broker(folder: Path) -> Iterator[str]:
    """Start the broker with its data and log in `folder`; its URL while it runs."""
    binary = Path(sys.executable).parent / "noida-db"
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    log = (folder / "broker.log").open("wb")
    broker = subprocess.Popen(
        [str(binary), "start", "--only", "kafka", "--kafka-port", str(port),
         "--data-dir", str(folder / "data")],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if broker.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError((folder / "broker.log").read_text()) from None
                time.sleep(0.1)
        yield f"kafka://127.0.0.1:{port}"
    finally:
        with contextlib.suppress(ProcessLookupError):  # it may have died at start
            os.killpg(broker.pid, signal.SIGTERM)
        broker.wait(30)
        log.close()
