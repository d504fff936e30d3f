"""Resolvers: Python functions (and, later, SQL, models and LLM calls) that produce features."""

from kairos.resolvers.python import Resolver, offline, online
from kairos.resolvers.registry import BoundResolver, ResolverSet

__all__ = ["BoundResolver", "Resolver", "ResolverSet", "offline", "online"]
