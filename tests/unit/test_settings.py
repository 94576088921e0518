"""Settings: defaults run on a laptop; a bad value fails at start naming the variable and value."""

from __future__ import annotations

from pathlib import Path

import pytest

from prism.pipeline import settings as settings_module
from prism.pipeline.settings import SettingsError, Topics, load_settings, unknown_variables
from prism.schemas import DEFAULT_DENY


def test_defaults_run_locally(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(__import__("os").environ):
        if name.startswith("PRISM_"):
            monkeypatch.delenv(name)
    s = load_settings()
    assert s.kafka_bootstrap_servers == "127.0.0.1:9092"
    assert s.clickhouse_dsn.get_secret_value() == "chdb://./.data/ledger"
    assert s.clickhouse_database == "prism"
    assert (s.max_clock_skew_seconds, s.channel_stuck_seconds) == (300.0, 300.0)
    assert s.redact_keys == DEFAULT_DENY and s.alert_webhook_url is None
    assert s.topics == Topics(
        "prism.agent-events", "prism.agent-events.dlq", "prism.agent-events.quarantine",
        "prism.runs.closed", "prism.alerts", "prism.limit-deaths", "prism.lane-marks",
    )  # fmt: skip
    assert s.aiokafka_kwargs() == {
        "bootstrap_servers": "127.0.0.1:9092",
        "security_protocol": "PLAINTEXT",
    }


def test_environment_overrides(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PRISM_TOPIC_PREFIX", "staging")
    monkeypatch.setenv("PRISM_PARTITIONS", "12")
    s = load_settings()
    assert (s.topics.input, s.partitions) == ("staging.agent-events", 12)


@pytest.mark.parametrize(
    ("env", "value", "fragment"),
    [
        ("PRISM_PARTITIONS", "zero", "PRISM_PARTITIONS='zero'"),
        ("PRISM_PARTITIONS", "0", "PRISM_PARTITIONS='0'"),
        ("PRISM_KAFKA_BOOTSTRAP_SERVERS", "localhost", "PRISM_KAFKA_BOOTSTRAP_SERVERS='localhost'"),
        ("PRISM_CLICKHOUSE_DSN", "postgres://x", "PRISM_CLICKHOUSE_DSN='postgres://x'"),
        ("PRISM_CLICKHOUSE_DSN", "localhost:8123", "has no scheme"),
        ("PRISM_TOPIC_PREFIX", "bad prefix", "PRISM_TOPIC_PREFIX='bad prefix'"),
        ("PRISM_STATE_STORE", "redis", "PRISM_STATE_STORE='redis'"),
        ("PRISM_CONSUMER_GROUP_INSTANCE_ID", "worker 1", "PRISM_CONSUMER_GROUP_INSTANCE_ID="),
        ("PRISM_KAFKA_COMPRESSION", "brotli", "PRISM_KAFKA_COMPRESSION='brotli'"),
    ],
)
def test_bad_values_name_the_variable_and_the_value(
    monkeypatch: pytest.MonkeyPatch, env: str, value: str, fragment: str
) -> None:
    monkeypatch.setenv(env, value)
    with pytest.raises(SettingsError) as err:
        load_settings()
    assert fragment in str(err.value)


def test_sasl_needs_credentials_and_hides_the_password(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PRISM_KAFKA_SECURITY_PROTOCOL", "SASL_SSL")
    with pytest.raises(SettingsError, match="PRISM_KAFKA_SASL_USERNAME"):
        load_settings()
    monkeypatch.setenv("PRISM_KAFKA_SASL_USERNAME", "prism")
    monkeypatch.setenv("PRISM_KAFKA_SASL_PASSWORD", "s3cret")
    s = load_settings()
    assert "s3cret" not in repr(s)
    kw = s.aiokafka_kwargs()
    assert (kw["sasl_mechanism"], kw["sasl_plain_password"]) == ("SCRAM-SHA-512", "s3cret")
    assert kw["ssl_context"] is not None


def test_settings_are_frozen() -> None:
    s = load_settings()
    with pytest.raises(Exception, match="frozen"):
        s.partitions = 8  # type: ignore[misc]


@pytest.fixture(autouse=True)
def _no_prism_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(__import__("os").environ):
        if name.startswith("PRISM_"):
            monkeypatch.delenv(name)


DURATIONS = [
    "PRISM_BATCH_MAX_SECONDS",
    "PRISM_GRACE_PERIOD_SECONDS",
    "PRISM_STALE_RUN_SECONDS",
    "PRISM_TOMBSTONE_RETENTION_SECONDS",
    "PRISM_MAX_CLOCK_SKEW_SECONDS",
    "PRISM_CHANNEL_STUCK_SECONDS",
    "PRISM_ALERT_WINDOW_SECONDS",
]


@pytest.mark.parametrize("env", DURATIONS)
@pytest.mark.parametrize(
    ("value", "why"),
    [
        ("inf", "finite"),
        ("-inf", "finite"),
        ("nan", "finite"),
        ("1e400", "finite"),
        ("-1", "greater than"),
        ("1e12", "less than or equal"),
    ],
)
def test_every_duration_is_finite_and_bounded(
    monkeypatch: pytest.MonkeyPatch, env: str, value: str, why: str
) -> None:
    monkeypatch.setenv(env, value)
    with pytest.raises(SettingsError) as err:
        load_settings()
    assert f"{env}='{value}'" in str(err.value) and why in str(err.value)


def test_new_durations_are_read(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PRISM_MAX_CLOCK_SKEW_SECONDS", "60")
    monkeypatch.setenv("PRISM_CHANNEL_STUCK_SECONDS", "900.5")
    s = load_settings()
    assert (s.max_clock_skew_seconds, s.channel_stuck_seconds) == (60.0, 900.5)


def test_redact_keys_replace_or_extend_the_deny_list(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PRISM_REDACT_KEYS", "notes, *_body")
    assert load_settings().redact_keys == frozenset({"notes", "*_body"})
    monkeypatch.setenv("PRISM_REDACT_KEYS", "+notes")
    assert load_settings().redact_keys == DEFAULT_DENY | {"notes"}
    monkeypatch.setenv("PRISM_REDACT_KEYS", "two words")
    with pytest.raises(SettingsError, match="PRISM_REDACT_KEYS='two words'"):
        load_settings()


@pytest.mark.parametrize(
    "url", ["notaurl", "ftp://hooks.example/x", "https://", "http://:80/x", "https://h:0/x"]
)
def test_a_webhook_url_must_be_http(monkeypatch: pytest.MonkeyPatch, url: str) -> None:
    monkeypatch.setenv("PRISM_ALERT_WEBHOOK_URL", url)
    with pytest.raises(SettingsError, match=r"PRISM_ALERT_WEBHOOK_URL=.*http\(s\)://host"):
        load_settings()


def test_the_webhook_url_is_a_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    url = "https://hooks.example.com/services/T000/B000/XXXXsecretXXXX?sig=abc123"
    monkeypatch.setenv("PRISM_ALERT_WEBHOOK_URL", url)
    s = load_settings()
    assert s.alert_webhook_url is not None and s.alert_webhook_url.get_secret_value() == url
    assert str(s.alert_webhook_url) == "https://hooks.example.com/***"
    assert "XXXXsecret" not in repr(s) and "abc123" not in repr(s)
    monkeypatch.setenv("PRISM_PARTITIONS", "0")  # another error: the URL stays hidden
    with pytest.raises(SettingsError) as err:
        load_settings()
    assert "XXXXsecret" not in str(err.value)


@pytest.mark.parametrize(
    ("dsn", "shown"),
    [
        (
            "https://prism:S3c@r3t@ch.example:99999/prism",
            "https://prism:***@ch.example:99999/prism",
        ),
        ("https://prism:S3c/r3t@ch.example:99999/x", "https://prism:***@ch.example:99999/x"),
        ("htp://prism:S3cr3t@ch.example/prism", "htp://prism:***@ch.example/prism"),
        ("prism:S3cr3t@ch.example:8123", "prism:***@ch.example:8123"),
        ("https://prism:S3c%40r3t@ch.example/my-db", "https://prism:***@ch.example/my-db"),
    ],
)
def test_dsn_errors_mask_the_password_in_every_form(
    monkeypatch: pytest.MonkeyPatch, dsn: str, shown: str
) -> None:
    monkeypatch.setenv("PRISM_CLICKHOUSE_DSN", dsn)
    with pytest.raises(SettingsError) as err:
        load_settings()
    message = str(err.value)
    assert f"PRISM_CLICKHOUSE_DSN={shown!r}" in message
    for secret in ("S3cr3t", "S3c@r3t", "S3c/r3t", "S3c%40r3t", "r3t@"):
        assert secret not in message, message


def test_dsn_schemes_agree_with_the_ledger_parser(monkeypatch: pytest.MonkeyPatch) -> None:
    from prism.sinks import parse_dsn

    for dsn in ("clickhouses://u:pw@h/db", "clickhouse://h:9000", "chdb://", "https://h"):
        monkeypatch.setenv("PRISM_CLICKHOUSE_DSN", dsn)
        assert load_settings().clickhouse_dsn.get_secret_value() == dsn
        parse_dsn(dsn)  # accepted by both, or by neither
    s = load_settings(clickhouse_dsn="https://prism:p%40ss/w@rd@h:8443/prism")
    assert "p%40ss" not in repr(s) and "w@rd" not in repr(s)
    assert "SecretDsn('https://prism:***@h:8443/prism')" in repr(s)


def test_sasl_error_never_shows_the_password(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PRISM_KAFKA_SECURITY_PROTOCOL", "SASL_SSL")
    monkeypatch.setenv("PRISM_KAFKA_SASL_PASSWORD", "Kafk4Secret")
    monkeypatch.setenv("PRISM_PARTITIONS", "x")
    with pytest.raises(SettingsError) as err:
        load_settings()
    assert "Kafk4Secret" not in str(err.value)
    assert "PRISM_PARTITIONS='x'" in str(err.value)


def test_unknown_prism_variables_are_reported_with_the_closest_name(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    environ = {
        "PRISM_GRACE_PERIOD_SECNDS": "5",
        "PRISM_KAFKA_PORT": "9092",  # a dev-tool variable, not a typo
        "PRISM_PARTITIONS": "4",
        "PRISM_ZZZ": "1",
    }
    assert unknown_variables(environ) == [
        ("PRISM_GRACE_PERIOD_SECNDS", "PRISM_GRACE_PERIOD_SECONDS"),
        ("PRISM_ZZZ", None),
    ]
    monkeypatch.setattr(settings_module, "_reported_unknown", set())
    monkeypatch.setenv("PRISM_MAX_CLOCK_SKEW", "60")
    with caplog.at_level("WARNING", logger="prism.settings"):
        load_settings()
        load_settings()  # once per process
    lines = [r.getMessage() for r in caplog.records if "PRISM_MAX_CLOCK_SKEW" in r.getMessage()]
    assert lines == [
        "PRISM_MAX_CLOCK_SKEW is not a prism-pipeline setting and is ignored; "
        "did you mean PRISM_MAX_CLOCK_SKEW_SECONDS?"
    ]


def test_an_empty_webhook_url_means_none(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PRISM_ALERT_WEBHOOK_URL", "")
    monkeypatch.setenv("PRISM_OTEL_ENDPOINT", " ")
    s = load_settings()
    assert (s.alert_webhook_url, s.otel_endpoint) == (None, None)


def test_worker_env_reproduces_the_settings_in_a_child(monkeypatch: pytest.MonkeyPatch) -> None:
    from prism.pipeline.topics import worker_env

    settings = load_settings(
        kafka_security_protocol="SASL_PLAINTEXT",
        kafka_sasl_username="prism",
        kafka_sasl_password="pw",
        clickhouse_dsn="https://u:p@ss@h:8443/prism",
        alert_webhook_url="https://hooks.example/t0ken",
        redact_keys=frozenset({"notes", "*_body"}),
        max_clock_skew_seconds=12.5,
    )
    for name, value in worker_env(settings).items():
        monkeypatch.setenv(name, value)
    assert load_settings() == settings


def test_the_readme_documents_every_setting() -> None:
    from prism.pipeline.settings import Settings

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text(encoding="utf-8")
    table = readme.split("## Configuration", 1)[1].split("\n## ", 1)[0]
    missing = [
        f"PRISM_{n.upper()}" for n in Settings.model_fields if f"PRISM_{n.upper()}" not in table
    ]
    assert missing == []


def test_a_bad_kafka_port_variable_breaks_no_help(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from prism.pipeline.cli import main

    monkeypatch.setenv("PRISM_KAFKA_PORT", "abc")
    with pytest.raises(SystemExit) as done:
        main(["--help"])
    assert done.value.code == 0 and "devstack" in capsys.readouterr().out
    assert main(["devstack", "kafka", "status"]) == 2  # a usage error, in one line
    err = capsys.readouterr().err
    assert "'abc'" in err and "Traceback" not in err


def test_a_chdb_path_with_a_missing_parent_is_refused_by_the_cli(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from prism.pipeline.cli import main

    missing = tmp_path / "nonexistent" / "x"
    # a command that writes the ledger names the missing parent
    assert main(["migrate", "--clickhouse", f"chdb://{missing}"]) == 2
    err = capsys.readouterr().err
    assert f"the parent directory '{missing.parent}'" in err and len(err.splitlines()) == 1
    assert not missing.parent.exists()
    # one that only reads says there is no ledger there, and creates nothing either
    assert main(["query", "--clickhouse", f"chdb://{missing}", "SELECT 1"]) == 2
    err = capsys.readouterr().err
    assert f"no ledger at {missing}" in err and len(err.splitlines()) == 1
    assert not missing.parent.exists()
    assert main(["query", "--clickhouse", "chdb:///proc/prism-x", "SELECT 1"]) == 2
    err = capsys.readouterr().err
    assert "/proc/prism-x" in err and len(err.splitlines()) == 1 and "Stack" not in err


def test_a_named_worker_is_a_static_member_and_its_outputs_are_compressed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from prism.pipeline.worker._checkpoint import Transactions
    from prism.pipeline.worker._consumer import KafkaGroupConsumer

    monkeypatch.setenv("PRISM_CONSUMER_GROUP_INSTANCE_ID", "worker-1")
    s = load_settings()
    assert KafkaGroupConsumer.of(s, "g", {}).instance_id == "worker-1"
    assert Transactions.of(s, "g", {}).compression == "zstd"
    monkeypatch.delenv("PRISM_CONSUMER_GROUP_INSTANCE_ID")
    monkeypatch.setenv("PRISM_KAFKA_COMPRESSION", "none")
    s = load_settings()
    assert KafkaGroupConsumer.of(s, "g", {}).instance_id is None  # a dynamic member
    assert Transactions.of(s, "g", {}).compression is None  # aiokafka's "no codec"
