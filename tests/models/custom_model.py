"""A model defined by the user's own class: `predict(df)` plus the files it needs, rebuilt
by `load(folder)` without pickle."""

import json
import time
from pathlib import Path
from typing import Any

import numpy as np


class Thresholds:
    """A weighted sum of columns; its weights live in a JSON file."""

    def __init__(self, weights: dict[str, float]) -> None:
        self.weights = weights

    def predict(self, df: Any) -> np.ndarray:
        return sum(np.asarray(df[name]) * w for name, w in self.weights.items())  # type: ignore[return-value]

    def save(self, folder: Path) -> Path:
        path = folder / "weights.json"
        path.write_text(json.dumps(self.weights))
        return path

    @classmethod
    def load(cls, folder: Path) -> "Thresholds":
        return cls(json.loads((folder / "weights.json").read_text()))


class Pickled:
    """No load(folder): saving it needs pickle."""

    def __init__(self, scale: float) -> None:
        self.scale = scale

    def predict(self, df: Any) -> np.ndarray:
        return np.asarray(df["amount"]) * self.scale


class Raising:
    """A model whose predict fails on negative inputs."""

    inputs = ("a", "b")

    @classmethod
    def load(cls, folder: Path) -> "Raising":
        return cls()

    def predict(self, df: Any) -> np.ndarray:
        a = np.asarray(df["a"])
        if (a < 0).any():
            raise RuntimeError("negative a: the weights only cover a >= 0")
        return np.asarray(a + np.asarray(df["b"]))


class SlowToLoad:
    """A model whose artifact takes `LOAD_SECONDS` to load (a framework's first import)."""

    LOAD_SECONDS = 1.0
    inputs = ("a", "b")

    @classmethod
    def load(cls, folder: Path) -> "SlowToLoad":
        time.sleep(cls.LOAD_SECONDS)
        return cls()

    def predict(self, df: Any) -> np.ndarray:
        return np.asarray(df["a"]) * 2
