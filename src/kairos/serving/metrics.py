"""Prometheus metrics of one LLM worker, on its own registry (several workers may share a
process in tests). Names follow vLLM's where one exists, under `kairos_llm_`."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from kairos.serving.llamacpp import EngineObserver, Finished, Job

_SECONDS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
_RATES = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000)


class WorkerMetrics(EngineObserver):
    def __init__(self, model: str) -> None:
        self.registry = CollectorRegistry()
        labels = ("model",)
        r = self.registry
        self.waiting = Gauge("kairos_llm_requests_waiting", "Requests queued", labels, registry=r)
        self.running = Gauge("kairos_llm_requests_running", "Requests generating", labels,
                             registry=r)  # fmt: skip
        self.queue_time = Histogram("kairos_llm_request_queue_time_seconds",
                                    "Arrival to generation start", labels, buckets=_SECONDS,
                                    registry=r)  # fmt: skip
        self.ttft = Histogram("kairos_llm_time_to_first_token_seconds",
                              "Arrival to first token (queue included)", labels, buckets=_SECONDS,
                              registry=r)  # fmt: skip
        self.prefill = Histogram("kairos_llm_prefill_time_seconds",
                                 "Generation start to first token", labels, buckets=_SECONDS,
                                 registry=r)  # fmt: skip
        self.decode = Histogram("kairos_llm_decode_time_seconds", "First token to last token",
                                labels, buckets=_SECONDS, registry=r)  # fmt: skip
        self.e2e = Histogram("kairos_llm_e2e_request_latency_seconds", "Arrival to finish",
                             labels, buckets=_SECONDS, registry=r)  # fmt: skip
        self.rate = Histogram("kairos_llm_decode_tokens_per_second", "Decode rate per request",
                              labels, buckets=_RATES, registry=r)  # fmt: skip
        self.prompt_tokens = Counter("kairos_llm_prompt_tokens", "Prompt tokens processed",
                                     labels, registry=r)  # fmt: skip
        self.completion_tokens = Counter("kairos_llm_generation_tokens", "Tokens generated",
                                         labels, registry=r)  # fmt: skip
        self.requests = Counter("kairos_llm_requests", "Finished requests by reason",
                                ("model", "finish_reason"), registry=r)  # fmt: skip
        self.model = model
        self._started: set[int] = set()
        self.waiting.labels(model).set(0)
        self.running.labels(model).set(0)

    def queued(self, depth: int) -> None:
        self.waiting.labels(self.model).set(depth)

    def started(self, job: Job, queue_s: float) -> None:
        self._started.add(job.id)
        self.running.labels(self.model).inc()
        self.queue_time.labels(self.model).observe(queue_s)

    def finished(self, job: Job, event: Finished) -> None:
        t, m = event.timings, self.model
        self.requests.labels(m, event.finish_reason).inc()
        if job.id not in self._started:  # cancelled while it waited: it never ran
            return
        self._started.discard(job.id)
        self.running.labels(m).dec()
        self.ttft.labels(m).observe(t.ttft_ms / 1e3)
        self.prefill.labels(m).observe(t.prefill_ms / 1e3)
        self.decode.labels(m).observe(t.decode_ms / 1e3)
        self.e2e.labels(m).observe(t.total_ms / 1e3)
        if t.tokens_per_s > 0:
            self.rate.labels(m).observe(t.tokens_per_s)
        self.prompt_tokens.labels(m).inc(t.prompt_tokens)
        self.completion_tokens.labels(m).inc(t.completion_tokens)
