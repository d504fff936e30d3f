"""The client faces: the embedded `Client` and `RemoteClient`, the same calls over HTTP."""

from kairos.client.client import Client
from kairos.client.remote import RemoteClient

__all__ = ["Client", "RemoteClient"]
