"""Artifacts stored by the sha256 of their bytes, in a local folder or any fsspec URL.

    volume = ArtifactVolume(".kairos/models")      # or "s3://bucket/models", "memory://m"
    sha = volume.put(data)                          # <root>/sha256/ab/abcdef...
    volume.get(sha) == data                         # hash checked: a changed file is refused

The same bytes are stored once, however many versions point at them.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path
from typing import Any

from kairos.models.errors import TamperedArtifact, UnknownModel


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class ArtifactVolume:
    """Content-addressed blobs. A plain path (or file://) is written with an atomic rename;
    other URLs go through fsspec, imported only when such a URL is used."""

    def __init__(self, location: str | Path) -> None:
        text = str(location)
        self.location = text
        if "://" in text and not text.startswith("file://"):
            self._root: Path | None = None
            self._url = text.rstrip("/")
        else:
            self._root = Path(text.removeprefix("file://")).expanduser()
            self._url = ""

    def _key(self, digest: str) -> str:
        return f"sha256/{digest[:2]}/{digest}"

    def path(self, digest: str) -> str:
        """Where an artifact lives (a path or a URL)."""
        if self._root is not None:
            return str(self._root / self._key(digest))
        return f"{self._url}/{self._key(digest)}"

    def put(self, data: bytes) -> str:
        """Store `data` (once) and return its sha256."""
        digest = sha256(data)
        if self._root is not None:
            target = self._root / self._key(digest)
            if target.exists() and sha256(target.read_bytes()) == digest:
                return digest
            target.parent.mkdir(parents=True, exist_ok=True)
            fd, temp = tempfile.mkstemp(dir=target.parent, prefix=".tmp-")
            try:
                with os.fdopen(fd, "wb") as handle:
                    handle.write(data)
                    handle.flush()
                    os.fsync(handle.fileno())
                os.replace(temp, target)
            except BaseException:
                Path(temp).unlink(missing_ok=True)
                raise
            return digest
        fs, path = self._fs(self.path(digest))
        if not fs.exists(path):
            fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
            with fs.open(path, "wb") as handle:
                handle.write(data)
        return digest

    def get(self, digest: str) -> bytes:
        """The artifact's bytes; TamperedArtifact when they no longer hash to `digest`."""
        location = self.path(digest)
        try:
            if self._root is not None:
                data = Path(location).read_bytes()
            else:
                fs, path = self._fs(location)
                with fs.open(path, "rb") as handle:
                    data = handle.read()
        except FileNotFoundError:
            raise UnknownModel(
                f"artifact sha256:{digest} is missing from {self.location!r}; the registry "
                "and the volume are out of step (was the folder moved or cleaned?)",
                field="artifact",
            ) from None
        found = sha256(data)
        if found != digest:
            raise TamperedArtifact(
                f"artifact {location} hashes to sha256:{found}, not the sha256:{digest} "
                "recorded when it was registered; it was changed after registration. Register "
                "the model again rather than editing stored artifacts"
            )
        return data

    def _fs(self, url: str) -> tuple[Any, str]:
        import fsspec

        fs, path = fsspec.core.url_to_fs(url)
        return fs, str(path)
