"""A deployment group as one gateway provider: each call goes to the group's ready replica with
the fewest outstanding requests, so the gateway's keys, budgets and ledger apply to it.

    group = DeploymentGroup(spec); await group.start()
    config = GatewayConfig.from_mapping({**settings, **gateway_entries(group.name)})
    gateway = Gateway(config, providers={group.name: DeploymentProvider(group)})

It satisfies `kairos.gateway.providers.base.Provider` structurally; the gateway's own OpenAI client
does the HTTP (its errors are the gateway's `UpstreamError`s, so failover and breakers work).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from typing import Any

from kairos.gateway.config import ProviderConfig
from kairos.gateway.errors import GatewayConfigError, UpstreamError
from kairos.gateway.providers.openai_compatible import OpenAICompatible
from kairos.gateway.wire.messages import tokenizer_count
from kairos.serving.errors import DeploymentError
from kairos.serving.supervisor import DeploymentGroup, Replica

# The gateway validates a provider's base_url; calls never use this one (replicas are picked
# per call), so it is a reserved, unroutable name.
PLACEHOLDER_URL = "http://kairos-deployment.invalid/v1"


def gateway_entries(name: str, **deployment: Any) -> dict[str, Any]:
    """The `providers` and `models` entries that make group `name` one gateway model group.

    `deployment` adds settings to the group's one deployment (price, timeout...).
    """
    return {
        "providers": {name: {"kind": "openai", "base_url": PLACEHOLDER_URL}},
        "models": {name: {"deployments": [{"provider": name, "model": name, **deployment}]}},
    }


def with_groups(section: Mapping[str, Any], names: Iterable[str], where: str) -> dict[str, Any]:
    """The `gateway:` section `section` with each deployment group in `names` added as one
    model group of that name (`gateway_entries`), free unless `section["prices"]` names it.

    A group named like a provider or model group the section already has is refused (the
    message starts with `where`).

    >>> with_groups({"aliases": {"local": "gemma"}}, ["gemma"], "kairos.yaml")["aliases"]
    {'local': 'gemma'}
    """
    providers, models = dict(section.get("providers") or {}), dict(section.get("models") or {})
    prices = section.get("prices") or {}
    for name in names:
        if name in providers or name in models:
            raise GatewayConfigError(
                f"{where}: the gateway already has a provider or model group {name!r}; give "
                "the deployment another name"
            )
        free = {} if name in prices else {"price": {"input": 0, "output": 0}}
        entries = gateway_entries(name, **free)
        providers.update(entries["providers"])
        models.update(entries["models"])
    return {**section, "providers": providers, "models": models}


class DeploymentProvider:
    """Routes each gateway call to one replica of a DeploymentGroup (least outstanding)."""

    kinds = frozenset({"chat", "completion"})

    def __init__(
        self,
        group: DeploymentGroup,
        *,
        name: str | None = None,
        ready: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self.name = name or group.name
        self.group = group
        # awaited before each call: a group started on demand serves once this returns
        self._ready = ready
        self._upstreams: dict[str, OpenAICompatible] = {}  # replica URL -> its client

    def __repr__(self) -> str:
        return f"DeploymentProvider({self.name!r}, {len(self.group.urls)} ready)"

    def _upstream(self, replica: Replica) -> OpenAICompatible:
        client = self._upstreams.get(replica.url)
        if client is None:
            config = ProviderConfig(self.name, "openai", replica.url + "/v1")
            client = self._upstreams[replica.url] = OpenAICompatible(config)
        return client

    def _unavailable(self, error: DeploymentError) -> Exception:
        return UpstreamError(str(error), status=503, retryable=True)

    async def _lease(self) -> tuple[Any, Any]:
        """(the lease, its replica); a group with no replica to give is a retryable 503."""
        try:
            if self._ready is not None:
                await self._ready()
            lease = self.group.lease()
            return lease, await lease.__aenter__()
        except DeploymentError as error:
            raise self._unavailable(error) from None

    async def send(self, kind: str, body: dict[str, Any], timeout: float) -> dict[str, Any]:
        lease, replica = await self._lease()
        try:
            reply: dict[str, Any] = await self._upstream(replica).send(kind, body, timeout)
            return reply
        finally:
            await lease.__aexit__(None, None, None)

    async def stream(self, kind: str, body: dict[str, Any], timeout: float) -> AsyncIterator[Any]:
        # chunks pass through as the gateway's own client yields them (dicts or raw JSON bytes)
        lease, replica = await self._lease()
        try:
            async for chunk in self._upstream(replica).stream(kind, body, timeout):
                yield chunk
        finally:
            await lease.__aexit__(None, None, None)

    def check(self, kind: str, body: dict[str, Any]) -> None:
        """Nothing to translate: replicas serve the OpenAI wire format."""

    async def count_tokens(self, body: dict[str, Any], timeout: float) -> int:
        return tokenizer_count(body)

    async def close(self) -> None:
        for client in self._upstreams.values():
            await client.close()
        self._upstreams.clear()
