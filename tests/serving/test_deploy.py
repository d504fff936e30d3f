from __future__ import annotations

import sys
from typing import Any

import click
import pytest

from kairos.cli.deploy import llm_command
from kairos.errors import InvalidInput
from kairos.serving.deploy import DeploymentSpec, engine_command, engine_env


def test_the_vllm_command_line_carries_every_documented_flag() -> None:
    spec = DeploymentSpec(
        name="qwen",
        model="Qwen/Qwen2.5-7B-Instruct",
        engine="vllm",
        replicas=2,
        ctx=8192,
        gpu_memory_utilization=0.85,
        tensor_parallel_size=2,
        seed=3,
        extra_args=("--enforce-eager",),
    )
    assert engine_command(spec, 8301) == [
        "vllm",
        "serve",
        "Qwen/Qwen2.5-7B-Instruct",
        "--host",
        "127.0.0.1",
        "--port",
        "8301",
        "--served-model-name",
        "qwen",
        "--max-model-len",
        "8192",
        "--gpu-memory-utilization",
        "0.85",
        "--tensor-parallel-size",
        "2",
        "--seed",
        "3",
        "--enforce-eager",
    ]
    # replica 1 of a tensor-parallel-2 group sees the second pair of GPUs
    assert engine_env(spec, 1) == {"CUDA_VISIBLE_DEVICES": "2,3"}
    shared = DeploymentSpec(name="q", model="m", engine="vllm", share_gpu=True)
    assert "CUDA_VISIBLE_DEVICES" not in engine_env(shared, 1)


def test_the_llamacpp_command_runs_kairos_worker() -> None:
    spec = DeploymentSpec(name="tiny", model="/m/tiny.gguf", ctx=512, threads=1)
    command = engine_command(spec, 8200, parent_pid=42)
    assert command[:3] == [sys.executable, "-m", "kairos.serving.worker"]
    flags = dict(zip(command[3::2], command[4::2], strict=True))
    assert flags == {
        "--model": "/m/tiny.gguf",
        "--name": "tiny",
        "--host": "127.0.0.1",
        "--port": "8200",
        "--ctx": "512",
        "--slots": "8",
        "--seed": "0",
        "--graceful": "60.0",
        "--threads": "1",
        "--parent-pid": "42",
    }


def test_pinned_replicas_take_their_cores_in_turn() -> None:
    spec = DeploymentSpec(name="tiny", model="/m/tiny.gguf", replicas=3, cpus=((0,), (1, 2)))
    cores = []
    for index in range(3):
        command = engine_command(spec, 8200 + index, index=index)
        cores.append(command[command.index("--cpus") + 1])
    assert cores == ["0", "1,2", "0"]
    assert "--cpus" not in engine_command(DeploymentSpec(name="t", model="m.gguf"), 8200)


def _options(argv: list[str]) -> dict[str, Any]:
    """What `kairos deploy llm ARGV` parses into (the command's parameters, unrun)."""
    return llm_command.make_context("llm", argv).params


def test_cpus_on_the_command_line() -> None:
    from kairos.cli.deploy import spec_from_args

    args = _options(["g", "--cpus", "0", "--cpus", "1,3"])
    assert spec_from_args(args).cpus == ((0,), (1, 3))
    with pytest.raises(click.BadParameter, match="'zero' is not a list of core numbers") as bad:
        _options(["g", "--cpus", "zero"])
    assert "--cpus" in bad.value.format_message()  # names the flag and the value


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"engine": "tgi"}, "engine"),
        ({"replicas": 0}, "replicas"),
        ({"replicas": 2, "min_replicas": 3, "max_replicas": 4}, "replicas"),
        ({"replicas": 3, "max_replicas": 2}, "replicas"),
        ({"name": ""}, "name"),
        ({"ctx": 4}, "ctx"),
        ({"cpus": ((0,),), "engine": "vllm"}, "cpus"),
        ({"cpus": ((),)}, "cpus"),
        ({"cpus": ((0, -1),)}, "cpus"),
    ],
)
def test_a_bad_spec_names_the_setting(kwargs: dict[str, object], field: str) -> None:
    base: dict[str, object] = {"name": "m", "model": "m.gguf"}
    with pytest.raises(InvalidInput) as caught:
        DeploymentSpec(**{**base, **kwargs})  # type: ignore[arg-type]
    assert caught.value.field == field


def test_the_cli_builds_the_spec() -> None:
    from kairos.cli.deploy import spec_from_args

    args = _options(
        [
            "qwen",
            "--engine",
            "vllm",
            "--model",
            "Qwen/Qwen2.5-7B-Instruct",
            "--replicas",
            "2",
            "--min-replicas",
            "1",
            "--max-replicas",
            "3",
            "--port-base",
            "9000",
            "--scale-up-after",
            "2",
            "--engine-arg=--enforce-eager",
        ]
    )
    spec = spec_from_args(args)
    assert (spec.name, spec.engine, spec.replicas, spec.lowest, spec.highest) == (
        "qwen",
        "vllm",
        2,
        1,
        3,
    )
    assert (spec.port_base, spec.scale_up_after, spec.extra_args) == (
        9000,
        2.0,
        ("--enforce-eager",),
    )


def test_vllm_without_a_model_is_refused() -> None:
    from kairos.cli.deploy import spec_from_args
    from kairos.errors import KairosError

    args = _options(["q", "--engine", "vllm"])
    with pytest.raises(KairosError, match="--model is required"):
        spec_from_args(args)
