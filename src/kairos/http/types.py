"""The ASGI aliases, declared once (as `starlette/types.py` does): the server, the gateway's
app and their tests import them from here.

>>> from kairos.http.types import ASGIApp, Receive, Scope, Send
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]
