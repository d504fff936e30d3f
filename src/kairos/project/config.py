"""Project configuration: `kairos.yaml` next to the project's modules.

    sources:
      bank: sqlite:///data/fraud.db
      warehouse: postgresql://kairos:${PG_PASSWORD}@db:5432/bank
    online_store: redis://127.0.0.1:6379/0     # default memory://
    query_log: sqlite:///.kairos/query_log.db   # default for a project folder; or
    # query_log: {url: postgresql://..., durability: acknowledged}   # _query_log below
    vectors: .kairos/vectors                    # kr.nearest indexes; or postgresql://...
    resolver_timeout: 5s
    server:
      host: 127.0.0.1
      port: 8000
      keys: ["${KAIROS_API_KEY}"]              # bearer tokens; none = localhost only
    logging:                                    # how `kairos serve` logs, to stderr
      level: info
      format: text                              # or json: one object a line
    deployments:                                # local LLM replicas the gateway serves
      gemma-270m: {engine: llamacpp, model: gemma3-270m, threads: 2, ctx: 4096}
    gateway: {aliases: {local/gemma-270m: gemma-270m}}   # kairos.gateway.config
    llm: {budgets: [{period: day, tokens: 200000}]}      # LLMConfig below

`${VAR}` is read from the environment when the project loads; secrets are never logged.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import yaml

from kairos.definitions.durations import parse_duration
from kairos.errors import KairosError, ProjectError
from kairos.project.deployments import parse_deployments
from kairos.project.gateway import check_budgets
from kairos.serving.deploy import DeploymentSpec
from kairos.sources.streams.base import StreamSpec
from kairos.stores.query_log import DURABILITY

CONFIG_FILE = "kairos.yaml"
_VARIABLE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
_KEYS = {
    "sources",
    "online_store",
    "offline_store",
    "query_log",
    "resolver_timeout",
    "server",
    "models",
    "llm",
    "streams",
    "vectors",
    "gateway",  # read by kairos.gateway.GatewayConfig
    "deployments",  # local replica groups the gateway serves (kairos.project.deployments)
    "logging",
}
_MODELS_KEYS = {"registry", "volume", "max_batch", "max_wait", "threads", "refresh"}
_SERVER_KEYS = {"host", "port", "keys"}
_LOGGING_KEYS = ("level", "format", "access", "levels")
LOG_LEVELS = ("debug", "info", "warning", "error", "critical")
LOG_FORMATS = ("text", "json")


def interpolate(text: str, where: str) -> str:
    """Replace `${VAR}` with the environment variable's value."""

    def value(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in os.environ:
            raise KairosError(f"{where} uses ${{{name}}}, which is not set in the environment")
        return os.environ[name]

    return _VARIABLE.sub(value, text)


@dataclass(frozen=True)
class ServerConfig:
    """Where `kairos serve` listens and the bearer keys its API and dashboard take (none:
    this machine's requests only). An empty or blank key is refused: it would look like
    keys are set (the API answering 401 to everyone) while matching no request."""

    host: str = "127.0.0.1"
    port: int = 8000
    keys: tuple[str, ...] = field(default=(), repr=False)  # secrets: kept out of repr

    def __post_init__(self) -> None:
        problem = key_problem(self.keys)
        if problem is not None:
            raise ProjectError(f"`server.keys` {problem}")


def key_problem(keys: tuple[str, ...]) -> str | None:
    """What is wrong with a list of bearer keys (never showing one), or None.

    >>> key_problem(("k1",)), key_problem(("k1", " "))[:25]
    (None, 'entry 2 is empty or blank')
    """
    for index, key in enumerate(keys, 1):
        if not key.strip():
            return (
                f"entry {index} is empty or blank; set the variable it names to a key (e.g. "
                "`export KAIROS_API_KEY=$(openssl rand -hex 32)`) or remove the entry to "
                "serve without keys, on localhost only"
            )
        if key != key.strip():  # a bearer token is read stripped: it could never match
            return f"entry {index} has spaces around it; remove them"
    return None


@dataclass(frozen=True)
class LoggingConfig:
    """How `kairos serve` and `kairos gateway serve` log: to stderr, uvicorn's loggers too.

    logging:
      level: info                 # debug | info | warning | error | critical
      format: text                # text | json (one object a line)
      access: true                # one line per request (logger kairos.access)
      levels:                     # a logger's own level
        kairos.gateway: debug
    """

    level: str = "info"
    format: str = "text"
    access: bool = True
    levels: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def load(cls, folder: Path | str) -> LoggingConfig:
        """The `logging:` section of `kairos.yaml` in `folder` alone (the gateway's
        process reads no other section of the project's)."""
        path = Path(folder) / CONFIG_FILE
        try:
            raw = yaml.safe_load(path.read_text()) if path.exists() else None
        except yaml.YAMLError as error:
            raise ProjectError(f"{path}: not valid YAML ({error}); fix the file") from None
        section = raw.get("logging") if isinstance(raw, dict) else None
        return _logging(section, path)


@dataclass(frozen=True)
class ModelsConfig:
    """Where models are recorded and stored, and how predictors batch.

    models:
      registry: sqlite:///.kairos/models.db    # default; or postgresql://...
      volume: .kairos/models                   # default; or any fsspec URL (s3://bucket/m)
      max_batch: 1024                          # rows per model call
      max_wait: 0ms                            # hold a batch open this long for more requests
      threads: 1                               # OpenMP threads per model call (null: all)
      refresh: 5s                              # how often aliases moved elsewhere are noticed
    """

    registry: str | None = None  # None: <project>/.kairos/models.db
    volume: str | None = None  # None: <project>/.kairos/models
    max_batch: int = 1024
    max_wait: timedelta = timedelta(0)
    threads: int | None = 1  # a predictor's OpenMP threads; None: the process default
    refresh: timedelta = timedelta(seconds=5)


@dataclass(frozen=True)
class LLMConfig:
    """How the feature graph's LLM features call the gateway.

    llm:
      key_env: KAIROS_LLM_KEY            # environment variable holding the gateway key to spend
      tokenizers:                        # model -> GGUF file whose vocabulary counts its tokens
        local/gemma-270m: gemma3-270m    # the packaged Gemma 3 270M
      context:                           # model -> context window its deployment serves
        local/gemma-270m: 2048
      budgets: [{period: day, tokens: 200000}]   # the features' own key's (no key_env)

    A model served by one of the project's `deployments:` needs neither tokenizers nor
    context: its GGUF vocabulary and its ctx are used.
    """

    key: str | None = field(default=None, repr=False)  # a secret: kept out of repr
    tokenizers: Mapping[str, str] = field(default_factory=dict)
    context: Mapping[str, int] = field(default_factory=dict)
    budgets: tuple[Mapping[str, Any], ...] = ()


@dataclass(frozen=True)
class Config:
    """Everything a client and server need besides the definitions themselves."""

    base_dir: Path | None = None
    sources: Mapping[str, Any] = field(default_factory=dict)  # name -> URL or mapping
    online_store: str = "memory://"
    offline_store: str = "none://"
    query_log: str = "none://"
    query_log_durability: str = "batched"  # `query_log: {durability: ...}`, one of DURABILITY
    resolver_timeout: timedelta = timedelta(seconds=10)
    server: ServerConfig = field(default_factory=ServerConfig)
    models: ModelsConfig = field(default_factory=ModelsConfig)
    llm: LLMConfig = field(default_factory=LLMConfig)
    streams: Mapping[str, Any] = field(default_factory=dict)  # name -> a streams: entry
    vectors: str | None = None  # kr.nearest indexes: a folder or postgresql://; None: .kairos/
    deployments: Mapping[str, DeploymentSpec] = field(default_factory=dict)
    logging: LoggingConfig = field(default_factory=LoggingConfig)

    @classmethod
    def load(cls, folder: Path) -> Config:
        """Read `kairos.yaml` in `folder`; a folder without one gets embedded defaults."""
        path = folder / CONFIG_FILE
        defaults = cls(
            base_dir=folder,
            query_log=f"sqlite:///{folder / '.kairos' / 'query_log.db'}",
            offline_store=f"duckdb:///{folder / '.kairos' / 'offline.duckdb'}",
            vectors=str(folder / ".kairos" / "vectors"),
        )
        if not path.exists():
            return defaults
        try:
            raw = yaml.safe_load(path.read_text()) or {}
        except yaml.YAMLError as error:
            mark = getattr(error, "problem_mark", None)
            line = f":{mark.line + 1}" if mark is not None else ""
            raise ProjectError(f"{path}{line}: not valid YAML ({error}); fix the file") from None
        if not isinstance(raw, dict):
            raise ProjectError(f"{path}: expected a mapping of settings at the top level")
        unknown = set(raw) - _KEYS
        if unknown:
            raise ProjectError(
                f"{path}: unknown setting(s) {', '.join(sorted(unknown))}; known: "
                + ", ".join(sorted(_KEYS))
            )
        sources = raw.get("sources") or {}
        if not isinstance(sources, dict):
            raise ProjectError(f"{path}: `sources` maps names to URLs, e.g. bank: sqlite:///x.db")
        server = raw.get("server") or {}
        if not isinstance(server, dict) or set(server) - _SERVER_KEYS:
            raise ProjectError(f"{path}: `server` takes {', '.join(sorted(_SERVER_KEYS))}")
        port = server.get("port", 8000)
        if not isinstance(port, int) or isinstance(port, bool) or not 0 < port < 65536:
            raise ProjectError(f"{path}: `server.port` is a port number, got {port!r}")
        keys = server.get("keys") or []
        if not isinstance(keys, list) or not all(isinstance(k, str) for k in keys):
            raise ProjectError(f"{path}: `server.keys` is a list of strings")
        keys = [interpolate(k, f"{path} server.keys") for k in keys]
        problem = key_problem(tuple(keys))
        if problem is not None:  # e.g. "${KAIROS_API_KEY}" with the variable set but empty
            raise ProjectError(f"{path}: `server.keys` {problem}")
        return cls(
            base_dir=folder,
            sources=dict(sources),
            online_store=_url(raw.get("online_store", defaults.online_store), folder, path),
            offline_store=_url(raw.get("offline_store", defaults.offline_store), folder, path),
            query_log=_url(_query_log(raw, "url", defaults.query_log, path), folder, path),
            query_log_durability=_query_log(raw, "durability", "batched", path),
            resolver_timeout=parse_duration(
                raw.get("resolver_timeout", "10s"), field=f"{path} resolver_timeout"
            ),
            server=ServerConfig(
                host=str(server.get("host", "127.0.0.1")),
                port=port,
                keys=tuple(keys),
            ),
            models=_models(raw.get("models") or {}, folder, path),
            llm=_llm(raw.get("llm") or {}, path),
            streams=_streams(raw.get("streams") or {}, path),
            vectors=_vectors(raw.get("vectors", defaults.vectors), folder, path),
            deployments=parse_deployments(raw.get("deployments"), path),
            logging=_logging(raw.get("logging"), path),
        )


def _logging(raw: Any, path: Path) -> LoggingConfig:
    """The `logging:` section; a bad value names its field and the values allowed."""
    if raw is None:
        return LoggingConfig()
    if not isinstance(raw, dict) or set(raw) - set(_LOGGING_KEYS):
        raise ProjectError(f"{path}: `logging` takes {', '.join(_LOGGING_KEYS)}")
    level = _log_level(raw.get("level", "info"), "logging.level", path)
    form = raw.get("format", "text")
    if form not in LOG_FORMATS:
        raise ProjectError(
            f"{path}: `logging.format` is one of {', '.join(LOG_FORMATS)}, got {form!r}"
        )
    access = raw.get("access", True)
    if not isinstance(access, bool):
        raise ProjectError(f"{path}: `logging.access` is true or false, got {access!r}")
    levels = raw.get("levels") or {}
    if not isinstance(levels, dict):
        raise ProjectError(
            f"{path}: `logging.levels` maps logger names to levels, e.g. kairos.gateway: debug"
        )
    return LoggingConfig(
        level=level,
        format=form,
        access=access,
        levels={
            str(name): _log_level(value, f"logging.levels.{name}", path)
            for name, value in levels.items()
        },
    )


def _log_level(value: Any, name: str, path: Path) -> str:
    text = value.lower() if isinstance(value, str) else value
    if text not in LOG_LEVELS:
        raise ProjectError(f"{path}: `{name}` is one of {', '.join(LOG_LEVELS)}, got {value!r}")
    return str(text)


def _vectors(value: Any, folder: Path, path: Path) -> str:
    """The `vectors:` URL: a postgresql:// URL, or a folder (relative to the project)."""
    if not isinstance(value, str) or not value:
        raise ProjectError(
            f"{path}: `vectors` is a folder (e.g. .kairos/vectors) or a postgresql:// URL, "
            f"got {value!r}"
        )
    text = interpolate(value, f"{path} vectors")
    if "://" in text or Path(text).is_absolute():
        return text
    return str(folder / text)


def _streams(raw: Any, path: Path) -> dict[str, Any]:
    """`streams:` entries, checked now so a typo fails at load, with `${VAR}` read in every
    text setting (a URL's password, a consumer name that differs per process)."""
    if not isinstance(raw, dict):
        raise ProjectError(f"{path}: `streams` maps names to stream settings (kind, url, ...)")
    streams = {}
    for name, entry in raw.items():
        if isinstance(entry, dict):
            entry = {
                key: interpolate(value, f"{path} streams.{name}.{key}")
                if isinstance(value, str)
                else value
                for key, value in entry.items()
            }
        StreamSpec.parse(str(name), entry, str(path))
        streams[str(name)] = entry
    return streams


def _llm(raw: Any, path: Path) -> LLMConfig:
    if not isinstance(raw, dict) or set(raw) - {"key_env", "tokenizers", "context", "budgets"}:
        raise ProjectError(f"{path}: `llm` takes key_env, tokenizers, context and budgets")
    context = raw.get("context") or {}
    if not isinstance(context, dict) or not all(
        isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool) and v > 0
        for k, v in context.items()
    ):
        raise ProjectError(f"{path}: `llm.context` maps model names to token counts, e.g. 2048")
    tokenizers = raw.get("tokenizers") or {}
    if not isinstance(tokenizers, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in tokenizers.items()
    ):
        raise ProjectError(f"{path}: `llm.tokenizers` maps model names to GGUF file paths")
    key_env = raw.get("key_env")
    if key_env is not None and (not isinstance(key_env, str) or not key_env):
        raise ProjectError(f"{path}: `llm.key_env` names an environment variable")
    key = None
    if key_env is not None:
        if key_env not in os.environ:
            raise KairosError(f"{path}: llm.key_env names {key_env}, which is not set")
        key = os.environ[key_env]
    budgets = check_budgets(raw.get("budgets", []), f"{path}: llm.budgets")
    return LLMConfig(key=key, tokenizers=dict(tokenizers), context=dict(context), budgets=budgets)


