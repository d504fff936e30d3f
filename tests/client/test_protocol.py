"""Both client faces satisfy one `KairosClient` Protocol (mypy checks the assignments below),
and `kr.connect` returns the one its argument names."""

from pathlib import Path

import pytest

import kairos as kr
from kairos.client.protocol import KairosClient
from tests.server.fraud import copy_project


def _both_are_kairos_clients(embedded: kr.Client, remote: kr.RemoteClient) -> None:
    clients: list[KairosClient] = [embedded, remote]  # a type error if either drifts
    assert clients


def test_connect_to_a_folder_is_an_embedded_client(fraud_db: Path, tmp_path: Path) -> None:
    with kr.connect(copy_project(tmp_path / "fraud")) as client:
        assert type(client) is kr.Client


def test_connect_to_a_url_is_a_remote_client() -> None:
    client = kr.connect("http://127.0.0.1:9", key="k")
    try:
        assert type(client) is kr.RemoteClient
    finally:
        client.close()


def test_connect_to_a_url_takes_no_project_options() -> None:
    with pytest.raises(kr.InvalidInput, match="leave out"):
        kr.connect("http://127.0.0.1:9", online_store="memory://")
