"""Which deployment serves a call: the model group's deployments ordered by its strategy,
then its fallback groups' in turn; deployments the key may not use or whose circuit is open
are left out. Retries walk the list in order.

Strategies: `priority` (lowest number first, ties by weight), `weighted` (a weighted random
order), `least-busy` (fewest calls in flight), `lowest-latency` (smallest moving average of
recent latencies; a deployment not measured yet goes first, so it gets measured).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass

from kairos.errors import did_you_mean
from kairos.gateway.config import Deployment, GatewayConfig
from kairos.gateway.errors import UnknownModel
from kairos.gateway.providers.breaker import Breaker

_SMOOTHING = 0.2  # weight of the newest latency in the moving average


@dataclass
class _Health:
    breaker: Breaker
    in_flight: int = 0
    latency: float | None = None


class Router:
    def __init__(
        self,
        config: GatewayConfig,
        *,
        clock: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
    ) -> None:
        self.config = config
        self.clock = clock
        self._rng = rng or random.Random()
        self._health = {
            d.id: _Health(Breaker(config.breaker.failures, config.breaker.cooldown))
            for group in config.models.values()
            for d in group.deployments
        }

    def group_of(self, model: str) -> str:
        """The model group a requested name (group or alias) stands for."""
        if model in self.config.models:
            return model
        if model in self.config.aliases:
            return self.config.aliases[model]
        raise UnknownModel(
            f"no model {model!r}"
            + did_you_mean(model, [*self.config.models, *self.config.aliases])
            + "; GET /v1/models lists the models your key may use",
            param="model",
        )

    def candidates(self, group: str, allowed: Callable[[str], bool]) -> list[Deployment]:
        """Deployments to try, in order: the group's, then each fallback group's."""
        now = self.clock()
        ordered: list[Deployment] = []
        seen: set[str] = set()
        pending = [group]
        while pending:
            name = pending.pop(0)
            if name in seen:
                continue
            seen.add(name)
            spec = self.config.models[name]
            if allowed(name):  # the allow-list is checked on the group actually dispatched
                ordered += [
                    d
                    for d in self._order(spec.strategy, list(spec.deployments))
                    if self._health[d.id].breaker.available(now)
                ]
            pending += spec.fallbacks
        return ordered

    def reachable(self, group: str, allowed: Callable[[str], bool]) -> bool:
        """Whether any group the request could dispatch to is allowed (circuits aside)."""
        seen: set[str] = set()
        pending = [group]
        while pending:
            name = pending.pop(0)
            if name in seen:
                continue
            seen.add(name)
            if allowed(name):
                return True
            pending += self.config.models[name].fallbacks
        return False

    def _order(self, strategy: str, deployments: list[Deployment]) -> list[Deployment]:
        if len(deployments) == 1:
            return deployments
        if strategy == "weighted":
            # a weighted random order: sort by u^(1/w) (Efraimidis-Spirakis)
            return sorted(deployments, key=lambda d: -(self._rng.random() ** (1 / d.weight)))
        if strategy == "least-busy":
            self._rng.shuffle(deployments)
            return sorted(deployments, key=lambda d: self._health[d.id].in_flight)
        if strategy == "lowest-latency":
            return sorted(deployments, key=lambda d: self._health[d.id].latency or 0.0)
        return sorted(deployments, key=lambda d: (d.priority, -d.weight))

    def acquire(self, deployment: Deployment) -> bool:
        """Start a call to `deployment`; False when its circuit lets none through now."""
        health = self._health[deployment.id]
        if not health.breaker.acquire(self.clock()):
            return False
        health.in_flight += 1
        return True

    def finished(self, deployment: Deployment, outcome: str, seconds: float) -> None:
        """End a call: outcome is "ok", "failed" (counts against the circuit) or "neutral"."""
        health = self._health[deployment.id]
        health.in_flight -= 1
        if outcome == "ok":
            health.breaker.succeeded()
            previous = health.latency
            health.latency = (
                seconds if previous is None else previous + _SMOOTHING * (seconds - previous)
            )
        elif outcome == "failed":
            health.breaker.failed(self.clock())
        else:
            health.breaker.released()

    def state(self, deployment: Deployment) -> str:
        return self._health[deployment.id].breaker.state(self.clock())
