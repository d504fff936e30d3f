"""The project's own gateway, as a client builds it from kairos.yaml: the `gateway:` section
with every `deployments:` entry registered as a model group of its name (free unless
`gateway.prices` names it), the pepper its keys are hashed with, and the key the project's
LLM features spend.

    gateway:
      aliases: {local/gemma-270m: gemma-270m}   # what features call -> the deployment's group
    deployments:
      gemma-270m: {engine: llamacpp, model: gemma3-270m, replicas: 1, threads: 2, ctx: 4096}
    llm:
      budgets: [{period: day, tokens: 200000}]  # optional: the features' key's budgets

The pepper: `gateway.pepper_env` names it when set. Without it, a gateway whose registry is a
local SQLite file (nothing leaves the machine) gets a random pepper kept in
`.kairos/gateway.pepper`, made once with mode 0600 and refused if others may read it; a
gateway with a shared registry (PostgreSQL) must name `pepper_env`.

The features' key: without `llm.key_env` the client keeps one named key, `kairos-features`,
in the registry: its allow-list is the model groups the project's LLM features call (their
fallbacks too), its budgets `llm.budgets`. Every process of the project (each `kairos serve
--workers` process, a `kairos query`) uses the same record, so budgets count across them and
across restarts; when the allow-list or budgets change, the key is given them in place (its
id, and so what its budget counters hold, stays). Its name is every project's: projects
sharing a registry set `llm.key_env` each. The client calls the gateway in process with
the record itself: its secret is never shown, logged or stored, and a revoke (the
dashboard, `kairos gateway keys revoke`) stops the features within the gateway's
`key_cache`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import secrets
import stat
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from kairos.backends import parse
from kairos.errors import KairosError, ProjectError
from kairos.gateway import Gateway, GatewayConfig
from kairos.gateway.errors import GatewayConfigError, InvalidKeySpec
from kairos.gateway.gateway import provider_for
from kairos.gateway.keys import KeyRecord, key_spec
from kairos.project.deployments import LocalDeployments, parse_deployments
from kairos.serving.deploy import DeploymentSpec
from kairos.serving.group_provider import with_groups

FEATURES_KEY = "kairos-features"  # the name of the key LLM features spend
PEPPER_FILE = Path(".kairos") / "gateway.pepper"


def project_gateway_config(folder: Path) -> GatewayConfig:
    """The gateway configuration of the project in `folder`, as its clients build it (its
    deployments registered, its pepper filled in): what `kairos gateway` commands use.

    >>> project_gateway_config(Path("examples/fraud"))  # doctest: +SKIP
    """
    section = gateway_section(folder, project_deployments(folder))
    if section is None:
        raise GatewayConfigError(
            f"{folder / 'kairos.yaml'}: no `gateway:` section (see kairos.gateway.config)"
        )
    return gateway_config(folder, section)


def project_deployments(folder: Path) -> dict[str, DeploymentSpec]:
    """The `deployments:` of the project in `folder` alone (a gateway process reads no
    other section of the project's)."""
    path = folder / "kairos.yaml"
    raw = yaml.safe_load(path.read_text()) if path.exists() else None
    return parse_deployments(raw.get("deployments") if isinstance(raw, dict) else None, path)


def gateway_providers(config: GatewayConfig, deployments: LocalDeployments) -> dict[str, Any]:
    """The providers of `config`'s gateway: each deployment's group for its own name, the
    configured ones for the rest."""
    providers: dict[str, Any] = {
        name: provider_for(spec)
        for name, spec in config.providers.items()
        if name not in deployments.specs
    }
    providers.update(deployments.providers())
    return providers


def gateway_section(folder: Path, deployments: Iterable[str]) -> dict[str, Any] | None:
    """The `gateway:` section of `folder`'s kairos.yaml with the deployments registered in it
    (a project with deployments and no section gets the defaults), or None without either."""
    names = list(deployments)
    path = folder / "kairos.yaml"
    raw = yaml.safe_load(path.read_text()) if path.exists() else None
    section = raw.get("gateway") if isinstance(raw, dict) else None
    if section is None and not names:
        return None
    if not isinstance(section, dict | None):
        raise ProjectError(f"{path}: `gateway` is a mapping of settings (see kairos.gateway)")
    return with_groups(section or {}, names, f"{path} deployments")


def gateway_config(folder: Path, section: Mapping[str, Any]) -> GatewayConfig:
    """The configuration of the project's own gateway, its pepper filled in (module doc)."""
    config = GatewayConfig.from_mapping(
        section, base_dir=folder, where=f"{folder / 'kairos.yaml'} gateway"
    )
    if config.pepper or section.get("pepper_env") is not None:
        return config
    if not _local_file(config.registry):
        return config  # creating a key then says to set pepper_env
    return dataclasses.replace(config, pepper=local_pepper(folder / PEPPER_FILE))


def ignored(folder: Path) -> None:
    """Keep `folder` (kairos' own files: the query log, the gateway's registry and pepper)
    out of git, with a `.gitignore` of `*` in it unless it has one."""
    folder.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileExistsError), open(folder / ".gitignore", "x") as file:
        file.write("*\n")


