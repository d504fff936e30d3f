"""The fraud example, end to end on embedded defaults: `make demo`.

Generates the seeded SQLite data, loads the project, and asks for a risk decision's inputs:
the plan, the values with where each came from, the cache at work, the per-node trace, and a
bulk query over every user.
"""

import time
from datetime import datetime
from pathlib import Path
from typing import Any

import kairos as kr

from .generate import ANCHOR, generate

PROJECT = Path(__file__).parent
OUTPUTS = [
    "user.name",
    "user.txn_count[1d]",
    "user.declines[7d]",
    "user.avg_ticket[90d]",
    "user.account_age_days",
    "user.risk",
]


def table(headers: list[str], rows: list[list[Any]]) -> str:
    cells = [[_cell(v) for v in row] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) for i, h in enumerate(headers)]
    line = "  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True))
    rule = "  ".join("-" * w for w in widths)
    body = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in cells]
    return "\n".join([line, rule, *body])


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.3f}"
    if isinstance(value, datetime):
        return value.isoformat(timespec="seconds")
    return "-" if value is None else str(value)


def main() -> None:
    generate()
    with kr.Client(PROJECT) as client:
        print(f"kairos {kr.__version__} - fraud example, queried as of {ANCHOR.isoformat()}\n")
        print("Plan for user.risk and its inputs:")
        print(client.explain(input=["user.id"], output=OUTPUTS))

        users = ["u0001", "u0002", "u0003"]
        first = [client.query({"user.id": u}, OUTPUTS, now=ANCHOR) for u in users]
        for uid, result in zip(users, first, strict=True):
            print(f"\n{uid} (query {result.meta.query_id[:8]}, {result.meta.duration_ms:.2f} ms):")
            rows = [[fv.feature, fv.value, fv.source, fv.observed_at] for fv in result]
            print(table(["feature", "value", "source", "observed_at"], rows))
            for error in result.errors:
                print(f"  error {error.feature}: {error.code}: {error.message}")

        print("\nTrace of the first query (time per plan node):")
        rows = [
            [t.node if t.node is not None else "", t.kind, t.label, t.start_ms, t.duration_ms]
            for t in first[0].trace
        ]
        print(table(["node", "kind", "label", "start ms", "duration ms"], rows))

        again = client.query({"user.id": "u0001"}, OUTPUTS, now=ANCHOR.replace(second=30))
        print(
            f"\nSame user 30 s later: {again.meta.cache_hits} of {len(OUTPUTS)} features from "
            f"the cache (max_staleness 1m), {again.meta.duration_ms:.3f} ms, "
            f"sources: {sorted({fv.source or '-' for fv in again})}"
        )

        everyone = [f"u{i:04d}" for i in range(1, 201)]
        started = time.perf_counter()
        bulk = client.query_bulk(
            {"user.id": everyone}, OUTPUTS, now=ANCHOR, staleness={"user.risk": "0s"}
        )
        elapsed = (time.perf_counter() - started) * 1000
        ranked = sorted(
            zip(everyone, bulk.column("user.risk"), strict=True), key=lambda p: -(p[1] or 0)
        )
        print(f"\nBulk query: {len(bulk)} users in {elapsed:.1f} ms, {len(bulk.errors)} errors.")
        print("Riskiest five:")
        top = [
            [uid, *[bulk.columns[o].values[everyone.index(uid)] for o in OUTPUTS]]
            for uid, _ in ranked[:5]
        ]
        print(table(["user", *OUTPUTS], top))


if __name__ == "__main__":
    main()
