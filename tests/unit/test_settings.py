"""Settings: defaults run on a laptop; a bad value fails at start naming the variable and value."""

from __future__ import annotations

import pytest

from prism.pipeline.settings import SettingsError, Topics, load_settings


def test_defaults_run_locally(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(__import__("os").environ):
        if name.startswith("PRISM_"):
            monkeypatch.delenv(name)
    s = load_settings()
    assert s.kafka_bootstrap_servers == "127.0.0.1:9092"
    assert s.clickhouse_dsn.startswith("chdb://") and s.clickhouse_database == "prism"
    assert s.topics == Topics(
        "prism.agent-events", "prism.agent-events.dlq", "prism.agent-events.quarantine",
        "prism.runs.closed", "prism.alerts", "prism.limit-deaths",
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
        ("PRISM_TOPIC_PREFIX", "bad prefix", "PRISM_TOPIC_PREFIX='bad prefix'"),
        ("PRISM_STATE_STORE", "redis", "PRISM_STATE_STORE='redis'"),
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
