"""Deployment groups of real worker processes: readiness, restarts, scaling, draining."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from kairos.serving.deploy import DeploymentSpec
from kairos.serving.errors import DeploymentError
from kairos.serving.supervisor import DeploymentGroup


def spec(model: Path, **overrides: Any) -> DeploymentSpec:
    settings: dict[str, Any] = {
        "name": "tiny",
        "model": str(model),
        "ctx": 1024,
        "threads": 1,
        "poll_interval": 0.1,
        "ready_timeout": 30.0,
        "drain_timeout": 20.0,
    }
    return DeploymentSpec(**{**settings, **overrides})


async def complete(group: DeploymentGroup, tokens: int = 4) -> dict[str, Any]:
    async with group.lease() as replica, httpx.AsyncClient(timeout=60) as client:
        body = {"model": group.name, "prompt": "hi", "max_tokens": tokens, "ignore_eos": True}
        answer = await client.post(replica.url + "/v1/completions", json=body)
        answer.raise_for_status()
        result: dict[str, Any] = answer.json()
        return result


async def wait_for(condition: Any, seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_replicas_are_ready_only_once_they_answer(tiny_model: Path, tmp_path: Path) -> None:
    async def run() -> None:
        group = DeploymentGroup(spec(tiny_model, replicas=2), log_dir=tmp_path)
        async with group:
            assert len(group.urls) == 2 and len(set(group.urls)) == 2
            for url in group.urls:  # ready means the model answered, not just a port
                assert httpx.get(url + "/health").status_code == 200
            assert sum("ready on" in e for e in group.events) == 2
            answers = await asyncio.gather(*(complete(group) for _ in range(4)))
            assert all(a["usage"]["completion_tokens"] == 4 for a in answers)
            pids = [r.process.pid for r in group.replicas if r.process]
        assert all(gone(pid) for pid in pids)

    asyncio.run(run())


def test_least_outstanding_requests_pick(tiny_model: Path, tmp_path: Path) -> None:
    async def run() -> None:
        async with DeploymentGroup(spec(tiny_model, replicas=2), log_dir=tmp_path) as group:
            async with group.lease() as first, group.lease() as second:
                assert first is not second  # the second goes where nothing is outstanding
                assert (first.outstanding, second.outstanding) == (1, 1)
                async with group.lease() as third:
                    assert third.outstanding == 2
            assert [r.outstanding for r in group.replicas] == [0, 0]

    asyncio.run(run())


def test_a_replica_that_cannot_load_fails_the_start_with_its_log(tmp_path: Path) -> None:
    async def run() -> None:
        group = DeploymentGroup(spec(tmp_path / "missing.gguf"), log_dir=tmp_path)
        with pytest.raises(DeploymentError, match="does not exist"):
            await group.start()
        assert all(r.process is None or r.process.poll() is not None for r in group.replicas)

    asyncio.run(run())


def test_a_killed_replica_is_restarted_and_the_group_keeps_serving(
    tiny_model: Path, tmp_path: Path
) -> None:
    async def run() -> None:
        async with DeploymentGroup(spec(tiny_model, replicas=2), log_dir=tmp_path) as group:
            victim = group.replicas[0]
            assert victim.process is not None
            old_pid = victim.process.pid
            load = asyncio.create_task(complete(group, tokens=200))  # in flight somewhere
            await asyncio.sleep(0.05)
            os.kill(old_pid, signal.SIGKILL)
            await wait_for(lambda: victim.state != "ready", 5, "the death to be noticed")
            # meanwhile the other replica answers everything
            served = await asyncio.gather(*(complete(group) for _ in range(3)))
            assert all(s["usage"]["completion_tokens"] == 4 for s in served)
            await wait_for(lambda: victim.state == "ready", 30, "the restart")
            assert victim.restarts == 1 and victim.process.pid != old_pid
            assert any("exited with code -9; restarting" in e for e in group.events)
            assert (await complete(group))["usage"]["completion_tokens"] == 4
            await asyncio.gather(load, return_exceptions=True)  # it may have been on the victim

    asyncio.run(run())


def test_stopping_drains_in_flight_requests(slow_model: Path, tmp_path: Path) -> None:
    async def run() -> None:
        group = DeploymentGroup(spec(slow_model, name="slow"), log_dir=tmp_path)
        await group.start()
        request = asyncio.create_task(complete(group, tokens=120))
        await wait_for(lambda: group.replicas[0].outstanding == 1, 5, "the request")
        await asyncio.sleep(0.1)
        await group.stop()  # must wait for the request, not cut it off
        answer = await request
        assert answer["usage"]["completion_tokens"] == 120
        assert answer["choices"][0]["finish_reason"] == "length"
        assert [r.state for r in group.replicas] == ["stopped"]

    asyncio.run(run())


def test_sustained_queueing_grows_to_max_and_idleness_shrinks_back(
    slow_model: Path, tmp_path: Path
) -> None:
    async def run() -> None:
        settings = spec(
            slow_model,
            name="slow",
            slots=1,  # one request per replica: the rest queue, which is what scales it
            replicas=1,
            min_replicas=1,
            max_replicas=2,
            scale_up_after=0.5,
            scale_down_after=1.0,
        )
        async with DeploymentGroup(settings, log_dir=tmp_path) as group:
            stop = asyncio.Event()

            async def client() -> None:
                while not stop.is_set():
                    await complete(group, tokens=60)

            clients = [asyncio.create_task(client()) for _ in range(4)]
            await wait_for(lambda: len(group.ready) == 2, 30, "a second replica")
            assert any("scaling 'slow' up to 2 replicas" in e for e in group.events)
            await asyncio.sleep(1.0)  # more load: never beyond max
            assert group.size == 2
            stop.set()
            await asyncio.gather(*clients)
            await wait_for(lambda: group.size == 1, 15, "scaling back down")
            assert any("scaling 'slow' down to 1 replica:" in e for e in group.events)
            await wait_for(
                lambda: [r.state for r in group.replicas].count("stopped") == 1,
                15,
                "the drained replica to stop",
            )
            assert (await complete(group))["usage"]["completion_tokens"] == 4

    asyncio.run(run())


def test_a_hung_replica_is_replaced(tiny_model: Path, tmp_path: Path) -> None:
    async def run() -> None:
        settings = spec(tiny_model, unresponsive_after=1.0)
        async with DeploymentGroup(settings, log_dir=tmp_path) as group:
            [replica] = group.replicas
            assert replica.process is not None
            old_pid = replica.process.pid
            os.kill(old_pid, signal.SIGSTOP)  # alive, but answers nothing
            await wait_for(lambda: replica.restarts == 1, 10, "the hung replica to be killed")
            assert any("has not answered" in e for e in group.events)
            await wait_for(lambda: replica.state == "ready", 30, "its replacement")
            assert gone(old_pid) and replica.process.pid != old_pid
            assert (await complete(group))["usage"]["completion_tokens"] == 4

    asyncio.run(run())


def threads_cores(pid: int) -> set[str]:
    """The `Cpus_allowed_list` of every thread of process `pid`."""
    found = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        for line in (task / "status").read_text().splitlines():
            if line.startswith("Cpus_allowed_list:"):
                found.add(line.split(":", 1)[1].strip())
    return found


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 usable cores")
def test_pinned_replicas_run_every_thread_on_their_own_core(
    tiny_model: Path, tmp_path: Path
) -> None:
    first, second = sorted(os.sched_getaffinity(0))[:2]

    async def run() -> None:
        pinned = spec(tiny_model, replicas=2, cpus=((first,), (second,)))
        async with DeploymentGroup(pinned, log_dir=tmp_path) as group:
            await asyncio.gather(*(complete(group) for _ in range(4)))  # llama.cpp's threads up
            by_replica = {r.index: r.process.pid for r in group.replicas if r.process}
            assert threads_cores(by_replica[0]) == {str(first)}
            assert threads_cores(by_replica[1]) == {str(second)}
            assert len(list(Path(f"/proc/{by_replica[0]}/task").iterdir())) > 1

    asyncio.run(run())
