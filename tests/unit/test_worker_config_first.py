"""The worker checks its configuration before it does anything on the broker."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from prism.pipeline.cli import EXIT_USAGE, main


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_the_worker_checks_the_ledger_before_it_touches_the_broker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from prism.pipeline import topics

    created: list[str] = []

    async def ensure_topics(settings: object) -> list[str]:
        created.append("topics")  # a side effect on the broker
        return []

    monkeypatch.setattr(topics, "ensure_topics", ensure_topics)
    missing = tmp_path / "nonexistent" / "ledger"
    code = main(["worker", "--clickhouse", f"chdb://{missing}",
                 "--bootstrap", f"127.0.0.1:{_closed_port()}", "--state-store", "memory",
                 "--state-dir", str(tmp_path / "state")])  # fmt: skip
    err = capsys.readouterr().err
    assert code == EXIT_USAGE, err
    assert f"the parent directory '{missing.parent}'" in err and len(err.splitlines()) == 1
    assert created == []  # nothing was done on the broker
