"""Fixtures for the online-engine tests: clients that are always closed."""

from collections.abc import Callable, Iterator
from typing import Any

import pytest

import kairos as kr

MakeClient = Callable[..., kr.Client]


@pytest.fixture
def make_client() -> Iterator[MakeClient]:
    """`make_client(User, resolver, ..., default_timeout="2s")`; every client made is closed."""
    clients: list[kr.Client] = []

    def make(*definitions: Any, **options: Any) -> kr.Client:
        client = kr.Client(definitions=list(definitions), **options)
        clients.append(client)
        return client

    yield make
    for client in clients:
        client.close()
