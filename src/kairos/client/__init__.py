"""The client: load a project, plan and run queries."""

from kairos.client.client import Client
from kairos.client.project import Project
from kairos.client.remote import RemoteClient

__all__ = ["Client", "Project", "RemoteClient"]
