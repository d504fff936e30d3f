"""Python resolvers of the fraud example: they read the example's SQLite file."""

import math
import sqlite3
from datetime import timedelta
from pathlib import Path

from kairos import DataFrame, Features, Now, online

from .features import Transaction, User

DB_PATH = Path(__file__).parent / "data" / "fraud.db"
# The longest window any feature looks back over; older rows are never needed online.
LOOKBACK = timedelta(days=90)


def _connect() -> sqlite3.Connection:
    # One connection per call: cheap for SQLite, and safe across resolver threads.
    return sqlite3.connect(f"file:{DB_PATH}?mode=ro", uri=True)


@online
def user_profile(uid: User.id) -> Features[User.name, User.email, User.signup_at]:
    with _connect() as db:
        row = db.execute("select name, email, signup_at from users where id = ?", (uid,)).fetchone()
    if row is None:
        raise LookupError(f"no user {uid!r}")
    return row[0], row[1], row[2]


@online
def user_transactions(uid: User.id, now: Now) -> DataFrame[Transaction]:
    with _connect() as db:
        rows = db.execute(
            "select id, user_id, amount, status, merchant, ts from transactions "
            "where user_id = ? and ts > ? and ts <= ? order by ts",
            (uid, (now - LOOKBACK).isoformat(), now.isoformat()),
        ).fetchall()
    columns = ("id", "user_id", "amount", "status", "merchant", "ts")
    return DataFrame(dict(zip(columns, row, strict=True)) for row in rows)


@online
def risk_score(
    count_1d: User.txn_count["1d"],
    declines_7d: User.declines["7d"],
    avg_ticket_90d: User.avg_ticket["90d"],
    age_days: User.account_age_days,
) -> User.risk:
    """A hand-tuned logistic score; a trained model replaces it when models land."""
    avg = avg_ticket_90d or 0.0
    z = -3.0 + 0.35 * count_1d + 0.9 * declines_7d + 0.004 * avg - 0.004 * min(age_days, 365.0)
    return 1.0 / (1.0 + math.exp(-z))
