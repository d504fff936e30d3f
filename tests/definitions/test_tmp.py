from kairos import DataFrame, FeatureTime, Windowed, _, feature, features, windowed


@features
class Transaction:
    id: str
    user_id: "User.id"
    amount: float
    ts: FeatureTime


@features(max_staleness="1m")
class User:
    id: str
    name: str
    balance: float = feature(default=0.0)
    transactions: DataFrame[Transaction]
    txn_count: Windowed[int] = windowed("1d", expression=_.transactions.count())
    total: float = _.transactions[_.amount].sum()


def test_x() -> None:
    assert User.balance.fqn == "user.balance"
    assert Transaction.user.name.fqn == "x"
    assert User.txn_count["1d"].fqn == "x"
    u = User(id="u1")
    assert u.id == "u1"
