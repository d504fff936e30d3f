"""Feature classes of the support example: accounts and their charges, the help center's
articles (searched by meaning) and the tickets customers open."""

from datetime import datetime

import kairos as kr
from kairos import (
    DataFrame,
    FeatureTime,
    Now,
    Vector,
    Windowed,
    _,
    completion,
    features,
    message,
    windowed,
)
from kairos.definitions.completion import Message

# One prompt, two retrieval depths: the account's aggregates and the articles found for the
# question. The template is the same; only how many articles the search returns differs.
_ANSWER = (
    "You are a support agent. Customer {{ account_name }} ({{ plan }} plan, customer for "
    "{{ '%.0f' % customer_days }} days): {{ failed_charges_30d }} failed charges in 30 days, "
    "{{ refunds_90d }} refunds in 90 days.\nHelp-center articles:\n"
    "{% for d in ARTICLES %}[{{ d.title }}] {{ d.text }}\n{% endfor %}"
    "Question: {{ question }}\nAnswer in two sentences:"
)


def _prompt(articles: str) -> list[Message]:
    return [message("user", _ANSWER.replace("ARTICLES", articles))]


@features
class Charge:
    id: str
    account_id: "Account.id"
    amount: float
    # paid | failed
    status: str
    refunded: bool
    ts: FeatureTime


@features
class Account:
    id: str
    name: str
    # free | team | business
    plan: str
    # the language the customer writes in (en, de, fr)
    lang: str
    signup_at: datetime
    # every charge of the account (none from after the query's now)
    charges: DataFrame[Charge]
    failed_charges: Windowed[int] = windowed(
        "30d", expression=_.charges[_.status == "failed", _.ts > _.window_start].count()
    )
    refunds: Windowed[int] = windowed(
        "90d", expression=_.charges[_.refunded, _.ts > _.window_start].count()
    )
    customer_days: float = (Now - _.signup_at).dt.days()


@features(events=True)
class Doc:
    """A help-center article; a new version of an article replaces the old from its
    `updated_at` on (a query before then still finds the old text)."""

    id: str
    lang: str
    title: str
    text: str
    updated_at: FeatureTime
    embedding: Vector[384] = kr.embedding(model="local/minilm", input=_.text)


@features
class Ticket:
    id: str
    account_id: "Account.id"
    question: str
    account_name: str = _.account.name
    plan: str = _.account.plan
    lang: str = _.account.lang
    customer_days: float = _.account.customer_days
    failed_charges_30d: int = _.account.failed_charges["30d"]
    refunds_90d: int = _.account.refunds["90d"]
    question_embedding: Vector[384] = kr.embedding(model="local/minilm", input=_.question)
    # the articles nearest the question, in the customer's language, as of the query's now
    articles_3: DataFrame[Doc] = kr.nearest(
        Doc.embedding, query=_.question_embedding, k=3, where=_.lang == kr.parent.lang
    )
    articles_20: DataFrame[Doc] = kr.nearest(
        Doc.embedding, query=_.question_embedding, k=20, where=_.lang == kr.parent.lang
    )
    answer_3: str = completion(
        model="local/gemma-270m",
        messages=_prompt("articles_3"),
        max_tokens=24,
        temperature=0,
        timeout="120s",
    )
    answer_20: str = completion(
        model="local/gemma-270m",
        messages=_prompt("articles_20"),
        max_tokens=24,
        temperature=0,
        timeout="120s",
    )
