"""Prices per model in integer micro-dollars per million tokens, from the versioned table
shipped with kairos (`prices.json`) and overridable in the gateway's configuration.

Costs round up to whole micro-dollars, so a budget is never undercharged:

>>> Price(150_000, 600_000).cost(1_000, 500)   # $0.15 / $0.60 per million tokens
450
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from importlib import resources
from typing import Any

from kairos.gateway.errors import GatewayConfigError

PER_MILLION = 1_000_000


@dataclass(frozen=True, slots=True)
class Price:
    """Micro-dollars per million input and output tokens."""

    input: int
    output: int

    def cost(self, input_tokens: int, output_tokens: int) -> int:
        """Micro-dollars for a call, rounded up."""
        scaled = input_tokens * self.input + output_tokens * self.output
        return -(-scaled // PER_MILLION)

    def affordable_output(self, input_tokens: int, micros: int) -> int:
        """The most output tokens whose cost, with the input's, fits in `micros`."""
        room = micros * PER_MILLION - input_tokens * self.input
        if room < 0:
            return -1
        return room // self.output if self.output else 1 << 62


@dataclass(frozen=True)
class PriceTable:
    """Model name -> Price, with the version of the table it came from."""

    version: str
    prices: Mapping[str, Price]

    def get(self, model: str) -> Price | None:
        return self.prices.get(model)

    def overridden(self, overrides: Mapping[str, Price], version: str | None = None) -> PriceTable:
        """This table with some models' prices replaced; the version records the override."""
        if not overrides:
            return self
        return PriceTable(version or f"{self.version}+config", {**self.prices, **overrides})


def usd_per_million(value: Any, where: str) -> int:
    """Read "2.50" (USD per million tokens) as 2_500_000 micro-dollars, exactly."""
    try:
        amount = Decimal(str(value))
    except InvalidOperation:
        raise GatewayConfigError(f"{where}: {value!r} is not a price in USD, e.g. 2.50") from None
    micros = amount * PER_MILLION
    if amount < 0 or micros != micros.to_integral_value():
        raise GatewayConfigError(f"{where}: {value!r} must be >= 0 with at most 6 decimals")
    return int(micros)


def parse_price(raw: Any, where: str) -> Price:
    if not isinstance(raw, Mapping) or set(raw) - {"input", "output"} or "input" not in raw:
        raise GatewayConfigError(
            f"{where}: a price is {{input: USD, output: USD}} per million tokens, e.g. "
            "{input: 0.15, output: 0.60}"
        )
    return Price(
        usd_per_million(raw["input"], f"{where}.input"),
        usd_per_million(raw.get("output", 0), f"{where}.output"),
    )


def shipped_prices() -> PriceTable:
    """The price table shipped in the package (read on call, not on import)."""
    text = resources.files("kairos.gateway").joinpath("prices.json").read_text()
    raw = json.loads(text)
    return PriceTable(
        str(raw["version"]),
        {name: parse_price(p, f"prices.json {name}") for name, p in raw["models"].items()},
    )
