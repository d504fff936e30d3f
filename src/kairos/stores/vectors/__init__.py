"""Vector indexes behind one Protocol: an embedded index file by default, pgvector in production.

`open_vector_index(url, name, dimensions)` picks the backend from the URL:

- a folder path (`.kairos/vectors`) or `file://` + path (`file:///srv/vectors` is absolute):
  the embedded index (embedded.py), kept in `<folder>/<name>/`;
- `postgresql://...` (or `postgres://`): pgvector (pgvector.py), table `<name>`; kairos'
  options `?m=16&ef_construction=200&ef_search=100` set its HNSW graph (the rest go to libpq).

>>> index = open_vector_index(".kairos/vectors", "docs", dimensions=384)
>>> index = open_vector_index("postgresql://app@db/bank", "docs", dimensions=384)
"""

from __future__ import annotations

from kairos.backends import URL, connect, parse, redact
from kairos.errors import KairosError
from kairos.stores.vectors.base import OPERATORS, Condition, Document, Hit, VectorIndex
from kairos.stores.vectors.embedded import EmbeddedVectorIndex
from kairos.stores.vectors.pgvector import PgVectorIndex

__all__ = [
    "OPERATORS",
    "Condition",
    "Document",
    "EmbeddedVectorIndex",
    "Hit",
    "PgVectorIndex",
    "VectorIndex",
    "open_vector_index",
]


def open_vector_index(url: str, name: str, dimensions: int) -> VectorIndex:
    """The index `name` of `dimensions`-long vectors where `url` points (see the module doc).
    The embedded index loads its folder now; pgvector connects on its first call."""
    if not isinstance(url, str) or not url:
        raise KairosError(
            f"vector index URL {url!r} is empty; pass a folder (e.g. '.kairos/vectors') or "
            "'postgresql://user@host/db'"
        )
    parsed = parse(url)
    if not parsed.scheme or (len(parsed.scheme) == 1 and not parsed.authority):
        return EmbeddedVectorIndex(url, name, dimensions)  # a path (a drive letter too)

    def file(parsed: URL) -> VectorIndex:
        if not parsed.authority or not parsed.rest:
            raise KairosError(
                f"vector index URL {redact(url)!r} names no folder; use "
                "file:///absolute/folder, file://relative/folder or a plain folder path"
            )
        return EmbeddedVectorIndex(parsed.rest, name, dimensions)

    def unknown(parsed: URL) -> KairosError:
        return KairosError(
            f"vector index URL {redact(url)!r} has scheme {parsed.scheme!r}; supported: a "
            "folder path or 'file://folder' (the embedded index), "
            "'postgresql://user@host/db' (pgvector)"
        )

    return connect(
        parsed,
        {
            "file": file,
            "postgresql": lambda parsed: PgVectorIndex(url, name, dimensions),
        },
        unknown=unknown,
    )
