"""The in-process engine: stop sequences, seeds, readiness, event loops."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kairos.serving import slots
from kairos.serving.errors import ContextOverflow, EngineNotReady
from kairos.serving.llamacpp import EngineConfig, Finished, LlamaCppEngine, Piece, Sampling
from kairos.serving.stops import StopMatcher


@pytest.fixture(scope="module")
def engine(tiny_model: Path) -> Iterator[LlamaCppEngine]:
    engine = LlamaCppEngine(EngineConfig(model_path=str(tiny_model), n_ctx=256, n_threads=1))
    engine.load()
    yield engine
    engine.close()


def generate(engine: LlamaCppEngine, sampling: Sampling, prompt: str = "Hi") -> tuple[str, str]:
    async def run() -> tuple[str, str]:
        job = engine.submit(engine.tokenize(prompt), sampling)
        text, reason = "", ""
        async for event in job.events():
            if isinstance(event, Piece):
                text += event.text
            elif isinstance(event, Finished):
                reason = event.finish_reason
        return text, reason

    return asyncio.run(run())  # a new event loop each time: the engine follows it


def test_a_stop_sequence_ends_the_text_before_it(engine: LlamaCppEngine) -> None:
    greedy = Sampling(max_tokens=30, temperature=0.0, ignore_eos=True)
    text, reason = generate(engine, greedy)
    assert reason == "length" and len(text) >= 10
    stop = text[6:9]
    cut, reason = generate(engine, Sampling(max_tokens=30, temperature=0.0, ignore_eos=True,
                                            stop=(stop,)))  # fmt: skip
    assert reason == "stop" and cut == text[: text.index(stop)]


def test_a_seed_fixes_a_sampled_answer(engine: LlamaCppEngine) -> None:
    def sampled(seed: int | None) -> str:
        sampling = Sampling(max_tokens=20, temperature=1.0, seed=seed, ignore_eos=True)
        return generate(engine, sampling)[0]

    assert sampled(3) == sampled(3)
    assert len({sampled(None) for _ in range(4)}) > 1  # without one, answers vary


def test_the_context_is_enforced(engine: LlamaCppEngine) -> None:
    prompt = engine.tokenize("x" * 300)
    with pytest.raises(ContextOverflow, match="shorten it"):
        engine.fit(prompt, 10, "prompt")
    assert engine.fit(engine.tokenize("x" * 200), 100, "prompt") == 256 - 202


def test_a_missing_model_is_not_ready(tmp_path: Path) -> None:
    engine = LlamaCppEngine(EngineConfig(model_path=str(tmp_path / "none.gguf")))
    with pytest.raises(EngineNotReady, match="does not exist"):
        engine.load()
    with pytest.raises(EngineNotReady):
        engine.tokenize("x")


def test_an_idle_engine_starts_a_job_in_submit_and_queues_the_rest_in_order(
    engine: LlamaCppEngine,
) -> None:
    async def run() -> list[int]:
        sampling = Sampling(max_tokens=8, temperature=0.0, ignore_eos=True)
        first = engine.submit(engine.tokenize("Hi"), sampling)
        # no await in between: the generation thread has it before the loop runs again
        assert first.state == "running" and engine.running == 1
        later = [engine.submit(engine.tokenize("Hi"), sampling) for _ in range(3)]
        assert [job.state for job in later] == ["queued"] * 3 and engine.waiting == 3
        later[1].cancel()  # leaves the queue: never runs
        finished: list[int] = []

        async def drain(job: Any) -> None:
            async for event in job.events():
                if isinstance(event, Finished) and event.finish_reason != "cancelled":
                    finished.append(job.id)

        await asyncio.gather(*(drain(job) for job in (first, *later)))
        assert engine.running == 0 and engine.waiting == 0
        return [finished.index(job.id) for job in (first, later[0], later[2])]

    assert asyncio.run(run()) == [0, 1, 2]


def test_a_job_failing_outside_sampling_ends_with_an_error_and_the_queue_moves_on(
    engine: LlamaCppEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = StopMatcher

    def broken(stops: Any) -> Any:
        if tuple(stops) == ("BOOM",):
            raise ValueError("a stop matcher that cannot be built")
        return real(stops)

    monkeypatch.setattr(slots, "StopMatcher", broken)  # a fault inside the job's thread

    async def run() -> list[Finished]:
        failing = engine.submit(engine.tokenize("Hi"), Sampling(max_tokens=4, stop=("BOOM",)))
        after = engine.submit(engine.tokenize("Hi"), Sampling(max_tokens=4, ignore_eos=True))
        ends = []
        for job in (failing, after):
            async for event in job.events():
                if isinstance(event, Finished):
                    ends.append(event)
        assert engine.running == 0 and engine.waiting == 0
        return ends

    failed, finished = asyncio.run(run())
    assert failed.finish_reason == "error" and "cannot be built" in str(failed.error)
    assert finished.finish_reason == "length" and finished.timings.completion_tokens == 4
