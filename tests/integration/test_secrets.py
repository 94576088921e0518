"""Known secrets set everywhere, every path driven, and none of them found in any output.

The secrets: a SASL password, a ClickHouse DSN password (with an unencoded ``@`` and
``/``), a webhook URL whose path and query are its token, an OTLP endpoint with
credentials, and the account passwords of ``prism-pipeline grants``. Then:

- every command's ``--help``, settings errors, bad and unreachable DSNs (environment and
  ``--clickhouse``), a refused ``query``, ``grants`` (printed, and executed on chDB, which
  refuses it) run as subprocesses; their stdout, stderr and every file they wrote;
- the webhook notifier against a server that refuses with the URL in its reply, and against
  a closed port, with every logger at DEBUG (httpx logs each request URL at INFO);
- a real worker (Kafka broker, chDB ledger) with the secrets in its environment that raises
  alerts it cannot deliver: its log and every file of its state directory
  (``worker-stats.json``, the table store);

are searched for each secret and its distinctive parts.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from prism.devstack import free_port
from prism.pipeline.alerting import WebhookNotifier
from prism.pipeline.cli import COMMANDS, main
from prism.runtime.simulator import FleetConfig, simulate
from prism.sinks.testing import alert_row

pytestmark = pytest.mark.integration

SASL = "Kafk4-S4sl-Secret-pw"
DSN_PASSWORD = "Ch-Dsn-P@ss/w0rd-Secret"
WEBHOOK_TOKEN = "Wh00kT0kenSecretPath"
WEBHOOK_SIG = "SigQuerySecret42"
OTLP = "0tlp-Creds-Secret"
ACCOUNT_PASSWORDS = {
    "CLICKHOUSE_WRITER_PASSWORD": "Wr1ter-Acct-Secret",
    "CLICKHOUSE_READER_PASSWORD": "Re4der-Acct-Secret",
    "CLICKHOUSE_GRAFANA_PASSWORD": "Gr4fana-Acct-Secret",
}
# What must never appear: each secret, and the parts a half-masking would leave.
FORBIDDEN = [
    SASL, DSN_PASSWORD, "P@ss", "w0rd-Secret", WEBHOOK_TOKEN, WEBHOOK_SIG, OTLP,
    *ACCOUNT_PASSWORDS.values(),
]  # fmt: skip


def _webhook(port: int) -> str:
    return f"http://127.0.0.1:{port}/services/T0/{WEBHOOK_TOKEN}?sig={WEBHOOK_SIG}"


def _leaks(text: str) -> list[str]:
    return [secret for secret in FORBIDDEN if secret in text]


def _files(root: Path) -> dict[str, bytes]:
    return {str(p): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def _assert_clean(where: str, text: str) -> None:
    leaks = _leaks(text)
    assert not leaks, f"{where} shows {leaks}:\n{text[-2000:]}"


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PRISM_")}
    env.update(
        PRISM_KAFKA_SECURITY_PROTOCOL="SASL_SSL",
        PRISM_KAFKA_SASL_USERNAME="prism",
        PRISM_KAFKA_SASL_PASSWORD=SASL,
        PRISM_ALERT_WEBHOOK_URL=_webhook(9),
        PRISM_OTEL_EXPORTER="otlp",
        PRISM_OTEL_ENDPOINT=f"http://otel:{OTLP}@127.0.0.1:9",
        **ACCOUNT_PASSWORDS,
    )
    env.update(extra)
    return env


def _cli(cwd: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "prism.pipeline.cli", *args],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


def _in_process(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], env: dict[str, str],
    args: tuple[str, ...],
) -> tuple[int, str]:  # fmt: skip
    for name in [n for n in os.environ if n.startswith(("PRISM_", "CLICKHOUSE_"))]:
        monkeypatch.delenv(name)
    for name, value in env.items():
        if name.startswith(("PRISM_", "CLICKHOUSE_")):
            monkeypatch.setenv(name, value)
    try:
        code = main(list(args))
    except SystemExit as exit_:  # --help
        code = int(exit_.code or 0)
    out = capsys.readouterr()
    return code, out.out + out.err


def test_no_command_prints_a_secret(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.chdir(tmp_path)
    dead = free_port()
    unreachable = f"http://prism:{DSN_PASSWORD}@127.0.0.1:{dead}/prism"
    cases: list[tuple[dict[str, str], tuple[str, ...], bool]] = [
        (_env(), ("--help",), True),
        *((_env(), (c, "--help"), True) for c in COMMANDS),
        # settings errors, with every secret set
        (_env(PRISM_PARTITIONS="zero"), ("query", "SELECT 1"), False),
        (_env(PRISM_KAFKA_SASL_USERNAME=""), ("migrate",), False),
        (_env(PRISM_ALERT_WEBHOOK_URL=f"ftp://h/{WEBHOOK_TOKEN}"), ("query", "SELECT 1"), False),
        # bad DSNs in every form, from the environment and from --clickhouse
        *(
            (_env(PRISM_CLICKHOUSE_DSN=dsn), ("query", "SELECT 1"), False)
            for dsn in (
                f"htp://prism:{DSN_PASSWORD}@h/prism",
                f"clickhouses://prism:{DSN_PASSWORD}@127.0.0.1:{dead}/prism",
                f"https://prism:{DSN_PASSWORD}@h:99999/prism",
                f"https://prism:{DSN_PASSWORD}@h/my-db",
                f"prism:{DSN_PASSWORD}@h:8123",
                unreachable,
            )
        ),
        (_env(), ("query", "--clickhouse", unreachable, "SELECT 1"), False),
        (_env(), ("migrate", "--clickhouse", unreachable), False),
        (_env(), ("billing", "--from", "2026-01-01", "--to", "2026-02-01",
                  "--clickhouse", f"htp://prism:{DSN_PASSWORD}@h/prism"), False),
        (_env(PRISM_CLICKHOUSE_DSN=unreachable), ("query", "DROP TABLE runs_store"), False),
        # the accounts: printed with placeholders, or refused by an unreachable server
        (_env(), ("grants", "--tenant", "acme"), True),
        (_env(), ("grants", "--execute", "--clickhouse", unreachable), False),
    ]  # fmt: skip
    caplog.set_level(logging.DEBUG)
    for env, args, ok in cases:
        code, output = _in_process(monkeypatch, capsys, env, args)
        where = f"prism-pipeline {' '.join(args)}"
        assert (code == 0) is ok, f"{where}: exit {code}\n{output}"
        assert "Traceback" not in output, f"{where}:\n{output}"
        _assert_clean(where, output)
    _assert_clean("the log", "\n".join(r.getMessage() for r in caplog.records))
    assert not _files(tmp_path), "nothing was written"


def test_grants_executed_where_it_cannot_work_names_no_password(tmp_path: Path) -> None:
    """chDB refuses CREATE ROLE: the error is one line, the passwords stay unprinted."""
    env = _env(CLICKHOUSE_GRAFANA_ACME_PASSWORD="Gr4fana-Acct-Secret")
    result = _cli(
        tmp_path, env, "grants", "--execute", "--tenant", "acme",
        "--clickhouse", f"chdb://{tmp_path}/ledger",
    )  # fmt: skip
    assert result.returncode == 1 and "grant statement 1/" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr and len(result.stderr.splitlines()) == 1
    _assert_clean("grants --execute", result.stdout + result.stderr)
    for path, content in _files(tmp_path).items():
        _assert_clean(path, content.decode("utf-8", "replace"))


async def test_the_webhook_notifier_never_logs_its_url(caplog: pytest.LogCaptureFixture) -> None:
    async def refuse(request: web.Request) -> web.Response:  # echoes what it was sent
        return web.Response(status=403, text=f"forbidden: {request.path_qs} {request.url}")

    app = web.Application()
    app.router.add_post("/services/T0/{token}", refuse)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    caplog.set_level(logging.DEBUG)
    try:
        for url in (_webhook(port), _webhook(free_port())):
            notifier = WebhookNotifier(url, timeout=2, retries=1, backoff=0.01)
            _assert_clean("repr/str of the notifier's URL", f"{notifier.url!r} {notifier.url}")
            await notifier([alert_row("a1"), alert_row("a2", state="resolved")])
            await notifier.drain()
            await notifier.aclose()
            assert notifier.stats["failed"] == 2
    finally:
        await runner.cleanup()
    logged = "\n".join(  # the receiver's own access log is not ours
        f"{r.name} {r.getMessage()} {r.exc_text or ''}"
        for r in caplog.records
        if not r.name.startswith("aiohttp")
    )
    assert "127.0.0.1" in logged and "refused" in logged, "the notifier logged its failures"
    assert "HTTP Request: POST http://127.0.0.1" in logged, "httpx's request log is covered"
    _assert_clean("the notifier's log", logged)


def test_a_worker_with_secrets_logs_and_writes_none(lab: Any) -> None:
    settings = lab.settings(
        "secret-worker",
        alert_webhook_url=_webhook(free_port()),
        alert_limit_deaths_threshold=1,
        kafka_sasl_username="prism",
        kafka_sasl_password=SASL,
        otel_exporter="console",
    )
    fleet = simulate(FleetConfig(runs=60, seed=3))
    lab.publish(fleet, settings)
    worker = lab.worker(settings, "secret-worker")
    lab.drain(worker, settings)
    worker.stop()
    log = worker.log_path.read_text(errors="replace")
    assert "prism.worker.batch" in log, "console spans were exported (attributes included)"
    assert "alert webhook delivery" in log, "alerts were raised and their delivery failed"
    _assert_clean("the worker's log", log)
    state = _files(settings.state_dir)
    assert any(p.endswith("worker-stats.json") for p in state)
    for path, content in state.items():
        _assert_clean(path, content.decode("utf-8", "replace"))
