"""`kr.connect(folder_or_url, ...)`: an embedded `Client` of a project folder, or a
`RemoteClient` of a kairos server's URL; both are `KairosClient`s.

    client = kr.connect("examples/fraud")  # doctest: +SKIP
    client = kr.connect("http://127.0.0.1:8000", key="...")  # doctest: +SKIP
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kairos.client.client import Client
from kairos.client.protocol import KairosClient
from kairos.project.modules import Project


def connect(
    target: str | Path | Project | None = None, *, key: str | None = None, **options: Any
) -> KairosClient:
    """A client of `target`: an `http://` or `https://` URL (with the server's `key=`; the
    server has the project, so no other options), else a project folder, a `.py` file or a
    `Project` with `kr.Client`'s options."""
    if isinstance(target, str) and target.startswith(("http://", "https://")):
        return Client(url=target, key=key, **options)
    return Client(target, key=key, **options)
