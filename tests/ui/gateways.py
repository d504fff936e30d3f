"""The in-process gateway the dashboard tests put in front of a fake OpenAI-compatible
provider (real HTTP): one model group, priced, with an admin key for the Gateway pages."""

from collections.abc import Mapping
from pathlib import Path

from kairos.gateway import GatewayConfig


def gateway_config(
    upstream: str,
    folder: Path,
    admin: str,
    group: str,
    aliases: Mapping[str, str] | None = None,
) -> GatewayConfig:
    """Model group `group` served by `<group>-1` at the provider `upstream`, USD 3/15 per
    million tokens in/out; keys and ledger in `folder`/gateway.db; admin key `admin`."""
    deployment = f"{group}-1"
    return GatewayConfig.from_mapping(
        {
            "admin_key_env": "ADMIN",
            "pepper_env": "PEPPER",
            "registry": f"sqlite:///{folder / 'gateway.db'}",
            "counters": f"sqlite:///{folder / 'gateway.db'}",
            "providers": {"fake": {"kind": "openai", "base_url": f"{upstream}/v1"}},
            "models": {group: {"deployments": [{"provider": "fake", "model": deployment}]}},
            "aliases": dict(aliases or {}),
            "prices": {deployment: {"input": 3.0, "output": 15.0}},
        },
        base_dir=folder,
        environ={"ADMIN": admin, "PEPPER": "pepper"},
    )
