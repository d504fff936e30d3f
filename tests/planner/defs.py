"""Feature classes and resolvers shared by the planner tests."""

from kairos import DataFrame, Features, FeatureTime, Now, _, feature, features, online


@features
class Account:
    id: str
    owner_id: "Owner.id"
    balance: float
    tier: str = feature(default="basic")
    # computed by the engine, no resolver needed
    doubled: float = _.balance * 2


@features(max_staleness="1m")
class Owner:
    id: str
    name: str
    accounts: DataFrame[Account]
    account_count: int = _.accounts.count()
    score: float


@features
class Event:
    id: str
    account_id: "Account.id"
    ts: FeatureTime


@online
def account_row(aid: Account.id) -> Features[Account.balance, Account.owner_id]:
    return 10.0, "o1"


@online
def owner_name(oid: Owner.id) -> Owner.name:
    return "ann"


@online
def owner_accounts(oid: Owner.id) -> DataFrame[Account]:
    return DataFrame([{"id": "a1", "owner_id": oid, "balance": 1.0}])


@online(timeout="250ms")
def owner_score(name: Owner.name, count: Owner.account_count, now: Now) -> Owner.score:
    return float(count)


ALL = [Account, Owner, Event, account_row, owner_name, owner_accounts, owner_score]
