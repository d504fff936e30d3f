"""Prices per model in integer micro-dollars per million tokens, from the versioned table
shipped with kairos (`prices.json`) and overridable in the gateway's configuration.

Costs round up to whole micro-dollars, so a budget is never undercharged:

>>> Price(150_000, 600_000).cost(1_000, 500)   # $0.15 / $0.60 per million tokens
450

Input read from a provider's prompt cache (`cached_input`) and input written to it
(`cache_write`, and Anthropic's 1-hour `cache_write_1h`) have prices of their own; a price that
names none of them bills those tokens as plain input:

>>> Price(2_500_000, 10_000_000, cached_input=1_250_000).cost(1_000, 0, cached=800)
1500
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
    """Micro-dollars per million input and output tokens, and per million input tokens read
    from or written to a prompt cache (None: as `input`)."""

    input: int
    output: int
    cached_input: int | None = None
    cache_write: int | None = None
    cache_write_1h: int | None = None  # Anthropic's 1-hour cache; None: as `cache_write`

    def cost(
        self,
        input_tokens: int,
        output_tokens: int,
        *,
        cached: int = 0,
        written: int = 0,
        written_1h: int = 0,
    ) -> int:
        """Micro-dollars for a call, rounded up. `cached` and `written` are parts of
        `input_tokens` (as OpenAI counts them); `written_1h` is a part of `written`."""
        write = self.input if self.cache_write is None else self.cache_write
        write_1h = write if self.cache_write_1h is None else self.cache_write_1h
        read = self.input if self.cached_input is None else self.cached_input
        scaled = (
            (input_tokens - cached - written) * self.input
            + cached * read
            + (written - written_1h) * write
            + written_1h * write_1h
            + output_tokens * self.output
        )
        return -(-scaled // PER_MILLION)

    def held(self) -> Price:
        """This price with every input token at the dearest rate input can be billed at (a
        cache write): what a hold charges, since which input the provider caches is its own
        choice."""
        dearest = max(self.input, self.cache_write or 0, self.cache_write_1h or 0)
        return self if dearest == self.input else Price(dearest, self.output)

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


_PRICE_FIELDS = ("input", "output", "cached_input", "cache_write", "cache_write_1h")


def parse_price(raw: Any, where: str) -> Price:
    if not isinstance(raw, Mapping) or set(raw) - set(_PRICE_FIELDS) or "input" not in raw:
        raise GatewayConfigError(
            f"{where}: a price is {{input: USD, output: USD}} per million tokens, e.g. "
            "{input: 0.15, output: 0.60}, optionally with cached_input, cache_write and "
            "cache_write_1h"
        )
    optional = {
        name: usd_per_million(raw[name], f"{where}.{name}")
        for name in _PRICE_FIELDS[2:]
        if raw.get(name) is not None
    }
    return Price(
        usd_per_million(raw["input"], f"{where}.input"),
        usd_per_million(raw.get("output", 0), f"{where}.output"),
        **optional,
    )


def shipped_prices() -> PriceTable:
    """The price table shipped in the package (read on call, not on import)."""
    text = resources.files("kairos.gateway.accounting").joinpath("prices.json").read_text()
    raw = json.loads(text)
    return PriceTable(
        str(raw["version"]),
        {name: parse_price(p, f"prices.json {name}") for name, p in raw["models"].items()},
    )
