"""The worker's /metrics (Prometheus text) and /healthz endpoint, scraped over HTTP."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import httpx
import pytest

from prism.pipeline.worker._http import MetricsServer, MetricsServerError
from prism.pipeline.worker._telemetry import WorkerTelemetry


def _sample(text: str, name: str, **labels: str) -> float:
    """The value of one sample line of the exposition ``text``."""
    for line in text.splitlines():
        if line.startswith("#") or not line.startswith(name):
            continue
        head, _, value = line.rpartition(" ")
        metric, _, label_text = head.partition("{")
        if metric == name and all(f'{k}="{v}"' in label_text for k, v in labels.items()):
            return float(value)
    raise AssertionError(f"no sample {name}{labels} in:\n{text}")


@pytest.fixture
def served(tmp_path: Path):
    now = [1000.0]
    telemetry = WorkerTelemetry(tmp_path / "worker-stats.json", clock=lambda: now[0])
    server = MetricsServer(telemetry, "127.0.0.1", 0).start()
    host, port = server.address
    try:
        yield telemetry, f"http://{host}:{port}", now
    finally:
        server.stop()


@pytest.mark.timeout(30)
def test_metrics_are_scraped_in_the_prometheus_text_format(served) -> None:
    telemetry, base, now = served
    telemetry.consumed(40)
    telemetry.outcomes(Counter({"applied": 37, "dlq.unparsable": 2, "quarantine.post_terminal": 1}))
    telemetry.lag.update({0: 12, 3: 5})
    now[0] += 7.5
    response = httpx.get(f"{base}/metrics", timeout=5)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
    text = response.text
    assert _sample(text, "prism_consumer_lag", partition="0") == 12
    assert _sample(text, "prism_consumer_lag", partition="3") == 5
    assert _sample(text, "prism_events_consumed_total") == 40
    assert _sample(text, "prism_events_outcome_total", outcome="dlq.unparsable") == 2
    assert _sample(text, "prism_batch_age_seconds") == pytest.approx(7.5)
    assert "# TYPE prism_consumer_lag gauge" in text


@pytest.mark.timeout(30)
def test_healthz_is_ok_while_running_and_503_once_stopping(served) -> None:
    telemetry, base, now = served
    telemetry.consumed(3)
    telemetry.lag[1] = 9
    now[0] += 2
    ok = httpx.get(f"{base}/healthz", timeout=5)
    assert ok.status_code == 200
    body = ok.json()
    assert (body["status"], body["events"], body["lag"]) == ("ok", 3, 9)
    assert body["last_batch_age_s"] == pytest.approx(2.0)
    telemetry.stopped()
    stopping = httpx.get(f"{base}/healthz", timeout=5)
    assert (stopping.status_code, stopping.json()["status"]) == (503, "stopping")
    assert httpx.get(f"{base}/nope", timeout=5).status_code == 404


def test_a_taken_port_is_named(served) -> None:
    telemetry, base, _ = served
    port = int(base.rsplit(":", 1)[1])
    with pytest.raises(MetricsServerError, match=f"127.0.0.1:{port}.*PRISM_METRICS_PORT"):
        MetricsServer(telemetry, "127.0.0.1", port).start()
