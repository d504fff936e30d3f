"""A resolver that raises nulls what it produces and what depends on it, and nothing else."""

from datetime import UTC, datetime

from kairos import Features, _, features, online
from tests.engine.conftest import MakeClient

NOW = datetime(2026, 1, 10, tzinfo=UTC)


@features
class Merchant:
    id: str
    name: str
    country: str
    rating: float
    rating_pct: float = _.rating * 100
    label: str


@features
class Payment:
    id: str
    merchant_id: "Merchant.id"
    amount: float


def test_raising_resolver_gives_resolver_error_and_keeps_independent_features(
    make_client: MakeClient,
) -> None:
    @online
    def broken_rating(mid: Merchant.id) -> Merchant.rating:
        raise ConnectionError("ratings service is down")

    @online
    def label(rating: Merchant.rating, name: Merchant.name) -> Merchant.label:
        return f"{name}: {rating}"

    @online
    def name(mid: Merchant.id) -> Merchant.name:
        return "Shop"

    client = make_client(Merchant, broken_rating, label, name)
    result = client.query(
        input={Merchant.id: "m1"},
        output=[Merchant.rating, Merchant.label, Merchant.rating_pct, Merchant.name],
        now=NOW,
    )

    assert result.values == {
        "merchant.rating": None,
        "merchant.label": None,
        "merchant.rating_pct": None,
        "merchant.name": "Shop",
    }
    errors = {e.feature: e for e in result.errors}
    assert set(errors) == {"merchant.rating", "merchant.label", "merchant.rating_pct"}

    failed = errors["merchant.rating"]
    assert failed.code == "resolver_error"
    assert failed.resolver == "broken_rating"
    assert "broken_rating" in failed.message
    assert "ConnectionError" in failed.message
    assert "ratings service is down" in failed.message
    assert failed.row is None

    # A resolver and an expression that read the failed feature are skipped, and say why.
    for dependent in ("merchant.label", "merchant.rating_pct"):
        assert errors[dependent].code == "upstream_error"
        assert "merchant.rating" in errors[dependent].message
        assert "ratings service is down" in errors[dependent].message
    assert errors["merchant.label"].resolver == "label"

    assert result.features["merchant.name"].error is None
    assert result.features["merchant.name"].source == "name"
    assert result.get("merchant.rating").error is failed
    statuses = {t.label: t.status for t in result.trace}
    assert statuses["broken_rating"] == "error"
    assert statuses["name"] == "ok"
    assert "label" not in statuses  # it never ran


def test_upstream_error_propagates_through_several_levels(make_client: MakeClient) -> None:
    @online
    def broken_rating(mid: Merchant.id) -> Merchant.rating:
        raise ValueError("bad row")

    @online
    def label(pct: Merchant.rating_pct) -> Merchant.label:
        return f"{pct}%"

    client = make_client(Merchant, broken_rating, label)
    result = client.query(input={Merchant.id: "m1"}, output=[Merchant.label], now=NOW)

    (error,) = result.errors
    assert error.feature == "merchant.label"
    assert error.code == "upstream_error"
    assert "merchant.rating_pct" in error.message


def test_raising_multi_output_resolver_fails_each_of_its_features(
    make_client: MakeClient,
) -> None:
    @online
    def profile(mid: Merchant.id) -> Features[Merchant.name, Merchant.country]:
        raise KeyError("m1")

    @online
    def rating(mid: Merchant.id) -> Merchant.rating:
        return 4.5

    client = make_client(Merchant, profile, rating)
    result = client.query(
        input={Merchant.id: "m1"},
        output=[Merchant.name, Merchant.country, Merchant.rating],
        now=NOW,
    )

    assert result.values == {
        "merchant.name": None,
        "merchant.country": None,
        "merchant.rating": 4.5,
    }
    assert sorted((e.feature, e.code, e.resolver) for e in result.errors) == [
        ("merchant.country", "resolver_error", "profile"),
        ("merchant.name", "resolver_error", "profile"),
    ]


def test_bulk_failure_for_one_entity_nulls_only_that_row(make_client: MakeClient) -> None:
    @online
    def rating(mid: Merchant.id) -> Merchant.rating:
        if mid == "m2":
            raise RuntimeError(f"no rating for {mid}")
        return float(len(mid))

    client = make_client(Merchant, rating)
    result = client.query_bulk(
        input={Merchant.id: ["m1", "m2", "m333"]},
        output=[Merchant.rating, Merchant.rating_pct],
        now=NOW,
    )

    assert result.values == {
        "merchant.rating": [2.0, None, 4.0],
        "merchant.rating_pct": [200.0, None, 400.0],
    }
    errors = sorted(result.errors, key=lambda e: e.feature)
    assert [(e.feature, e.code, e.row) for e in errors] == [
        ("merchant.rating", "resolver_error", 1),
        ("merchant.rating_pct", "upstream_error", 1),
    ]
    assert "no rating for m2" in errors[0].message
    assert result.row(1)["merchant.rating"].error == errors[0]
    assert result.row(0)["merchant.rating"].error is None
    assert result.row(2)["merchant.rating"].value == 4.0


def test_bulk_of_one_entity_reports_the_row_of_its_error(make_client: MakeClient) -> None:
    @online
    def rating(mid: Merchant.id) -> Merchant.rating:
        raise RuntimeError("down")

    client = make_client(Merchant, rating)
    result = client.query_bulk(input={Merchant.id: ["m1"]}, output=[Merchant.rating], now=NOW)

    (error,) = result.errors
    assert error.code == "resolver_error"
    assert error.row == 0
    assert result.row(0)["merchant.rating"].error == error

    # a single query has no rows: its errors say row=None
    single = client.query(input={Merchant.id: "m1"}, output=[Merchant.rating], now=NOW)
    (single_error,) = single.errors
    assert single_error.code == "resolver_error"
    assert single_error.row is None
    assert single.features["merchant.rating"].error == single_error


def test_failed_foreign_key_gives_upstream_error_on_path_features(
    make_client: MakeClient,
) -> None:
    @online
    def merchant_of(pid: Payment.id) -> Payment.merchant_id:
        raise TimeoutError("ledger unavailable")

    @online
    def merchant_name(mid: Merchant.id) -> Merchant.name:
        return "Shop"

    client = make_client(Merchant, Payment, merchant_of, merchant_name)
    result = client.query(
        input={Payment.id: "p1"}, output=["payment.merchant.name", Payment.merchant_id], now=NOW
    )

    assert result.values == {"payment.merchant.name": None, "payment.merchant_id": None}
    errors = {e.feature: e for e in result.errors}
    assert errors["payment.merchant_id"].code == "resolver_error"
    assert errors["payment.merchant.name"].code == "upstream_error"
    assert "payment.merchant_id" in errors["payment.merchant.name"].message
    assert "ledger unavailable" in errors["payment.merchant.name"].message
    assert errors["payment.merchant.name"].row is None
