"""What a replay produces: a row per decision and compared feature (`ReplayRow`), and its
summary summed as the rows arrive (`ReplayTally`): how many decisions changed, and per feature
how much; for LLM features the calls before and after. A replay of 100,000 decisions adds its
rows a chunk at a time and need keep only these sums, so its summary costs the memory of a
chunk.

    >>> tally = ReplayTally()
    >>> tally.add(records, rows, llm_calls)      # once per chunk  # doctest: +SKIP
    >>> tally.features["user.risk"].summary()["mean_abs_delta"]  # doctest: +SKIP
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, TypeGuard

from kairos.stores.query_log import LoggedQuery


@dataclass(frozen=True, slots=True)
class ReplayRow:
    """One feature of one decision: what was logged and what the replay computed."""

    query_id: str
    now: datetime
    feature: str
    logged: Any
    replayed: Any
    changed: bool
    error: str | None = None  # why the replay has no value (the feature's error message)


def _number(value: Any) -> TypeGuard[int | float]:
    return isinstance(value, int | float) and not isinstance(value, bool)


@dataclass
class FeatureTally:
    """One feature's rows: how many, changed, failed; for numbers the sums of the logged and
    replayed values and of their absolute differences, and the largest difference."""

    rows: int = 0
    changed: int = 0
    errors: int = 0
    pairs: int = 0
    logged: float = 0.0
    replayed: float = 0.0
    delta: float = 0.0
    max_delta: float = 0.0

    def add(self, row: ReplayRow) -> None:
        self.rows += 1
        self.changed += row.changed
        self.errors += row.error is not None
        if _number(row.logged) and _number(row.replayed):
            before, after = float(row.logged), float(row.replayed)
            difference = abs(after - before)
            self.max_delta = difference if self.pairs == 0 else max(self.max_delta, difference)
            self.pairs += 1
            self.logged += before
            self.replayed += after
            self.delta += difference

    def summary(self) -> dict[str, Any]:
        out: dict[str, Any] = {"rows": self.rows, "changed": self.changed, "errors": self.errors}
        if self.pairs:
            out["mean_logged"] = self.logged / self.pairs
            out["mean_replayed"] = self.replayed / self.pairs
            out["mean_abs_delta"] = self.delta / self.pairs
            out["max_abs_delta"] = self.max_delta
        return out


@dataclass
class CallsTally:
    """LLM calls of one feature: their count, token and cost sums, and every time to first
    token (one float a call, for the quantiles)."""

    calls: int = 0
    sums: dict[str, float] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)
    ttft: list[float] = field(default_factory=list)

    def add(self, call: Mapping[str, Any]) -> None:
        self.calls += 1
        for key in ("prompt_tokens", "completion_tokens", "ttft_ms", "cost_usd"):
            value = call.get(key)
            if _number(value):
                self.sums[key] = self.sums.get(key, 0) + value
                self.counts[key] = self.counts.get(key, 0) + 1
        ttft = call.get("ttft_ms")
        if _number(ttft):
            self.ttft.append(ttft)

    def _mean(self, key: str) -> float | None:
        count = self.counts.get(key)
        return self.sums[key] / count if count else None

    def summary(self) -> dict[str, Any]:
        ordered = sorted(self.ttft)
        return {
            "calls": self.calls,
            "mean_prompt_tokens": self._mean("prompt_tokens"),
            "mean_completion_tokens": self._mean("completion_tokens"),
            "mean_ttft_ms": self._mean("ttft_ms"),
            "p50_ttft_ms": quantile(ordered, 0.5),
            "p99_ttft_ms": quantile(ordered, 0.99),
            "cost_usd": self.sums.get("cost_usd") if self.counts.get("cost_usd") else None,
        }


@dataclass
class ReplayTally:
    """Everything a replay's summary says, added a chunk at a time (`add`)."""

    decisions: int = 0
    changed_decisions: int = 0
    features: dict[str, FeatureTally] = field(default_factory=dict)
    logged_calls: dict[str, CallsTally] = field(default_factory=dict)
    replayed_calls: dict[str, CallsTally] = field(default_factory=dict)
    recomputed: set[str] = field(default_factory=set)
    plans: dict[str, str] = field(default_factory=dict)  # logged plan -> replayed plan
    from_sources: dict[str, int] = field(default_factory=dict)
    logged_definitions: set[str] = field(default_factory=set)

    def add(
        self,
        records: Sequence[LoggedQuery],
        rows: Sequence[ReplayRow],
        llm_calls: Mapping[str, Sequence[Mapping[str, Any]]],
    ) -> None:
        """Add the rows of `records` (each decision in one `add` only) and the replay's LLM
        calls of them, by query id."""
        self.decisions += len(records)
        changed: set[str] = set()
        features = self.features
        for row in rows:
            tally = features.get(row.feature)
            if tally is None:
                tally = features[row.feature] = FeatureTally()
            tally.add(row)
            if row.changed:
                changed.add(row.query_id)
        self.changed_decisions += len(changed)
        for record in records:
            if record.plan is not None:
                self.logged_definitions.add(record.plan.definitions)
            for call in record.llm_calls:
                self._calls(self.logged_calls, call)
        for calls in llm_calls.values():
            for replayed in calls:
                self._calls(self.replayed_calls, replayed)

    @staticmethod
    def _calls(by_feature: dict[str, CallsTally], call: Mapping[str, Any]) -> None:
        name = call.get("feature")
        if isinstance(name, str):
            by_feature.setdefault(name, CallsTally()).add(call)

    def llm_summary(self) -> dict[str, Any]:
        """Per LLM feature the replay called: its calls as logged and as replayed."""
        return {
            name: {
                "logged": self.logged_calls.get(name, CallsTally()).summary(),
                "replayed": self.replayed_calls[name].summary(),
            }
            for name in sorted(self.replayed_calls)
        }


def quantile(ordered: Sequence[float], q: float) -> float | None:
    """The nearest-rank quantile of sorted values (None when there are none)."""
    if not ordered:
        return None
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]
