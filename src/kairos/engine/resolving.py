"""Calling a resolver node for the rows a run computes, and reading what it returned.

The runner gets one argument list per row and answers each with (True, value) or (False,
error), under the node's timeout (a model's first load is awaited before it, not counted in
it). Every model or LLM call the runner made is pinned to the query rows it computed and kept
in the run's `Calls`, which the engine returns.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from concurrent.futures import Executor
from datetime import timedelta
from typing import Any

from kairos.definitions.feature import ref_of
from kairos.planner.plan import ResolverNode
from kairos.resolvers.calls import Call, Calls

# how long a query waits for a model's first load before the call's own timeout runs
PREPARE_LIMIT = timedelta(minutes=2)


async def call_resolver(
    node: ResolverNode,
    arguments: list[list[Any]],
    rows: Sequence[int],
    pool: Executor,
    calls: Calls,
) -> tuple[list[tuple[bool, Any] | None], bool]:
    """Run `node`'s resolver for `rows` (`arguments[i]` for query row `rows[i]`): each row's
    result (None where the call did not finish), and whether it timed out. The model and LLM
    calls it made are added to `calls`, as they finish."""
    results: list[tuple[bool, Any] | None] = [None] * len(rows)
    prepare = node.resolver.prepare  # a model's first load is not the call's time
    if prepare is not None:
        # a load that hangs (an unreachable volume) is left to the call and its timeout
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(PREPARE_LIMIT.total_seconds()):
                await prepare()

    def made(indexes: tuple[int, ...], call: Call) -> None:
        calls.add(call.for_rows(tuple(rows[index] for index in indexes)))

    work = node.resolver.runner.run(arguments, results, pool, made)
    try:
        async with asyncio.timeout(node.timeout.total_seconds()):  # no extra task
            await work
    except TimeoutError:
        return results, True
    return results, False


def values_by_name(names: Sequence[str], value: Any) -> dict[str, Any] | None:
    """The values a `Features[...]` resolver returned, by output name: from a tuple in the
    order of `names`, a dict (keyed by name, qualified name or feature) or a feature-class
    instance; None for anything else."""
    if isinstance(value, tuple | list) and len(value) == len(names):
        return dict(zip(names, value, strict=True))
    if isinstance(value, dict):
        return {_output_name(k): v for k, v in value.items()}
    if hasattr(value, "__kairos__"):
        return {k: v for k, v in vars(value).items() if k in names}
    return None


def _output_name(key: Any) -> str:
    """`"balance"`, `"wallet.balance"` or `Wallet.balance` -> "balance"."""
    ref = ref_of(key)
    return ref.name if ref is not None else str(key).rpartition(".")[2]