def local_pepper(path: Path) -> str:
    """The pepper kept in `path`: read, or made (random, mode 0600) when it is not there yet.
    Several processes starting at once agree: one links its file in place, the others read
    it. The file appears whole (written under a private name, then linked), so no process
    ever reads it half made."""
    ignored(path.parent)  # a secret, beside the registry: never committed
    if not path.exists():
        draft = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
        descriptor = os.open(draft, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            with os.fdopen(descriptor, "w") as file:
                file.write(secrets.token_urlsafe(32))
            with contextlib.suppress(FileExistsError):  # another process linked its own first
                os.link(draft, path)
        finally:
            draft.unlink()
    mode = path.stat().st_mode
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise KairosError(
            f"{path} holds the gateway's pepper but others may read it (mode "
            f"{stat.S_IMODE(mode):o}); run `chmod 600 {path}`"
        )
    pepper = path.read_text().strip()
    if not pepper:
        raise KairosError(f"{path} is empty; delete it and a new pepper is made")
    return pepper


def _local_file(url: str) -> bool:
    return parse(url).family == "sqlite"


def allowed_groups(config: GatewayConfig, models: Iterable[str]) -> list[str]:
    """The model groups calls for `models` may be dispatched to: each one's group and its
    fallbacks (the allow-list is checked on the group that serves). A name the gateway does
    not know stays as it is (its call fails naming it)."""
    found: list[str] = []
    for model in models:
        pending = [config.aliases.get(model, model)]
        while pending:
            group = pending.pop(0)
            if group in found:
                continue
            found.append(group)
            if group in config.models:
                pending += config.models[group].fallbacks
    return sorted(found)


def check_budgets(budgets: Any, where: str) -> tuple[dict[str, Any], ...]:
    """`llm.budgets` as the admin API takes them, checked now (errors name the budget)."""
    if not isinstance(budgets, list):
        raise ProjectError(f"{where} is a list, e.g. [{{period: day, tokens: 200000}}]")
    try:
        key_spec({"name": FEATURES_KEY, "budgets": budgets})
    except InvalidKeySpec as error:
        raise ProjectError(f"{where}: {error}") from None
    return tuple(dict(budget) for budget in budgets)


async def features_key(
    gateway: Gateway, models: Sequence[str], budgets: Sequence[Mapping[str, Any]]
) -> KeyRecord:
    """The `kairos-features` key record for these models and budgets (module doc): the
    oldest active one, given this allow-list and these budgets in place when they differ
    (its id stays, so its counters go on counting), else a new one. Processes that create one
    at once keep the oldest each of them sees and revoke the rest: one that chose a key
    another then revoked moves to the survivor (`current_features_key`)."""
    if not gateway.config.pepper:
        raise KairosError(
            "the project's gateway keeps its keys in a shared registry "
            f"({gateway.config.registry.partition(':')[0]}): set gateway.pepper_env in "
            "kairos.yaml to a variable holding its pepper (or set llm.key_env)"
        )
    body = _key_body(gateway.config, models, budgets)
    for _attempt in range(3):  # a key revoked between the read and the update: read again
        found = await _ours(gateway)
        if not found:
            await gateway.create_key(**body)  # its secret is dropped: calls carry the record
            found = await _ours(gateway)
        chosen = min(found, key=lambda k: (k.created_at, k.id))
        for record in found:
            if record.id != chosen.id:
                await gateway.revoke_key(record.id)
        if _fits(chosen, body):
            return chosen
        updated = await gateway.update_key(
            chosen.id, models=body["models"], budgets=body["budgets"]
        )
        if updated is not None:
            return updated
    raise KairosError(f"the {FEATURES_KEY!r} key kept being revoked while it was issued")


async def current_features_key(gateway: Gateway) -> KeyRecord | None:
    """The active `kairos-features` key, the oldest if several; None when there is none (it
    was revoked: the features stop until a restart issues a new one)."""
    found = await _ours(gateway)
    return min(found, key=lambda k: (k.created_at, k.id)) if found else None


def _key_body(
    config: GatewayConfig, models: Sequence[str], budgets: Sequence[Mapping[str, Any]]
) -> dict[str, Any]:
    return {
        "name": FEATURES_KEY,
        "models": allowed_groups(config, models) or ["*"],
        "budgets": [dict(b) for b in budgets],
    }


def _fits(record: KeyRecord, body: Mapping[str, Any]) -> bool:
    wanted = key_spec(body)
    return (record.models, record.budgets, record.rpm, record.tpm, record.expires_at) == (
        wanted["models"], wanted["budgets"], None, None, None,
    )  # fmt: skip


async def _ours(gateway: Gateway) -> list[KeyRecord]:
    now = datetime.now(UTC)
    return [k for k in await gateway.list_keys() if k.name == FEATURES_KEY and k.active(now)]
