"""Stores behind small Protocols, chosen by URL."""

from kairos.stores.online import MemoryOnlineStore, OnlineStore, StoredValue, online_store_from_url

__all__ = ["MemoryOnlineStore", "OnlineStore", "StoredValue", "online_store_from_url"]
