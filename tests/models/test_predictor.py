"""The predictor: concurrent callers are micro-batched and each gets exactly its own rows."""

import asyncio
import threading
import time
from typing import Any

import numpy as np
import pytest
from sklearn.ensemble import HistGradientBoostingClassifier
from threadpoolctl import ThreadpoolController

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
    with pytest.raises(ValueError, match="threads"):
        Predictor(Recording(), SCHEMA, threads=0)


def _openmp_threads() -> int:
    """The OpenMP thread count a parallel region started in this thread would get."""
    return int(ThreadpoolController().select(user_api="openmp").info()[0]["num_threads"])


@pytest.mark.parametrize("threads", [1, 3])
def test_the_workers_model_calls_use_the_configured_openmp_threads(threads: int) -> None:
    if not ThreadpoolController().select(user_api="openmp").info():
        pytest.skip("no OpenMP runtime loaded")  # scikit-learn, imported above, brings one
    caller_before = _openmp_threads()
    seen: list[int] = []

    def infer(rows: np.ndarray) -> np.ndarray:
        seen.append(_openmp_threads())
        return np.asarray(rows[:, 0])

    predictor = Predictor(infer, SCHEMA, threads=threads)
    assert predictor.predict([[1.0, 2.0]]).tolist() == [1.0]
    predictor.close()
    assert seen == [threads]
    assert _openmp_threads() == caller_before  # OpenMP keeps it per thread: callers keep theirs


def test_batch_scoring_runs_in_the_callers_thread_with_its_openmp_threads() -> None:
    if not ThreadpoolController().select(user_api="openmp").info():
        pytest.skip("no OpenMP runtime loaded")
    seen: list[tuple[str, int]] = []

    def infer(rows: np.ndarray) -> np.ndarray:
        seen.append((threading.current_thread().name, _openmp_threads()))
        return np.asarray(rows[:, 0])

    predictor = Predictor(infer, SCHEMA, threads=1)
    try:
        predictor.score(np.ones((10, 2)), chunk=4)
    finally:
        predictor.close()
    assert seen == [(threading.current_thread().name, _openmp_threads())] * 3


def test_threads_none_leaves_the_process_pools_alone() -> None:
    if not ThreadpoolController().select(user_api="openmp").info():
        pytest.skip("no OpenMP runtime loaded")
    seen: list[int] = []
    default = _openmp_threads()

    def infer(rows: np.ndarray) -> np.ndarray:
        seen.append(_openmp_threads())
        return np.asarray(rows[:, 0])

    predictor = Predictor(infer, SCHEMA, threads=None)
    predictor.predict([[1.0, 2.0]])
    predictor.close()
    assert seen == [default]


def test_an_openmp_model_answers_the_same_on_one_thread() -> None:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(2000, 2))
    model = HistGradientBoostingClassifier(max_iter=20).fit(x, (x[:, 0] > x[:, 1]).astype(int))
    expected = model.predict_proba(x[:300])[:, 1]
    predictor = Predictor(model.predict_proba, SCHEMA, raw="proba", threads=1)

    async def callers() -> list[np.ndarray]:
        return list(
            await asyncio.gather(*(predictor.predict_async(x[i : i + 1]) for i in range(300)))
        )

    answers = asyncio.run(callers())
    predictor.close()
    assert np.array_equal(np.concatenate(answers), expected)
    assert predictor.batches < 300  # batched, and each caller still got its own row


def test_a_cancelled_async_caller_leaves_the_others_answered() -> None:
    model = Recording(delay=0.02)
    predictor = Predictor(model, SCHEMA, max_batch=64, max_wait=0.005)

    async def three() -> tuple[list[float], list[float], bool]:
        first = asyncio.ensure_future(predictor.predict_async([[1.0, 0.0]]))
        second = asyncio.ensure_future(predictor.predict_async([[2.0, 0.0]]))
        third = asyncio.ensure_future(predictor.predict_async([[3.0, 0.0]]))
        await asyncio.sleep(0.001)
        second.cancel()
        done = await asyncio.gather(first, third)
        return done[0].tolist(), done[1].tolist(), second.cancelled()

    first, third, cancelled = asyncio.run(three())
    predictor.close()
    assert (first, third, cancelled) == ([10.0], [30.0], True)


def test_an_async_caller_whose_loop_closed_does_not_stop_the_worker() -> None:
    model = Recording(delay=0.02)
    predictor = Predictor(model, SCHEMA)
    loop = asyncio.new_event_loop()
    orphan = loop.run_until_complete(_submitted(predictor))  # the loop closes before it is done
    loop.close()
    assert predictor.predict([[4.0, 1.0]]).tolist() == [41.0]  # the worker still answers
    predictor.close()
    assert not orphan.done()  # its loop is gone: the answer had nowhere to go


async def _submitted(predictor: Predictor) -> asyncio.Future[np.ndarray]:
    return predictor.submit_async(np.array([[1.0, 0.0]]))
