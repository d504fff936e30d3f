"""The client: load a project, plan and run queries."""

from kairos.client.client import Client
from kairos.client.project import Project

__all__ = ["Client", "Project"]
