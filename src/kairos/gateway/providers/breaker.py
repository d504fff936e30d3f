"""A circuit breaker per deployment: after `failures` failures in a row it opens and the
deployment gets no calls; after `cooldown` one call is let through as a probe (half-open);
the probe's success closes it, its failure opens it again.

>>> breaker = Breaker(failures=2, cooldown=30.0)
>>> breaker.failed(now=0.0); breaker.failed(now=0.0); breaker.state(now=1.0)
'open'
>>> breaker.state(now=31.0), breaker.acquire(now=31.0), breaker.acquire(now=31.0)
('half-open', True, False)
"""

from __future__ import annotations


class Breaker:
    __slots__ = ("_failures", "cooldown", "failures", "opened_at", "probing")

    def __init__(self, failures: int, cooldown: float) -> None:
        self.failures = failures
        self.cooldown = cooldown
        self._failures = 0
        self.opened_at: float | None = None
        self.probing = False

    def state(self, now: float) -> str:
        if self.opened_at is None:
            return "closed"
        return "half-open" if now >= self.opened_at + self.cooldown else "open"

    def available(self, now: float) -> bool:
        """Whether a call could be let through now (without taking the probe)."""
        state = self.state(now)
        return state == "closed" or (state == "half-open" and not self.probing)

    def acquire(self, now: float) -> bool:
        """Take permission for one call; in half-open only the first caller gets it."""
        state = self.state(now)
        if state == "closed":
            return True
        if state == "half-open" and not self.probing:
            self.probing = True
            return True
        return False

    def succeeded(self) -> None:
        self._failures = 0
        self.opened_at = None
        self.probing = False

    def failed(self, now: float) -> None:
        self._failures += 1
        if self.probing or self._failures >= self.failures:
            self.opened_at = now
        self.probing = False

    def released(self) -> None:
        """A call taken with acquire() ended without telling (e.g. a client's own error)."""
        self.probing = False
