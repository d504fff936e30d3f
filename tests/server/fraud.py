"""The fraud example as the server tests use it: where it lives, what they ask for, and how a
JSON error from the server must look."""

import shutil
import sqlite3
from pathlib import Path
from typing import Any

import httpx

from examples.fraud.generate import ANCHOR

PROJECT = Path(__file__).parents[2] / "examples" / "fraud"
DB = PROJECT / "data" / "fraud.db"
USERS = [f"u{i:04d}" for i in range(1, 201)]
OUTPUTS = [
    "user.name",
    "user.txn_count[1d]",
    "user.declines[7d]",
    "user.avg_ticket[90d]",
    "user.account_age_days",
    "user.risk",
]


def online_body(uid: str, outputs: list[str] | None = None, **options: Any) -> dict[str, Any]:
    """An online query body for one user, as of the example's ANCHOR."""
    return {
        "inputs": {"user.id": uid},
        "outputs": outputs or OUTPUTS,
        "now": ANCHOR.isoformat(),
        **options,
    }


def copy_project(destination: Path) -> Path:
    """A copy of the example (its generated data included, its query log not)."""
    return Path(
        shutil.copytree(
            PROJECT, destination, ignore=shutil.ignore_patterns(".kairos", "__pycache__")
        )
    )


def table_rows(db: Path, table: str) -> int:
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as connection:
        (count,) = connection.execute(f"select count(*) from {table}").fetchone()
    return int(count)


def error_of(response: httpx.Response, status: int) -> dict[str, Any]:
    """The `error` object of a JSON error response with `status`, its shape checked."""
    assert response.status_code == status, (response.status_code, response.text)
    assert response.headers["content-type"].startswith("application/json"), response.headers
    body = response.json()
    assert set(body) == {"error"}, body
    error = body["error"]
    assert isinstance(error, dict), body
    assert isinstance(error["code"], str) and error["code"], body
    assert isinstance(error["message"], str) and error["message"], body
    assert "Traceback" not in error["message"]
    return error
