"""The client faces: the embedded `Client` and `RemoteClient`, the same calls over HTTP."""

from kairos.client.client import Client
from kairos.client.connect import connect
from kairos.client.protocol import KairosClient
from kairos.client.remote import RemoteClient

__all__ = ["Client", "KairosClient", "RemoteClient", "connect"]
