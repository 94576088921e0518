"""The worker's HTTP endpoint: ``GET /metrics`` for Prometheus and ``GET /healthz``.

A small threaded server beside the worker's event loop (it never touches the loop): it reads
the worker's ``WorkerTelemetry`` (its Prometheus registry and its health), so a scrape or a
probe cannot slow a batch down. ``/healthz`` answers 200 with JSON figures while the
worker runs and 503 once it is stopping. Address: ``PRISM_METRICS_HOST`` and
``PRISM_METRICS_PORT`` (0 turns the endpoint off).

Example::

    server = MetricsServer(worker.telemetry, "127.0.0.1", 9464).start()
    ...
    server.stop()
"""

from __future__ import annotations

import json
import logging
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

__all__ = ["METRICS_CONTENT_TYPE", "MetricsServer", "MetricsServerError"]

log = logging.getLogger("prism.worker")

# The Prometheus text exposition format, version 0.0.4.
METRICS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class MetricsServerError(RuntimeError):
    """The metrics endpoint could not listen on its address; the message names it."""


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        if path == "/metrics":
            self._send(200, METRICS_CONTENT_TYPE, self.server.telemetry.metrics_text())
        elif path == "/healthz":
            healthy, doc = self.server.telemetry.health()
            body = json.dumps(doc).encode()
            self._send(200 if healthy else 503, "application/json", body)
        else:
            self._send(404, "text/plain; charset=utf-8", b"not found: try /metrics or /healthz\n")

    def _send(self, status: int, content_type: str, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("metrics endpoint: " + format, *args)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    telemetry: Any


class MetricsServer:
    """Serves ``telemetry`` on ``host:port`` in a daemon thread (port 0: any free port)."""

    def __init__(self, telemetry: Any, host: str, port: int) -> None:
        self.telemetry = telemetry
        self.host, self.port = host, port
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def address(self) -> tuple[str, int]:
        """Where it listens (the actual port when 0 was asked for)."""
        if self._server is None:
            return self.host, self.port
        host, port = self._server.server_address[:2]
        return str(host), int(port)

    def start(self) -> MetricsServer:
        try:
            server = _Server((self.host, self.port), _Handler)
        except OSError as exc:
            raise MetricsServerError(
                f"cannot serve /metrics on {self.host}:{self.port} ({exc.strerror or exc}); "
                "set PRISM_METRICS_PORT to a free port, or 0 to turn the endpoint off"
            ) from None
        server.telemetry = self.telemetry
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever, name="prism-metrics", daemon=True
        )
        self._thread.start()
        host, port = self.address
        log.info("serving /metrics and /healthz on http://%s:%d", host, port)
        return self

    def stop(self) -> None:
        if self._server is None:
            return
        self._server.shutdown()
        self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._server = self._thread = None
