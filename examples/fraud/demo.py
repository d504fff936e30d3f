"""The fraud example end to end on embedded defaults: `make demo`.

Generates the seeded SQLite data, starts `kairos serve` on it, asks the server for a risk
decision's inputs over HTTP (the plan, the values and where each came from, the cache at
work, the per-node trace, a bulk query over every user, the query log and the metrics), then
stops the server and reads the decision back from the query log it left on disk. Last, one
question about a user is asked of a real local LLM two ways (llm_demo.py).
"""

import json
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from datetime import datetime
from pathlib import Path
from typing import Any

import kairos as kr

from . import llm_demo
from .generate import ANCHOR, generate

PROJECT = Path(__file__).parent
OUTPUTS = [
    "user.name",
    "user.txn_count[1d]",
    "user.declines[7d]",
    "user.avg_ticket[90d]",
    "user.account_age_days",
    "user.risk",
]


def table(headers: list[str], rows: list[list[Any]]) -> str:
    cells = [[_cell(v) for v in row] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) for i, h in enumerate(headers)]
    line = "  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip()
    rule = "  ".join("-" * w for w in widths)
    body = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells]
    return "\n".join([line, rule, *body])


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.3f}"
    if isinstance(value, datetime):
        return value.isoformat(timespec="seconds")
    return "-" if value is None else str(value)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Server:
    """`kairos serve` in a child process, stopped however the demo ends."""

    def __init__(self, port: int) -> None:
        self.url = f"http://127.0.0.1:{port}"
        self.process = subprocess.Popen(
            [sys.executable, "-m", "kairos.cli", "serve", str(PROJECT), "--port", str(port)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )

    def call(self, method: str, path: str, body: Any = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(
            self.url + path, data=data, method=method, headers={"content-type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=30) as response:
            raw = response.read()
        return json.loads(raw) if response.headers.get_content_type() == "application/json" else raw

    def wait_ready(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"kairos serve exited early:\n{self.stop()}")
            try:
                self.call("GET", "/readyz")
                return
            except (urllib.error.URLError, ConnectionError):
                time.sleep(0.1)
        raise RuntimeError("kairos serve did not become ready in time")

    def stop(self) -> str:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            output, _ = self.process.communicate(timeout=15)
        except subprocess.TimeoutExpired:
            self.process.kill()
            output, _ = self.process.communicate()
        return output or ""


def main() -> None:
    generate()  # the data, and (once) the risk model trained on it: see train.py
    with kr.Client(PROJECT) as client:
        model = client.models.get("risk", alias="prod")
    print(
        f"Model {model.label} (alias prod): a scikit-learn pipeline trained on "
        f"{model.metadata['rows']} point-in-time rows from client.offline_query (label: a "
        f"decline in the next {model.metadata['horizon']}), train accuracy "
        f"{model.metadata['train_accuracy']:.3f}; stored as {model.format}, "
        f"sha256 {model.sha256[:12]}...; inputs inferred: {', '.join(model.schema.inputs)}\n"
    )
    server = Server(free_port())
    try:
        server.wait_ready()
        print(f"kairos {kr.__version__}: fraud example served at {server.url}")
        print(f"queries are made as of {ANCHOR.isoformat()}\n")

        plan = server.call("POST", "/v1/query/plan", {"inputs": ["user.id"], "outputs": OUTPUTS})
        print("POST /v1/query/plan: the plan for user.risk and its inputs")
        print(plan["explain"])

        first = []
        for uid in ("u0001", "u0002", "u0003"):
            body = {"inputs": {"user.id": uid}, "outputs": OUTPUTS, "now": ANCHOR.isoformat()}
            result = server.call("POST", "/v1/query/online", body)
            first.append(result)
            meta = result["meta"]
            print(f"\nPOST /v1/query/online {uid}: query {result['query_id']}, "
                  f"{meta['duration_ms']:.2f} ms in the server")  # fmt: skip
            rows = [
                [name, f["value"], f["source"], f["observed_at"]]
                for name, f in result["features"].items()
            ]
            print(table(["feature", "value", "source", "observed_at"], rows))
            for error in result["errors"]:
                print(f"  error {error['feature']}: {error['code']}: {error['message']}")

        print("\nTrace of the first query (time per plan node, ms):")
        rows = [
            [t["node"] if t["node"] is not None else "", t["kind"], t["label"], t["start_ms"],
             t["duration_ms"]]
            for t in first[0]["trace"]
        ]  # fmt: skip
        print(table(["node", "kind", "label", "start", "duration"], rows))

        inputs = server.call(
            "POST", "/v1/query/online",
            {"inputs": {"user.id": "u0001"}, "outputs": list(model.schema.inputs),
             "now": ANCHOR.isoformat()},
        )["values"]  # fmt: skip
        direct = server.call("POST", "/v1/models/risk/predict", {"rows": [inputs], "alias": "prod"})
        print(
            f"\nPOST /v1/models/risk/predict with u0001's inputs: "
            f"{direct['predictions'][0]:.3f} from {direct['model']} (user.risk above: "
            f"{first[0]['values']['user.risk']:.3f})"
        )

        later = ANCHOR.replace(second=30).isoformat()
        again = server.call(
            "POST", "/v1/query/online",
            {"inputs": {"user.id": "u0001"}, "outputs": OUTPUTS, "now": later},
        )  # fmt: skip
        sources = sorted({f["source"] for f in again["features"].values()})
        print(
            f"\nSame user 30 s later: {again['meta']['cache_hits']} of {len(OUTPUTS)} features "
            f"from the cache (max_staleness 1m), sources {sources}"
        )

        everyone = [f"u{i:04d}" for i in range(1, 201)]
        started = time.perf_counter()
        bulk = server.call(
            "POST", "/v1/query/bulk",
            {"inputs": {"user.id": everyone}, "outputs": OUTPUTS, "now": ANCHOR.isoformat(),
             "staleness": {"user.risk": "0s"}},
        )  # fmt: skip
        elapsed = (time.perf_counter() - started) * 1000
        values = bulk["values"]
        order = sorted(range(len(everyone)), key=lambda i: -(values["user.risk"][i] or 0))
        print(
            f"\nPOST /v1/query/bulk: {bulk['rows']} users in {elapsed:.1f} ms over HTTP, "
            f"{len(bulk['errors'])} errors. Riskiest five:"
        )
        top = [[everyone[i], *[values[o][i] for o in OUTPUTS]] for i in order[:5]]
        print(table(["user", *OUTPUTS], top))

        query_id = first[0]["query_id"]
        logged = server.call("GET", f"/v1/log/{query_id}")
        print(f"\nGET /v1/log/{query_id}: what that decision saw")
        rows = [
            [name, v["value"], v["source"], v["version"]] for name, v in logged["outputs"].items()
        ]
        print(table(["feature", "value", "source", "version"], rows))

        metrics = server.call("GET", "/metrics").decode()
        hits = _metric(metrics, "kairos_cache_hits_total")
        misses = _metric(metrics, "kairos_cache_misses_total")
        requests = _metric(metrics, "kairos_requests_total")
        print(
            f"\nGET /metrics: {requests:.0f} requests, cache hit ratio "
            f"{hits / max(hits + misses, 1):.2f} ({hits:.0f} hits, {misses:.0f} computed)"
        )
        page = server.call("GET", f"/ui/decisions/{query_id}").decode()
        shown = sum(f'id="value-{name}"' in page for name in OUTPUTS)
        print(
            f"GET /ui/decisions/{query_id}: the dashboard's page for that decision, "
            f"{len(page):,} bytes of HTML showing {shown} of its {len(OUTPUTS)} outputs"
        )
    finally:
        output = server.stop()
    lines = output.strip().splitlines()
    stopped = [line for line in lines if "kairos stopped" in line] or lines[-1:] or ["no output"]
    access = sum(" kairos.access: " in line for line in lines)  # its log: one line a request
    print(f"\nServer stopped ({stopped[-1]}); its log on stderr has {access} access lines.")

    with kr.Client(PROJECT) as client:
        record = client.log.get(query_id)
        if record is None:
            raise SystemExit(f"query {query_id} is missing from the query log")
        # the model re-run on the values that decision logged (`kairos replay`)
        replayed = client.replay([query_id], recompute=["user.risk"])
    print(
        f"Read back from {PROJECT.name}/.kairos/query_log.db after the stop: query "
        f"{record.query_id} at {record.now.isoformat()} saw user.risk="
        f"{record.outputs['user.risk'].value:.3f} (`kairos log show {record.query_id}`)"
    )
    [risk] = [row for row in replayed.rows if row.feature == "user.risk"]
    vectors = [len(call["vector"]) for call in record.model_calls]
    print(
        f"Replayed from the {len(record.values)} values it logged (intermediates included; "
        f"model input vectors of {vectors} values): user.risk={risk.replayed:.3f}, "
        f"{'changed' if risk.changed else 'the same'} (`kairos replay --id {record.query_id}`)"
    )

    llm_demo.main("u0001")  # one question asked of the local LLM two ways

    print(
        "\nThe dashboard (features and lineage, decisions and traces, models, live freshness):"
        "\n  kairos serve examples/fraud   then open http://127.0.0.1:8000/ui"
    )


def _metric(text: str, name: str) -> float:
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(name) and not line.startswith("#")
    )


if __name__ == "__main__":
    main()
