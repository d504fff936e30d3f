"""Vector indexes behind one Protocol: an embedded index file by default, pgvector in production."""

from kairos.stores.vectors.base import Condition, Document, Hit, VectorIndex

__all__ = ["Condition", "Document", "Hit", "VectorIndex"]