def _models(raw: Any, folder: Path, path: Path) -> ModelsConfig:
    if not isinstance(raw, dict) or set(raw) - _MODELS_KEYS:
        raise ProjectError(f"{path}: `models` takes {', '.join(sorted(_MODELS_KEYS))}")
    batch = raw.get("max_batch", 1024)
    if not isinstance(batch, int) or isinstance(batch, bool) or batch < 1:
        raise ProjectError(f"{path}: `models.max_batch` is a number of rows >= 1, got {batch!r}")
    threads = raw.get("threads", 1)
    if threads is not None and (
        not isinstance(threads, int) or isinstance(threads, bool) or threads < 1
    ):
        raise ProjectError(
            f"{path}: `models.threads` is a number of threads >= 1, or null for the process "
            f"default, got {threads!r}"
        )
    volume = raw.get("volume")
    if volume is not None:
        text = interpolate(str(volume), f"{path} models.volume")
        volume = text if "://" in text or Path(text).is_absolute() else str(folder / text)
    registry = raw.get("registry")
    return ModelsConfig(
        registry=None if registry is None else _url(registry, folder, path),
        volume=volume,
        max_batch=batch,
        max_wait=parse_duration(raw.get("max_wait", 0), field=f"{path} models.max_wait"),
        threads=threads,
        refresh=parse_duration(raw.get("refresh", "5s"), field=f"{path} models.refresh"),
    )


