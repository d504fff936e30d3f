"""The predictor: concurrent callers are micro-batched and each gets exactly its own rows."""

import asyncio
import threading
import time
from typing import Any

import numpy as np
import pytest

from kairos.models import ModelSchema, Predictor

SCHEMA = ModelSchema(("a", "b"))


class Recording:
    """y = 10a + b, recording the size of every call and optionally slow."""

    def __init__(self, delay: float = 0.0) -> None:
        self.calls: list[int] = []
        self.delay = delay
        self.lock = threading.Lock()

    def __call__(self, rows: np.ndarray) -> np.ndarray:
        with self.lock:
            self.calls.append(len(rows))
        if self.delay:
            time.sleep(self.delay)
        if (rows[:, 0] < 0).any():
            raise ValueError("negative a")
        return np.asarray(rows[:, 0] * 10 + rows[:, 1])


def test_64_concurrent_callers_each_get_their_own_rows() -> None:
    model = Recording(delay=0.002)
    predictor = Predictor(model, SCHEMA, max_batch=256, max_wait=0.001)
    results: dict[int, Any] = {}

    async def caller(i: int) -> None:
        rows = np.array([[i, j] for j in range(i % 3 + 1)], dtype=float)
        results[i] = await predictor.predict_async(rows)

    async def everyone() -> None:
        await asyncio.gather(*(caller(i) for i in range(64)))

    asyncio.run(everyone())
    for i in range(64):
        assert results[i].tolist() == [i * 10 + j for j in range(i % 3 + 1)], i
    assert sum(model.calls) == sum(i % 3 + 1 for i in range(64))
    assert len(model.calls) < 64 / 4  # batched: far fewer model calls than callers
    assert predictor.batched_requests == 64
    predictor.close()


def test_threads_are_batched_too_and_max_batch_caps_a_call() -> None:
    model = Recording(delay=0.001)
    predictor = Predictor(model, SCHEMA, max_batch=8, max_wait=0.002)
    out: dict[int, list[float]] = {}

    def caller(i: int) -> None:
        out[i] = predictor.predict([[i, 1.0]]).tolist()

    threads = [threading.Thread(target=caller, args=(i,)) for i in range(64)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert out == {i: [i * 10 + 1.0] for i in range(64)}
    assert max(model.calls) <= 8 and len(model.calls) < 64
    predictor.close()


def test_a_failing_request_fails_alone() -> None:
    model = Recording(delay=0.002)
    predictor = Predictor(model, SCHEMA, max_batch=64, max_wait=0.005)

    async def both() -> list[Any]:
        good = predictor.predict_async([[1.0, 2.0]])
        bad = predictor.predict_async([[-1.0, 2.0]])
        return list(await asyncio.gather(good, bad, return_exceptions=True))

    good, bad = asyncio.run(both())
    assert good.tolist() == [12.0]
    assert isinstance(bad, ValueError) and "negative a" in str(bad)
    predictor.close()


def test_score_runs_the_same_code_in_chunks() -> None:
    model = Recording()
    predictor = Predictor(model, SCHEMA)
    rows = np.column_stack((np.arange(1000.0), np.ones(1000)))
    assert predictor.score(rows, chunk=300).tolist() == (rows[:, 0] * 10 + 1).tolist()
    assert model.calls == [300, 300, 300, 100]


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="max_batch"):
        Predictor(Recording(), SCHEMA, max_batch=0)
