"""Feature classes of the fraud example: users and their card transactions."""

from datetime import datetime

from kairos import (
    DataFrame,
    FeatureTime,
    Now,
    Windowed,
    _,
    completion,
    feature,
    features,
    message,
    predict,
    windowed,
)

QUESTION_FROM_AGGREGATES = (
    "Card account of {{ name }}: {{ txn_count['7d'] }} payments in the last 7 days, "
    "{{ declines['7d'] }} of them declined, average payment {{ avg_ticket['90d'] }} over 90 "
    "days. Is this account likely to be fraudulent? Answer yes or no, then why:"
)
QUESTION_FROM_HISTORY = (
    "Card account of {{ name }}. Payments, oldest first:\n"
    "{% for t in transactions %}{{ t.ts.strftime('%Y-%m-%d %H:%M') }} {{ t.merchant }} "
    "{{ t.amount }} {{ t.status }}\n{% endfor %}"
    "Is this account likely to be fraudulent? Answer yes or no, then why:"
)


@features
class Transaction:
    id: str
    user_id: "User.id"
    amount: float
    # approved | declined
    status: str
    merchant: str
    ts: FeatureTime


@features(max_staleness="1m")
class User:
    id: str
    # the name on the account
    name: str
    email: str
    signup_at: datetime
    # every card transaction of the user (none from after the query's now)
    transactions: DataFrame[Transaction]
    # transactions in the trailing window
    txn_count: Windowed[int] = windowed(
        "1d", "7d", expression=_.transactions[_.ts > _.window_start].count()
    )
    # declined transactions in the trailing window
    declines: Windowed[int] = windowed(
        "7d",
        expression=_.transactions[_.status == "declined", _.ts > _.window_start].count(),
    )
    # average ticket (amount per transaction) in the trailing window
    avg_ticket: Windowed[float | None] = windowed(
        "90d", expression=_.transactions[_.amount, _.ts > _.window_start].mean()
    )
    # days since the account was opened
    account_age_days: float = (Now - _.signup_at).dt.days()
    # hand-tuned logistic score in [0, 1] (resolvers.py), the baseline the model replaced
    rule_risk: float = feature(min=0.0, max=1.0)
    # P(a declined transaction in the next 7 days): the registered model "risk" (train.py)
    risk: float = predict(
        "risk",
        inputs=[
            _.txn_count["1d"],
            _.txn_count["7d"],
            _.declines["7d"],
            _.avg_ticket["90d"],
            _.account_age_days,
        ],
        alias="prod",
    )
    # One question asked of the local LLM two ways (llm_demo.py): from the three aggregates
    # above, or from the raw transaction history. Same question, very different prompt cost.
    verdict_from_aggregates: str = completion(
        model="local/gemma-270m",
        messages=[message("user", QUESTION_FROM_AGGREGATES)],
        max_tokens=16,
        temperature=0,
        timeout="60s",
    )
    verdict_from_history: str = completion(
        model="local/gemma-270m",
        messages=[message("user", QUESTION_FROM_HISTORY)],
        max_tokens=16,
        temperature=0,
        timeout="60s",
    )