def _query_log(raw: dict[str, Any], key: str, default: str, path: Path) -> Any:
    """A setting of `query_log:`, which is a URL or `{url: ..., durability: ...}`.
    `durability: batched` (default) answers a query at once and commits its record within
    ~50 ms (what a `kill -9` can lose); `acknowledged` answers once it is committed."""
    section = raw.get("query_log")
    if not isinstance(section, dict):
        return section if key == "url" and section is not None else default
    unknown = sorted(set(section) - {"url", "durability"})
    if unknown:
        raise ProjectError(f"{path}: `query_log` takes url and durability, not {unknown[0]!r}")
    value = section.get(key, default)
    if key == "durability" and value not in DURABILITY:
        raise ProjectError(
            f"{path}: `query_log.durability` is one of {', '.join(DURABILITY)}, got {value!r}"
        )
    return value


def _url(value: Any, folder: Path, path: Path) -> str:
    if not isinstance(value, str):
        raise ProjectError(f"{path}: store URLs are strings, got {value!r}")
    text = interpolate(value, str(path))
    # sqlite:///relative/path is relative to the project folder, not the working directory
    for scheme in ("sqlite:///", "duckdb:///"):
        rest = text[len(scheme) :]
        if text.startswith(scheme) and not rest.startswith("/") and rest != ":memory:":
            text = f"{scheme}{folder / rest}"
    return text
