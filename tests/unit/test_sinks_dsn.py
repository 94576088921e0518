"""DSN parsing, identifier checks and error classification of ``sinks`` (no engine needed)."""

from __future__ import annotations

from pathlib import Path

import pytest
from clickhouse_connect.driver.exceptions import DatabaseError, OperationalError

from prism import sinks
from prism.sinks import LedgerConfigError, parse_dsn
from prism.sinks._errors import is_transient, redact_dsn


def test_relative_chdb_path_resolves_against_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    target = parse_dsn("chdb://./.data/ledger")
    assert target.kind == "chdb"
    assert target.path == str(tmp_path.resolve() / ".data" / "ledger")
    assert parse_dsn("chdb://.data/ledger").path == target.path


def test_absolute_chdb_path_is_normalised(tmp_path: Path) -> None:
    assert parse_dsn(f"chdb://{tmp_path}/ledger/").path == str(tmp_path.resolve() / "ledger")


@pytest.mark.parametrize("dsn", ["chdb://", "chdb://memory", "chdb://:memory:"])
def test_in_memory_chdb(dsn: str) -> None:
    assert parse_dsn(dsn).path == ":memory:"


def test_http_dsn_carries_credentials_port_and_database() -> None:
    target = parse_dsn("https://alice:s%40cret@ch.example.com:9440/prism")
    assert (target.kind, target.host, target.port, target.secure) == (
        "http",
        "ch.example.com",
        9440,
        True,
    )
    assert (target.username, target.password, target.database) == ("alice", "s@cret", "prism")


def test_http_default_ports() -> None:
    assert parse_dsn("http://ch.example.com").port == 8123
    assert parse_dsn("https://ch.example.com").port == 8443
    assert parse_dsn("http://ch.example.com").database is None


@pytest.mark.parametrize(
    ("dsn", "message"),
    [
        ("localhost:8123", "has no scheme"),
        ("mysql://db.example.com/prism", "unsupported scheme 'mysql'"),
        ("http://ch.example.com:99999/prism", "bad port"),
        ("http:///prism", "names no host"),
        ("http://ch.example.com/my-db", "'my-db' is not a plain identifier"),
    ],
)
def test_bad_dsn_is_a_config_error_naming_the_dsn(dsn: str, message: str) -> None:
    with pytest.raises(LedgerConfigError, match=message):
        parse_dsn(dsn)


def test_error_messages_never_show_the_password() -> None:
    with pytest.raises(LedgerConfigError) as info:
        parse_dsn("http://bob:topsecret@ch.example.com:99999/prism")
    assert "topsecret" not in str(info.value)
    assert "bob:***@" in str(info.value)
    assert redact_dsn("https://u:p@h:1/db") == "https://u:***@h:1/db"


def test_connect_rejects_a_bad_database_name_before_connecting() -> None:
    with pytest.raises(LedgerConfigError, match="'prism; DROP' is not a plain identifier"):
        sinks.connect("chdb://memory", "prism; DROP")


@pytest.mark.parametrize(
    ("exc", "transient"),
    [
        (ConnectionError("reset"), True),
        (TimeoutError(), True),
        (OperationalError("HTTP transport failed"), True),
        (DatabaseError("Too many parts", code=252), True),
        (DatabaseError("Timeout exceeded", code=159), True),
        (DatabaseError("Unknown table", code=60), False),
        (DatabaseError("Cannot parse input", code=27), False),
        (ValueError("bad value"), False),
    ],
)
def test_transient_errors_are_the_ones_worth_retrying(exc: BaseException, transient: bool) -> None:
    assert is_transient(exc) is transient


def test_exports_are_importable() -> None:
    for name in sinks.__all__:
        assert hasattr(sinks, name), name
    assert issubclass(sinks.LedgerConfigError, ValueError)
    for cls in (sinks.LedgerWriteError, sinks.MigrationError, sinks.LedgerQueryError):
        assert issubclass(cls, sinks.LedgerError)


def test_an_unreachable_server_is_a_connect_error_without_the_password() -> None:
    from prism.devstack import free_port

    port = free_port()  # nothing listens there
    with pytest.raises(sinks.LedgerConnectError, match=f"127.0.0.1:{port}") as info:
        sinks.connect(f"http://bob:topsecret@127.0.0.1:{port}/prism", "prism")
    assert "topsecret" not in str(info.value)
