"""What the caller passes: supplied values win over computation; bad inputs fail loudly; bad
resolver values fail only their feature."""

from collections import Counter
from datetime import UTC, datetime

import pytest

import kairos as kr
from kairos import Features, _, feature, features, online
from tests.engine.conftest import MakeClient

NOW = datetime(2026, 1, 10, tzinfo=UTC)


@features
class Wallet:
    id: str
    owner: str
    balance: float
    doubled: float = _.balance * 2
    band: str
    fee: float = feature(min=0, max=50)


def test_supplied_input_is_used_and_its_resolver_never_runs(make_client: MakeClient) -> None:
    calls: Counter[str] = Counter()

    @online
    def balance(wid: Wallet.id) -> Wallet.balance:
        calls["balance"] += 1
        return 10.0

    @online
    def band(b: Wallet.balance) -> Wallet.band:
        calls["band"] += 1
        return "high" if b > 50 else "low"

    client = make_client(Wallet, balance, band)
    result = client.query(
        input={Wallet.id: "w1", Wallet.balance: 99.0},
        output=[Wallet.band, Wallet.doubled, Wallet.balance],
        now=NOW,
    )

    assert calls == Counter({"band": 1})
    assert result.errors == []
    assert result.values == {"wallet.band": "high", "wallet.doubled": 198.0, "wallet.balance": 99.0}
    supplied = result.features["wallet.balance"]
    assert supplied.source == "input"
    assert supplied.observed_at == NOW

    # Without the input, the resolver computes it.
    computed = client.query(input={Wallet.id: "w1"}, output=[Wallet.band], now=NOW)
    assert computed.get_value(Wallet.band) == "low"
    assert calls == Counter({"band": 2, "balance": 1})


def test_supplied_input_without_the_primary_key(make_client: MakeClient) -> None:
    @online
    def band(b: Wallet.balance) -> Wallet.band:
        return "high" if b > 50 else "low"

    client = make_client(Wallet, band)
    result = client.query(input={Wallet.balance: 80}, output=[Wallet.band, Wallet.doubled])

    assert result.errors == []
    assert result.values == {"wallet.band": "high", "wallet.doubled": 160.0}


def test_supplied_input_wins_over_a_sibling_output_of_a_resolver(
    make_client: MakeClient,
) -> None:
    @online
    def wallet_row(wid: Wallet.id) -> Features[Wallet.owner, Wallet.balance]:
        return ("ann", 10.0)

    client = make_client(Wallet, wallet_row)
    result = client.query(
        input={Wallet.id: "w1", Wallet.balance: 99.0},
        output=[Wallet.owner, Wallet.balance, Wallet.doubled],
        now=NOW,
    )

    assert result.get_value(Wallet.owner) == "ann"
    assert result.get_value(Wallet.doubled) == 198.0
    # Same query, same answer: the caller's balance, not the resolver's.
    assert result.get_value(Wallet.balance) == 99.0
    assert result.features["wallet.balance"].source == "input"


# --- bad input -------------------------------------------------------------------------------


@pytest.fixture
def wallet_client(make_client: MakeClient) -> kr.Client:
    @online
    def balance(wid: Wallet.id) -> Wallet.balance:
        return 10.0

    return make_client(Wallet, balance)


def test_wrong_input_type_is_invalid_input(wallet_client: kr.Client) -> None:
    with pytest.raises(kr.InvalidInput) as raised:
        wallet_client.query(input={Wallet.id: 123}, output=[Wallet.balance])

    message = str(raised.value)
    assert "'wallet.id'" in message
    assert "str" in message
    assert "123" in message
    assert isinstance(raised.value, ValueError)


def test_null_primary_key_is_invalid_input(wallet_client: kr.Client) -> None:
    with pytest.raises(kr.InvalidInput, match=r"wallet\.id"):
        wallet_client.query(input={Wallet.id: None}, output=[Wallet.balance])


def test_int_input_for_a_float_feature_is_accepted(make_client: MakeClient) -> None:
    client = make_client(Wallet)
    result = client.query(input={Wallet.balance: 3}, output=[Wallet.doubled])

    assert result.get_value(Wallet.doubled) == 6.0
    assert isinstance(result.get_value(Wallet.doubled), float)


def test_missing_primary_key_is_missing_input(wallet_client: kr.Client) -> None:
    with pytest.raises(kr.MissingInput) as raised:
        wallet_client.query(input={}, output=[Wallet.balance])

    assert "'wallet.id'" in str(raised.value)


def test_unknown_output_suggests_the_closest_feature(wallet_client: kr.Client) -> None:
    with pytest.raises(kr.UnknownFeature) as raised:
        wallet_client.query(input={Wallet.id: "w1"}, output=["wallet.balanse"])

    message = str(raised.value)
    assert "'wallet.balanse'" in message
    assert "did you mean 'wallet.balance'" in message
    assert isinstance(raised.value, KeyError)


