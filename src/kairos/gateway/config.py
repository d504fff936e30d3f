"""The gateway's configuration: providers, model groups and their deployments, prices, the
stores, limits. Read from the `gateway:` section of `kairos.yaml` (or any mapping):

    gateway:
      port: 8100
      admin_key_env: KAIROS_GATEWAY_ADMIN_KEY   # the admin API's key, from the environment
      pepper_env: KAIROS_GATEWAY_PEPPER         # mixed into every stored key hash
      registry: sqlite:///.kairos/gateway.db    # keys and ledger; or postgresql://...
      counters: sqlite:///.kairos/gateway.db    # budgets and rate limits; or postgresql://, redis://
      providers:
        openai: {kind: openai, base_url: "https://api.openai.com/v1", api_key_env: OPENAI_API_KEY}
        claude: {kind: anthropic, base_url: "https://api.anthropic.com",
                 api_key_env: ANTHROPIC_API_KEY}
        # an OpenAI-compatible server that predates max_completion_tokens (old vLLM, llama.cpp)
        local: {kind: openai, base_url: "http://127.0.0.1:8000/v1", token_field: max_tokens}
      models:
        chat:
          strategy: priority            # priority | weighted | least-busy | lowest-latency
          deployments:
            - {provider: openai, model: gpt-4o-mini}
            - {provider: claude, model: claude-haiku-4-5, priority: 1}
          fallbacks: [big]
      aliases: {fast: chat}
      prices: {my-model: {input: 0.10, output: 0.40}}   # USD per million tokens

Credentials are only ever named here (`api_key_env`); their values are read from the
environment when the configuration is built and kept out of every repr. A provider whose
variable is unset fails when it is built (serving, calling), not when the configuration is
read: `kairos gateway keys` and `usage` need no provider credentials.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from kairos.definitions.durations import parse_duration
from kairos.gateway.accounting.prices import Price, PriceTable, parse_price, shipped_prices
from kairos.gateway.bounds import MAX_TOKENS
from kairos.gateway.errors import GatewayConfigError

STRATEGIES = ("priority", "weighted", "least-busy", "lowest-latency")
PROVIDER_KINDS = ("openai", "anthropic")
# the fields a provider kind may take its output limit in; the first is the default
TOKEN_FIELDS = {"openai": ("max_completion_tokens", "max_tokens"), "anthropic": ("max_tokens",)}
_TOP = {
    "host", "port", "admin_key_env", "pepper_env", "registry", "counters", "providers",
    "models", "aliases", "prices", "retries", "breaker", "lease", "stream_drain",
    "key_cache", "default_max_tokens", "budget_shares", "body_timeout",
}  # fmt: skip


@dataclass(frozen=True)
class ProviderConfig:
    name: str
    kind: str
    base_url: str
    api_key: str = field(default="", repr=False)  # the secret's value, never shown
    headers: Mapping[str, str] = field(default_factory=dict, repr=False)
    # the field a capped chat call's output limit is sent in (openai kind: max_tokens for
    # servers that predate max_completion_tokens, e.g. old vLLM or llama.cpp)
    token_field: str = "max_completion_tokens"
    # `api_key_env` named a variable that is not set: building the provider fails, while
    # commands that call no provider (keys, usage) still load the configuration
    unset_key_env: str = ""


@dataclass(frozen=True)
class Deployment:
    """One place a model group can be served: a provider and the model name it knows."""

    group: str
    provider: str
    model: str
    priority: int = 0
    weight: float = 1.0
    timeout: float = 60.0  # seconds each wait for the provider may take (head, each chunk)
    # seconds one attempt may take in all, a whole stream included; below the lease, so a
    # hold outlives its call
    deadline: float = 300.0
    price: Price | None = None

    @property
    def id(self) -> str:
        return f"{self.group}/{self.provider}/{self.model}"


@dataclass(frozen=True)
class ModelGroup:
    name: str
    deployments: tuple[Deployment, ...]
    strategy: str = "priority"
    fallbacks: tuple[str, ...] = ()


@dataclass(frozen=True)
class BreakerConfig:
    failures: int = 5  # consecutive failures that open the circuit
    cooldown: float = 30.0  # seconds before a half-open probe


@dataclass(frozen=True)
class GatewayConfig:
    """Everything a gateway needs; build it with `GatewayConfig.from_mapping` or `load`."""

    providers: Mapping[str, ProviderConfig] = field(default_factory=dict)
    models: Mapping[str, ModelGroup] = field(default_factory=dict)
    aliases: Mapping[str, str] = field(default_factory=dict)
    prices: PriceTable = field(default_factory=lambda: PriceTable("none", {}))
    registry: str = "sqlite:///.kairos/gateway.db"
    counters: str = "sqlite:///.kairos/gateway.db"
    host: str = "127.0.0.1"
    port: int = 8100
    admin_key: str = field(default="", repr=False)
    pepper: str = field(default="", repr=False)
    retries: int = 2  # further deployments tried after the first
    breaker: BreakerConfig = field(default_factory=BreakerConfig)
    lease: float = 600.0  # seconds a hold may stay open before it is charged in full
    stream_drain: float = 60.0  # seconds upstream is read on after a client disconnects
    key_cache: float = 1.0  # seconds a key's record is reused before it is read again
    body_timeout: float = 30.0  # seconds a request body may take to arrive (then 408, close)
    # calls' worst cases a process reserves at once per key (accounting/shares.py); 0: none
    budget_shares: int = 16
    # the output held as a call's worst case when it names no limit. Sent upstream (in the
    # provider's token_field) only when the key has budgets or tpm, which need a cap; a key
    # without them sends the client's fields as they came and settles to the usage reported
    default_max_tokens: int = 4096

    @classmethod
    def load(cls, folder: Path | str) -> GatewayConfig:
        """Read the `gateway:` section of `kairos.yaml` in `folder`."""
        base = Path(folder)
        path = base / "kairos.yaml"
        if not path.exists():
            raise GatewayConfigError(f"{path} does not exist; add a `gateway:` section there")
        try:
            raw = yaml.safe_load(path.read_text()) or {}
        except yaml.YAMLError as error:
            raise GatewayConfigError(f"{path}: not valid YAML ({error})") from None
        section = raw.get("gateway") if isinstance(raw, dict) else None
        if not isinstance(section, dict):
            raise GatewayConfigError(f"{path}: no `gateway:` section (see kairos.gateway.config)")
        return cls.from_mapping(section, base_dir=base, where=f"{path} gateway")

    @classmethod
    def from_mapping(
        cls,
        raw: Mapping[str, Any],
        *,
        base_dir: Path | str | None = None,
        environ: Mapping[str, str] | None = None,
        where: str = "gateway",
    ) -> GatewayConfig:
        """Build from a mapping shaped like the YAML section; secrets come from `environ`."""
        env = os.environ if environ is None else environ
        unknown = set(raw) - _TOP
        if unknown:
            raise GatewayConfigError(
                f"{where}: unknown setting(s) {', '.join(sorted(unknown))}; known: "
                + ", ".join(sorted(_TOP))
            )
        base = Path(base_dir) if base_dir is not None else Path.cwd()
        providers = {
            name: _provider(name, spec, env, f"{where}.providers.{name}")
            for name, spec in _mapping(raw.get("providers"), f"{where}.providers").items()
        }
        models = {
            name: _group(name, spec, providers, f"{where}.models.{name}")
            for name, spec in _mapping(raw.get("models"), f"{where}.models").items()
        }
        for group in models.values():
            for fallback in group.fallbacks:
                if fallback not in models:
                    raise GatewayConfigError(
                        f"{where}.models.{group.name}.fallbacks: no model group {fallback!r}"
                    )
        aliases = {str(k): str(v) for k, v in _mapping(raw.get("aliases"), where).items()}
        for alias, target in aliases.items():
            if target not in models:
                raise GatewayConfigError(f"{where}.aliases.{alias}: no model group {target!r}")
        overrides = {
            name: parse_price(spec, f"{where}.prices.{name}")
            for name, spec in _mapping(raw.get("prices"), f"{where}.prices").items()
        }
        breaker = _mapping(raw.get("breaker"), f"{where}.breaker")
        lease = _seconds(raw.get("lease", "10m"), f"{where}.lease")
        stream_drain = _seconds(raw.get("stream_drain", "60s"), f"{where}.stream_drain")
        _within_lease(lease, stream_drain, models, where)
        return cls(
            providers=providers,
            models=models,
            aliases=aliases,
            prices=shipped_prices().overridden(overrides),
            registry=_store_url(raw.get("registry", "sqlite:///.kairos/gateway.db"), base),
            counters=_store_url(raw.get("counters", "sqlite:///.kairos/gateway.db"), base),
            host=str(raw.get("host", "127.0.0.1")),
            port=_int(raw.get("port", 8100), f"{where}.port", 1),
            admin_key=_secret(raw.get("admin_key_env"), env, f"{where}.admin_key_env"),
            pepper=_secret(raw.get("pepper_env"), env, f"{where}.pepper_env"),
            retries=_int(raw.get("retries", 2), f"{where}.retries", 0),
            breaker=BreakerConfig(
                failures=_int(breaker.get("failures", 5), f"{where}.breaker.failures", 1),
                cooldown=_seconds(breaker.get("cooldown", "30s"), f"{where}.breaker.cooldown"),
            ),
            lease=lease,
            stream_drain=stream_drain,
            key_cache=_seconds(raw.get("key_cache", "1s"), f"{where}.key_cache"),
            body_timeout=_seconds(raw.get("body_timeout", "30s"), f"{where}.body_timeout"),
            budget_shares=_int(raw.get("budget_shares", 16), f"{where}.budget_shares", 0),
            default_max_tokens=_int(
                raw.get("default_max_tokens", 4096), f"{where}.default_max_tokens", 1, MAX_TOKENS
            ),
        )


def _within_lease(
    lease: float, stream_drain: float, models: Mapping[str, ModelGroup], where: str
) -> None:
    """Refuse an attempt that may outlive its hold's lease: settled after it, the call would
    stay charged in full."""
    if stream_drain >= lease:
        raise GatewayConfigError(
            f"{where}.stream_drain ({stream_drain:g}s) must be below {where}.lease "
            f"({lease:g}s): a hold must outlive the stream it pays for; lower stream_drain "
            "or raise lease"
        )
    for group in models.values():
        for index, deployment in enumerate(group.deployments):
            if deployment.deadline >= lease:
                raise GatewayConfigError(
                    f"{where}.models.{group.name}.deployments[{index}].deadline "
                    f"({deployment.deadline:g}s) must be below {where}.lease ({lease:g}s): a "
                    "hold must outlive the attempt it pays for; lower the deadline or raise "
                    "lease"
                )


def _mapping(value: Any, where: str) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise GatewayConfigError(f"{where} must be a mapping of names to settings")
    return value


def _int(value: Any, where: str, minimum: int, maximum: int | None = None) -> int:
    if (
        not isinstance(value, int) or isinstance(value, bool) or value < minimum
        or (maximum is not None and value > maximum)
    ):  # fmt: skip
        within = f"from {minimum} to {maximum}" if maximum is not None else f">= {minimum}"
        raise GatewayConfigError(f"{where} must be an integer {within}, got {value!r}")
    return value


def _seconds(value: Any, where: str) -> float:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    return parse_duration(value, field=where).total_seconds()


def _secret(name: Any, env: Mapping[str, str], where: str) -> str:
    if name is None:
        return ""
    if not isinstance(name, str) or not name:
        raise GatewayConfigError(f"{where} names an environment variable, e.g. OPENAI_API_KEY")
    if name not in env:
        raise GatewayConfigError(f"{where}: the environment variable {name} is not set")
    return env[name]


def _store_url(value: Any, base: Path) -> str:
    if not isinstance(value, str):
        raise GatewayConfigError(f"gateway store URLs are strings, got {value!r}")
    rest = value.removeprefix("sqlite:///")
    if value.startswith("sqlite:///") and not rest.startswith("/") and rest != ":memory:":
        return f"sqlite:///{base / rest}"  # relative to the project folder
    return value


def _provider(name: str, spec: Any, env: Mapping[str, str], where: str) -> ProviderConfig:
    spec = _mapping(spec, where)
    unknown = set(spec) - {"kind", "base_url", "api_key_env", "headers", "token_field"}
    if unknown:
        raise GatewayConfigError(
            f"{where}: unknown setting(s) {', '.join(sorted(unknown))}; "
            "use kind, base_url, api_key_env, headers, token_field"
        )
    kind = spec.get("kind", "openai")
    if kind not in PROVIDER_KINDS:
        raise GatewayConfigError(f"{where}.kind must be one of {PROVIDER_KINDS}, got {kind!r}")
    base_url = spec.get("base_url")
    if not isinstance(base_url, str) or not base_url.startswith(("http://", "https://")):
        raise GatewayConfigError(f"{where}.base_url must be an http(s) URL, got {base_url!r}")
    headers = {str(k): str(v) for k, v in _mapping(spec.get("headers"), where).items()}
    fields = TOKEN_FIELDS[kind]
    token_field = spec.get("token_field", fields[0])
    if token_field not in fields:
        raise GatewayConfigError(
            f"{where}.token_field must be one of {fields} for a {kind} provider, "
            f"got {token_field!r}"
        )
    key_env = spec.get("api_key_env")
    unset = key_env if isinstance(key_env, str) and key_env and key_env not in env else ""
    return ProviderConfig(
        name,
        kind,
        base_url.rstrip("/"),
        "" if unset else _secret(key_env, env, f"{where}.api_key_env"),
        headers,
        token_field,
        unset,
    )


def _group(name: str, spec: Any, providers: Mapping[str, ProviderConfig], where: str) -> ModelGroup:
    spec = _mapping(spec, where)
    strategy = spec.get("strategy", "priority")
    if strategy not in STRATEGIES:
        raise GatewayConfigError(f"{where}.strategy must be one of {STRATEGIES}, got {strategy!r}")
    raw_deployments = spec.get("deployments")
    if not isinstance(raw_deployments, list) or not raw_deployments:
        raise GatewayConfigError(
            f"{where}.deployments lists at least one {{provider: NAME, model: MODEL}}"
        )
    deployments = []
    for index, item in enumerate(raw_deployments):
        at = f"{where}.deployments[{index}]"
        item = _mapping(item, at)
        provider = item.get("provider")
        if provider not in providers:
            raise GatewayConfigError(
                f"{at}.provider: no provider {provider!r}; known: {', '.join(sorted(providers))}"
            )
        model = item.get("model", name)
        weight = item.get("weight", 1.0)
        if not isinstance(weight, int | float) or isinstance(weight, bool) or weight <= 0:
            raise GatewayConfigError(f"{at}.weight must be a positive number, got {weight!r}")
        deployments.append(
            Deployment(
                group=name,
                provider=str(provider),
                model=str(model),
                priority=_int(item.get("priority", 0), f"{at}.priority", -(1 << 30)),
                weight=float(weight),
                timeout=_seconds(item.get("timeout", "60s"), f"{at}.timeout"),
                deadline=_seconds(item.get("deadline", "5m"), f"{at}.deadline"),
                price=parse_price(item["price"], f"{at}.price") if "price" in item else None,
            )
        )
    fallbacks = spec.get("fallbacks", [])
    if not isinstance(fallbacks, list) or not all(isinstance(f, str) for f in fallbacks):
        raise GatewayConfigError(f"{where}.fallbacks lists model group names")
    return ModelGroup(name, tuple(deployments), strategy, tuple(fallbacks))
