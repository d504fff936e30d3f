"""Train the fraud example's risk model on a point-in-time training set and register it.

For spine rows (user, ts) every 7 days back from the ANCHOR, the features are computed as of
ts (`client.offline_query`: nothing from after ts) and the label is whether the user has a
declined transaction in the 7 days after ts (the same query at ts + 7d). A scikit-learn
pipeline (impute, scale, logistic regression) is fitted on them and registered as "risk"
with the alias "prod"; `User.risk = kr.predict("risk", ..., alias="prod")` serves it.

python -m examples.fraud.train
"""

from datetime import timedelta
from pathlib import Path
from typing import Any

import kairos as kr
from kairos.models import ModelVersion, UnknownModel

from .generate import ANCHOR

# The model's inputs, in order: the same features `User.risk` passes to it.
INPUTS = [
    "user.txn_count[1d]",
    "user.txn_count[7d]",
    "user.declines[7d]",
    "user.avg_ticket[90d]",
    "user.account_age_days",
]
HORIZON = timedelta(days=7)


def training_set(client: kr.Client, weeks: int = 8) -> Any:
    """A pandas DataFrame: one row per (user, ts), the INPUTS as of ts and the label."""
    _, rows = client.fetch("bank", "select id from users order by id")
    users = [r[0] for r in rows]
    times = [ANCHOR - HORIZON * (k + 1) for k in range(weeks)]
    spine = {
        "user.id": [u for _ in times for u in users],
        "ts": [t for t in times for _ in users],
    }
    features = client.offline_query(spine, INPUTS).to_pandas()
    later = {"user.id": spine["user.id"], "ts": [t + HORIZON for t in spine["ts"]]}
    outcome = client.offline_query(later, ["user.declines[7d]"]).to_pandas()
    features["label"] = (outcome["user.declines[7d]"].fillna(0) > 0).astype(int)
    return features


def ensure_model(users: int, seed: int) -> ModelVersion:
    """The "prod" version trained on this data (users, seed), training it when missing."""
    data = {"users": users, "seed": seed}
    with kr.Client(Path(__file__).parent) as client:
        try:
            current = client.models.get("risk", alias="prod")
            if all(current.metadata.get(k) == v for k, v in data.items()):
                return current
        except UnknownModel:
            pass
        return train(client, metadata=data)


def train(
    client: kr.Client,
    aliases: tuple[str, ...] = ("prod",),
    metadata: dict[str, Any] | None = None,
) -> ModelVersion:
    """Fit the pipeline on the training set and register it; returns the new version."""
    from sklearn.impute import SimpleImputer
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    data = training_set(client)
    x = data[INPUTS].astype(float)
    pipeline = make_pipeline(SimpleImputer(), StandardScaler(), LogisticRegression())
    pipeline.fit(x, data["label"])
    accuracy = float(pipeline.score(x, data["label"]))
    return client.models.register(
        "risk",
        pipeline,
        aliases=list(aliases),
        metadata={
            **(metadata or {}),
            "rows": len(data),
            "train_accuracy": round(accuracy, 4),
            "horizon": "7d",
        },
    )


def main() -> None:
    from .generate import generate

    generate()  # writes the data and, when missing, trains and registers the model
    with kr.Client(Path(__file__).parent) as client:
        version = client.models.get("risk", alias="prod")
    print(f"risk@prod is {version.label}: {dict(version.metadata)}")


if __name__ == "__main__":
    main()
