"""Tracing is configured by the standard OTEL_* variables: on for `console` and `otlp`
(exported over real HTTP to a collector here), off for `none`, unset or OTEL_SDK_DISABLED;
the SDK reads the service name, resource attributes and endpoint itself. Without the extra
kairos works untraced and says what to install."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap
from typing import Any

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace import TracerProvider

from kairos import telemetry
from tests.telemetry.conftest import Collector

OTEL_VARIABLES = (
    "OTEL_SDK_DISABLED",
    "OTEL_TRACES_EXPORTER",
    "OTEL_SERVICE_NAME",
    "OTEL_RESOURCE_ATTRIBUTES",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_EXPORTER_OTLP_PROTOCOL",
    "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
    "OTEL_TRACES_SAMPLER",
    "OTEL_TRACES_SAMPLER_ARG",
)


@pytest.fixture(autouse=True)
def environment(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """No OTEL_* variable but the test's own; kairos' tracer state put back afterwards."""
    for name in OTEL_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(telemetry, "TRACER", None)
    monkeypatch.setattr(telemetry, "_configured", False)
    monkeypatch.setattr(telemetry, "_read_environment", False)
    return monkeypatch


def provider(environment: pytest.MonkeyPatch, **variables: str) -> Any:
    for name, value in variables.items():
        environment.setenv(name, value)
    return telemetry.provider_from_environment()


@pytest.mark.parametrize(
    "variables",
    [
        {},
        {"OTEL_TRACES_EXPORTER": "none"},
        {"OTEL_TRACES_EXPORTER": " "},
        {"OTEL_TRACES_EXPORTER": "console", "OTEL_SDK_DISABLED": "true"},
    ],
)
def test_tracing_is_off_unless_an_exporter_is_asked_for(
    environment: pytest.MonkeyPatch, variables: dict[str, str]
) -> None:
    assert provider(environment, **variables) is None
    assert telemetry.from_environment() is False
    assert telemetry.TRACER is None


def test_console_exports_spans_with_the_sdks_resource(
    environment: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    made = provider(environment, OTEL_TRACES_EXPORTER="console")
    assert isinstance(made, TracerProvider)
    assert made.resource.attributes["service.name"] == "kairos"  # unless named otherwise
    made.get_tracer("test").start_span("console-probe").end()
    made.shutdown()
    assert '"name": "console-probe"' in capsys.readouterr().out

    named = provider(
        environment,
        OTEL_SERVICE_NAME="risk-api",
        OTEL_RESOURCE_ATTRIBUTES="deployment.environment.name=test",
    )
    assert named.resource.attributes["service.name"] == "risk-api"
    assert named.resource.attributes["deployment.environment.name"] == "test"
    named.shutdown()


def test_otlp_exports_over_http_to_the_endpoint_the_sdk_reads(
    environment: pytest.MonkeyPatch, collector: Collector
) -> None:
    url, received = collector.url, collector.received
    made = provider(
        environment,
        OTEL_TRACES_EXPORTER="otlp",
        OTEL_EXPORTER_OTLP_ENDPOINT=url,
        OTEL_SERVICE_NAME="risk-api",
    )
    made.get_tracer("test").start_span("otlp-probe").end()
    assert made.force_flush(10_000)
    made.shutdown()

    [(content_type, body)] = received
    assert content_type == "application/x-protobuf"
    export = ExportTraceServiceRequest.FromString(body)
    [resource_spans] = export.resource_spans
    service = {a.key: a.value.string_value for a in resource_spans.resource.attributes}
    assert service["service.name"] == "risk-api"
    assert [s.name for scope in resource_spans.scope_spans for s in scope.spans] == ["otlp-probe"]


def test_an_exporter_kairos_cannot_make_is_a_clear_error(
    environment: pytest.MonkeyPatch,
) -> None:
    with pytest.raises(telemetry.TelemetryUnavailable, match="'jaeger' is neither"):
        provider(environment, OTEL_TRACES_EXPORTER="console,jaeger")
    with pytest.raises(telemetry.TelemetryUnavailable, match="OTEL_EXPORTER_OTLP_PROTOCOL"):
        provider(environment, OTEL_TRACES_EXPORTER="otlp", OTEL_EXPORTER_OTLP_PROTOCOL="grpc")


def test_without_the_sdk_tracing_stays_off_and_says_what_to_install(
    environment: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    for name in list(sys.modules):
        if name == "opentelemetry.sdk" or name.startswith("opentelemetry.sdk."):
            environment.delitem(sys.modules, name)
    environment.setitem(sys.modules, "opentelemetry.sdk", None)  # imports of it fail
    environment.setenv("OTEL_TRACES_EXPORTER", "otlp")
    with pytest.raises(telemetry.TelemetryUnavailable) as missing:
        telemetry.provider_from_environment()
    assert "pip install 'kairos-inference[otel]'" in str(missing.value)

    with caplog.at_level(logging.ERROR, logger="kairos.telemetry"):
        assert telemetry.from_environment() is False
    assert telemetry.TRACER is None
    assert "pip install 'kairos-inference[otel]'" in caplog.text


def test_the_environment_is_read_once_and_never_over_configure(
    environment: pytest.MonkeyPatch,
) -> None:
    environment.setenv("OTEL_TRACES_EXPORTER", "console")
    mine = TracerProvider()
    telemetry.configure(mine)
    configured = telemetry.TRACER
    assert telemetry.from_environment() is True
    assert telemetry.TRACER is configured  # the environment did not replace it
    mine.shutdown()

    environment.setattr(telemetry, "_configured", False)
    environment.setattr(telemetry, "TRACER", None)
    environment.setenv("OTEL_TRACES_EXPORTER", "none")
    assert telemetry.from_environment() is False
    environment.setenv("OTEL_TRACES_EXPORTER", "console")
    assert telemetry.from_environment() is False  # read once per process


PLAIN = textwrap.dedent(
    """
    import sys
    sys.modules["opentelemetry"] = None  # the plain install: no OpenTelemetry at all
    import kairos as kr
    from kairos import features, online, telemetry

    @features
    class Probe:
        id: str
        size: int

    @online
    def size(pid: Probe.id) -> Probe.size:
        return len(pid)

    with kr.Client(definitions=[Probe, size]) as client:
        result = client.query({"probe.id": "abcd"}, ["probe.size"])
    print(telemetry.API, telemetry.TRACER, result.get_value("probe.size"))
    """
)


def test_kairos_works_without_opentelemetry_installed() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env["OTEL_TRACES_EXPORTER"] = "otlp"
    done = subprocess.run(
        [sys.executable, "-c", PLAIN], capture_output=True, text=True, env=env, timeout=100
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "None", "4"]
    assert "pip install 'kairos-inference[otel]'" in done.stderr
