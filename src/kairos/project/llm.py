"""`client.llm`: where the feature graph's LLM calls go — the gateway, in process.

A `kr.completion` feature's request is handed to `Gateway.chat` directly (no HTTP hop when the
gateway is co-located), with the gateway key the project names, so that key's allow-list,
budgets, rate limits, failover and the usage ledger apply to features exactly as to any other
caller. The gateway is built from the project's `gateway:` section on first use, or passed in:

    client = kr.Client("examples/fraud", gateway=my_gateway, llm_key=key)

The project's own gateway also serves its `deployments:` (local replica groups, started when
a call first needs one; `client.llm.deployments.start_all()` starts them all) and, without
`llm.key_env`, calls with the project's `kairos-features` key (kairos.project.gateway).

Token counts use the model's own tokenizer: tiktoken for OpenAI model names, a GGUF file's
vocabulary for a local model named in `llm.tokenizers` (kairos.yaml) or served by one of the
project's llama.cpp deployments, else an estimate. Embeddings from `local/minilm` (the
packaged all-MiniLM-L6-v2) are computed in process.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import weakref
from collections.abc import AsyncIterable, Iterable, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from kairos.errors import KairosError, ProjectError
from kairos.gateway import Gateway, GatewayConfig
from kairos.gateway.keys import KeyRecord
from kairos.llm.embeddings import LOCAL_MINILM, LocalEmbedder
from kairos.llm.tokens import Tokenizer, tokenizer_for
from kairos.project.deployments import (
    PACKAGED_GEMMA,
    LocalDeployments,
    packaged_gemma,
    routes_to,
)
from kairos.project.gateway import (
    FEATURES_KEY,
    current_features_key,
    features_key,
    gateway_config,
    gateway_providers,
    gateway_section,
)
from kairos.resolvers.llm import CompletionResolver, EmbeddingResolver
from kairos.serving.deploy import DeploymentSpec

__all__ = ["PACKAGED_GEMMA", "GatewayCompleter", "NoGateway", "feature_models", "packaged_gemma"]

logger = logging.getLogger(__name__)


class NoGateway(KairosError, LookupError):
    """An LLM feature was asked for, but this client has no gateway or no key to call with."""


def feature_models(resolvers: Iterable[Any]) -> list[str]:
    """The models the LLM features among `resolvers` call through the gateway."""
    models = [
        r.options.model for r in resolvers if isinstance(r, CompletionResolver | EmbeddingResolver)
    ]
    return list(dict.fromkeys(m for m in models if m != LOCAL_MINILM))


class GatewayCompleter:
    """The `Completer` LLM resolvers call: the gateway in process, with one key."""

    def __init__(
        self,
        base_dir: Path | None,
        gateway: Gateway | None = None,
        key: str | None = None,
        tokenizers: Mapping[str, str] | None = None,
        contexts: Mapping[str, int] | None = None,
        *,
        deployments: Mapping[str, DeploymentSpec] | None = None,
        models: Sequence[str] = (),
        budgets: Sequence[Mapping[str, Any]] = (),
    ) -> None:
        self._base_dir = base_dir
        self._gateway = gateway
        self._key = key
        self._tokenizer_files = dict(tokenizers or {})
        self._contexts = dict(contexts or {})
        self._tokenizers: dict[str, Tokenizer] = {}
        self._embedder: LocalEmbedder | None = None
        self._lock = threading.RLock()
        # the project's own gateway (none passed in) serves the project's deployments
        self._own = gateway is None
        self.deployments = LocalDeployments((deployments or {}) if self._own else {}, base_dir)
        self._models = tuple(models)
        self._budgets = tuple(budgets)
        self._config: GatewayConfig | None = None
        self._record: KeyRecord | None = None  # the features' key, when this client issued it
        self._checked = 0.0
        self._provisioning: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Lock]
        self._provisioning = weakref.WeakKeyDictionary()

    def _configured(self) -> GatewayConfig | None:
        """The project's gateway configuration (read once), or None without a section."""
        with self._lock:
            if self._config is None and self._base_dir is not None:
                section = gateway_section(self._base_dir, self.deployments.specs)
                if section is not None:
                    self._config = gateway_config(self._base_dir, section)
            return self._config

    def gateway(self) -> Gateway:
        with self._lock:
            if self._gateway is None:
                config = self._configured()
                if config is None:
                    raise NoGateway(
                        "LLM features need a gateway: pass Client(gateway=...) or give the "
                        "project a `gateway:` section in kairos.yaml"
                    )
                providers = gateway_providers(config, self.deployments)
                self._gateway = Gateway(config, providers=providers)
            return self._gateway

    def configured_gateway(self) -> Gateway | None:
        """The gateway, when one was given or the project's kairos.yaml has a `gateway:`
        section or deployments (the dashboard's Gateway pages), else None; a broken section
        raises."""
        if self._gateway is None and self._configured() is None:
            return None
        return self.gateway()

    def key(self) -> str:
        if not self._key:
            raise NoGateway(
                "LLM features call the gateway with a key: set `llm.key_env` in kairos.yaml to "
                "an environment variable holding one, or pass Client(llm_key=...)"
            )
        return self._key

    async def _spend(self, gateway: Gateway) -> KeyRecord | str:
        """The key calls are made with: the one given, else (the project's own gateway) the
        `kairos-features` record, issued on first use and read again every `key_cache`."""
        if self._key or not self._own:
            return self.key()
        loop = asyncio.get_running_loop()
        lock = self._provisioning.setdefault(loop, asyncio.Lock())
        async with lock:
            now = time.monotonic()
            if self._record is None:
                self._record = await features_key(gateway, self._models, self._budgets)
            elif now - self._checked >= gateway.config.key_cache:
                found = await gateway.registry.get_key(self._record.id)
                if found is None or not found.active(datetime.now(UTC)):
                    # another process of the project may have kept another one
                    found = await current_features_key(gateway)
                if found is None:
                    raise NoGateway(
                        f"the key LLM features spend, {FEATURES_KEY!r} ({self._record.id}), "
                        "was revoked or has expired; restart the client (kairos serve) to "
                        "issue a new one, or set llm.key_env"
                    )
                self._record = found
            else:
                return self._record
            self._checked = now
            return self._record

    async def _deployed(self, gateway: Gateway, model: Any) -> None:
        """Wait for the project's deployments a call for `model` may go to (starting them
        on first use). When something else may serve it too, a failed start is left to the
        gateway's failover."""
        if not self.deployments or not isinstance(model, str):
            return
        names, elsewhere = routes_to(gateway.config, model, self.deployments.specs)
        for name in names:
            try:
                await self.deployments.ready(name)
            except KairosError:
                if not elsewhere:
                    raise

    async def chat(
        self, body: dict[str, Any], served: dict[str, Any] | None = None
    ) -> dict[str, Any] | AsyncIterable[dict[str, Any]]:
        gateway = self.gateway()
        key = await self._spend(gateway)
        await self._deployed(gateway, body.get("model"))
        return await gateway.chat(key, body, served=served)

    async def embed(self, body: dict[str, Any]) -> dict[str, Any]:
        if body.get("model") == LOCAL_MINILM:  # the embedded default: in process, no gateway
            with self._lock:
                if self._embedder is None:
                    self._embedder = LocalEmbedder()
                embedder = self._embedder
            return await asyncio.to_thread(embedder.reply, body)
        gateway = self.gateway()
        key = await self._spend(gateway)
        await self._deployed(gateway, body.get("model"))
        return await gateway.embedding(key, body)

    def _deployment_of(self, model: str) -> str | None:
        """The project's deployment serving `model` first, if any."""
        if not self.deployments:
            return None
        config = self._configured()
        names = routes_to(config, model, self.deployments.specs)[0] if config else []
        return names[0] if names else None

    def tokenizer(self, model: str) -> Tokenizer:
        found = self._tokenizers.get(model)
        if found is None:
            path = self._tokenizer_files.get(model)
            if path is None and (deployed := self._deployment_of(model)) is not None:
                path = self.deployments.vocabulary(deployed)
            if path == PACKAGED_GEMMA:
                path = packaged_gemma()
            elif path is not None and model in self._tokenizer_files:
                given = Path(path).expanduser()
                if self._base_dir is not None and not given.is_absolute():
                    given = self._base_dir / given
                if not given.is_file():
                    raise ProjectError(
                        f"llm.tokenizers.{model}: no GGUF file {str(given)!r}; give the path "
                        f"of the model's GGUF (relative to the project) or {PACKAGED_GEMMA!r}"
                    )
                path = str(given)
            found = tokenizer_for(model, path)
            self._tokenizers[model] = found
        return found

    def warm(self) -> None:
        """Load the tokenizers named in `llm.tokenizers` and those of the project's llama.cpp
        deployments its features call (a GGUF vocabulary takes a moment), so a first
        prompt's context assembly does not include it."""
        for model in self._tokenizer_files:
            try:
                self.tokenizer(model)
            except KairosError as error:  # reported when a feature needs it, as models are
                logger.warning("tokenizer of %r not loaded ahead: %s", model, error)
        for model in self._models:
            deployed = self._deployment_of(model)
            if deployed is not None and self.deployments.vocabulary(deployed) is not None:
                self.tokenizer(model)

    def context(self, model: str, tokenizer: Tokenizer) -> int | None:
        """The context window a prompt must fit: `llm.context` in kairos.yaml, else the
        context the project's deployment serving it was started with, else what the model's
        tokenizer knows."""
        if model in self._contexts:
            return self._contexts[model]
        deployed = self._deployment_of(model)
        if deployed is not None:
            return self.deployments.specs[deployed].ctx
        return tokenizer.context

    async def aclose(self) -> None:
        """Close the gateway (one passed in too: the client is its last user), which flushes
        its ledger, then stop the project's deployments."""
        if self._gateway is not None:
            await self._gateway.close()
        await self.deployments.aclose()