def test_input_that_is_not_a_mapping_is_invalid_input(wallet_client: kr.Client) -> None:
    with pytest.raises(kr.InvalidInput, match="query_bulk"):
        wallet_client.query(input=[{Wallet.id: "w1"}], output=[Wallet.balance])  # type: ignore[arg-type]


# --- bad resolver values -----------------------------------------------------------------------


def test_resolver_returning_the_wrong_type_fails_only_that_feature(
    make_client: MakeClient,
) -> None:
    @online
    def balance(wid: Wallet.id) -> Wallet.balance:
        return "ten"

    @online
    def owner(wid: Wallet.id) -> Wallet.owner:
        return "ann"

    @online
    def band(b: Wallet.balance) -> Wallet.band:
        return "x"

    client = make_client(Wallet, balance, owner, band)
    result = client.query(
        input={Wallet.id: "w1"}, output=[Wallet.balance, Wallet.owner, Wallet.band], now=NOW
    )

    assert result.values == {"wallet.balance": None, "wallet.owner": "ann", "wallet.band": None}
    errors = {e.feature: e for e in result.errors}
    assert errors["wallet.balance"].code == "invalid_value"
    assert errors["wallet.balance"].resolver == "balance"
    assert "float" in errors["wallet.balance"].message
    assert "'ten'" in errors["wallet.balance"].message
    assert errors["wallet.band"].code == "upstream_error"
    assert set(errors) == {"wallet.balance", "wallet.band"}


def test_resolver_returning_none_for_a_non_nullable_feature_is_invalid(
    make_client: MakeClient,
) -> None:
    @online
    def balance(wid: Wallet.id) -> Wallet.balance:
        return None

    client = make_client(Wallet, balance)
    result = client.query(input={Wallet.id: "w1"}, output=[Wallet.balance], now=NOW)

    (error,) = result.errors
    assert error.code == "invalid_value"
    assert "not nullable" in error.message


@pytest.mark.parametrize(
    ("returned", "valid"),
    [(-0.01, False), (0, True), (50, True), (50.5, False)],
)
def test_resolver_value_out_of_range_is_invalid(
    make_client: MakeClient, returned: float, valid: bool
) -> None:
    @online
    def fee(wid: Wallet.id) -> Wallet.fee:
        return returned

    client = make_client(Wallet, fee)
    result = client.query(input={Wallet.id: "w1"}, output=[Wallet.fee], now=NOW)

    if valid:
        assert result.errors == []
        assert result.get_value(Wallet.fee) == returned
    else:
        assert result.get_value(Wallet.fee) is None
        (error,) = result.errors
        assert error.code == "invalid_value"
        assert error.feature == "wallet.fee"
        assert repr(returned) in error.message


def test_multi_output_resolver_may_return_a_tuple_dict_or_instance(
    make_client: MakeClient,
) -> None:
    @online
    def wallet_row(wid: Wallet.id) -> Features[Wallet.owner, Wallet.balance]:
        if wid == "tuple":
            return ("ann", 1.0)
        if wid == "dict":
            return {"owner": "bob", "wallet.balance": 2}  # type: ignore[return-value]
        return Wallet(owner="cid", balance=3.0)  # type: ignore[call-arg, return-value]

    client = make_client(Wallet, wallet_row)
    result = client.query_bulk(
        input={Wallet.id: ["tuple", "dict", "instance"]},
        output=[Wallet.owner, Wallet.balance],
        now=NOW,
    )

    assert result.errors == []
    assert result.values == {
        "wallet.owner": ["ann", "bob", "cid"],
        "wallet.balance": [1.0, 2.0, 3.0],
    }


def test_multi_output_resolver_may_key_its_dict_by_feature(make_client: MakeClient) -> None:
    @online
    def wallet_row(wid: Wallet.id) -> Features[Wallet.owner, Wallet.balance]:
        return {Wallet.owner: "ann", Wallet.balance: 1.0}  # type: ignore[return-value]

    client = make_client(Wallet, wallet_row)
    result = client.query(input={Wallet.id: "w1"}, output=[Wallet.owner, Wallet.balance])

    assert result.errors == []
    assert result.values == {"wallet.owner": "ann", "wallet.balance": 1.0}


def test_multi_output_resolver_with_the_wrong_shape_is_invalid(
    make_client: MakeClient,
) -> None:
    @online
    def wallet_row(wid: Wallet.id) -> Features[Wallet.owner, Wallet.balance]:
        if wid == "short":
            return ("ann",)  # type: ignore[return-value]
        return {"owner": "ann"}  # type: ignore[return-value]

    client = make_client(Wallet, wallet_row)
    result = client.query_bulk(
        input={Wallet.id: ["short", "partial"]}, output=[Wallet.owner, Wallet.balance], now=NOW
    )

    codes = sorted((e.row, e.feature, e.code) for e in result.errors)
    assert codes == [
        (0, "wallet.balance", "invalid_value"),
        (0, "wallet.owner", "invalid_value"),
        (1, "wallet.balance", "missing"),
    ]
    assert result.values == {"wallet.owner": [None, "ann"], "wallet.balance": [None, None]}
