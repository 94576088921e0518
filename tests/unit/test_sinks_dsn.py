"""DSN parsing, identifier checks and error classification of ``sinks`` (no engine needed)."""

from __future__ import annotations

from pathlib import Path

import pytest
from clickhouse_connect.driver.exceptions import DatabaseError, OperationalError

from prism import sinks
from prism.sinks import LedgerConfigError, LedgerConnectError, SecretDsn, parse_dsn, redact_dsn
from prism.sinks._errors import is_transient


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
    assert (target.username, target.database) == ("alice", "prism")
    assert target.password is not None and target.password.get_secret_value() == "s@cret"
    assert "s@cret" not in repr(target)


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
        ("http://ch.example.com/my-db", "'my-db', which is not a plain identifier"),
        ("", "is empty"),
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


@pytest.mark.parametrize(
    ("dsn", "user", "password", "host", "port", "database"),
    [
        (
            "https://prism:S3c@r3t@ch.example:8443/prism",
            "prism",
            "S3c@r3t",
            "ch.example",
            8443,
            "prism",
        ),
        ("https://prism:a/b/c@ch.example/prism", "prism", "a/b/c", "ch.example", 8443, "prism"),
        ("http://prism:p?x:y@ch.example:8123", "prism", "p?x:y", "ch.example", 8123, None),
        ("clickhouses://u:p%2Fq@h/db?x=1", "u", "p/q", "h", 8443, "db"),
        ("clickhouse://h", None, None, "h", 8123, None),
        ("http://[::1]:8123/prism", None, None, "::1", 8123, "prism"),
    ],
)
def test_passwords_may_hold_any_character(
    dsn: str, user: str | None, password: str | None, host: str, port: int, database: str | None
) -> None:
    target = parse_dsn(SecretDsn(dsn))
    assert (target.username, target.host, target.port, target.database) == (
        user, host, port, database,
    )  # fmt: skip
    got = target.password.get_secret_value() if target.password else None
    assert got == password
    if password:
        assert password not in redact_dsn(dsn) and password not in str(SecretDsn(dsn))


@pytest.mark.parametrize(
    ("dsn", "shown"),
    [
        ("https://u:p@h:1/db", "https://u:***@h:1/db"),
        ("https://prism:S3c@r/et@ch:8443/prism", "https://prism:***@ch:8443/prism"),
        ("htp://u:pw@h/db", "htp://u:***@h/db"),
        ("u:pw@h:8123", "u:***@h:8123"),
        ("https://u@h/db", "https://u@h/db"),
        ("https://h/db", "https://h/db"),
        ("chdb:///var/lib/prism/ledger", "chdb:///var/lib/prism/ledger"),
    ],
)
def test_redact_dsn_masks_every_form(dsn: str, shown: str) -> None:
    assert redact_dsn(dsn) == shown
    assert repr(SecretDsn(dsn)) == f"SecretDsn({shown!r})"


@pytest.mark.parametrize(
    ("dsn", "message"),
    [
        ("htp://u:topsecret@h/db", "unsupported scheme 'htp'"),
        ("https://u:top@secret@h:99999/db", "bad port"),
        ("https://u:top/secret@/db", "names no host"),
        ("https://u:top/secret@h/my-db", "percent-encode it"),
        ("u:topsecret@h:8123", "has no scheme"),
    ],
)
def test_no_dsn_error_shows_any_part_of_the_password(dsn: str, message: str) -> None:
    with pytest.raises(LedgerConfigError, match=message) as info:
        parse_dsn(dsn)
    for part in ("topsecret", "top@secret", "top/secret", "secret@"):
        assert part not in str(info.value)


def test_a_missing_absolute_chdb_parent_is_refused_not_created(tmp_path: Path) -> None:
    target = tmp_path / "nonexistent" / "deeper" / "ledger"
    with pytest.raises(LedgerConfigError, match="does not exist; create it first") as info:
        sinks.connect(f"chdb://{target}")
    assert str(target.parent) in str(info.value)
    assert not (tmp_path / "nonexistent").exists()


def test_an_unusable_chdb_path_is_one_line(tmp_path: Path) -> None:
    afile = tmp_path / "afile"
    afile.write_text("x")
    with pytest.raises(LedgerConfigError, match="is a file"):
        sinks.connect(f"chdb://{afile}")
    with pytest.raises(LedgerConfigError) as info:
        sinks.connect("chdb:///proc/prism-ledger")
    message = str(info.value)
    assert "/proc/prism-ledger" in message and "writable" in message
    assert "\n" not in message and "Stack trace" not in message


def test_engine_errors_lose_their_stack_trace() -> None:
    from prism.sinks._client import engine_error

    exc = RuntimeError(
        "Code: 36. DB::Exception: bad thing, Stack trace (when copying):\n0. x\n1. y"
    )
    assert engine_error(exc) == "Code: 36. DB::Exception: bad thing"
    assert issubclass(LedgerConnectError, sinks.LedgerError)
