"""Resolvers: Python functions and SQL files (and, later, models and LLM calls) that produce
features, bound to a project's graph."""

from kairos.resolvers.python import Resolver, offline, online
from kairos.resolvers.registry import BoundResolver, ResolverSet

__all__ = ["BoundResolver", "Resolver", "ResolverSet", "offline", "online"]
