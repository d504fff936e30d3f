"""The fraud example's Python resolver: a score over the aggregates. Users and their
transactions come from the SQL resolvers next to this file (user.sql, transactions.sql)."""

import math
from pathlib import Path

from kairos import online

from .features import User

DB_PATH = Path(__file__).parent / "data" / "fraud.db"


@online
def risk_score(
    count_1d: User.txn_count["1d"],
    declines_7d: User.declines["7d"],
    avg_ticket_90d: User.avg_ticket["90d"],
    age_days: User.account_age_days,
) -> User.rule_risk:
    """A hand-tuned logistic score: the baseline the trained model (`User.risk`) replaced."""
    avg = avg_ticket_90d or 0.0
    z = -3.0 + 0.35 * count_1d + 0.9 * declines_7d + 0.004 * avg - 0.004 * min(age_days, 365.0)
    return 1.0 / (1.0 + math.exp(-z))
