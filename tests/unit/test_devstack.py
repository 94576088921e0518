"""The local broker's guard rails: clear errors before anything starts."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from prism.devstack import DevstackError, LocalKafka, free_port
from prism.devstack._kafka import _java_major


def test_a_taken_port_is_refused_with_its_number(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        with pytest.raises(DevstackError, match=f"port {port} on 127.0.0.1 is already in use"):
            LocalKafka(state_dir=tmp_path, port=port).up(timeout=5)


def test_old_java_is_refused(tmp_path: Path) -> None:
    fake = tmp_path / "java"
    fake.write_text("#!/bin/sh\necho 'openjdk version \"11.0.2\" 2019-01-15' >&2\n")
    fake.chmod(0o755)
    with pytest.raises(DevstackError, match="needs Java >= 17, found Java 11"):
        LocalKafka(state_dir=tmp_path, port=free_port(), java=str(fake)).up(timeout=5)


def test_java_versions_parse() -> None:
    assert _java_major(__import__("shutil").which("java") or "java") >= 17


def test_status_of_a_broker_never_started(tmp_path: Path) -> None:
    assert LocalKafka(state_dir=tmp_path, port=free_port()).status() == "stopped"
