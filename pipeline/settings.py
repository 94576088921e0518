"""All settings of the pipeline in one frozen pydantic-settings model (env prefix ``PRISM_``).

Defaults run on a laptop: a local broker on 127.0.0.1:9092 and an embedded chDB ledger
under ``./.data/``. A bad value fails at start with ``SettingsError`` naming the setting
(as its environment variable) and the value.

Example::

    settings = load_settings()                 # from the environment
    settings = load_settings(kafka_bootstrap_servers="127.0.0.1:19092")
    settings.topics.input                      # "prism.agent-events"
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, SecretStr, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from .core import CoreConfig

__all__ = ["Settings", "SettingsError", "Topics", "load_settings"]

_TOPIC_RE = re.compile(r"^[A-Za-z0-9._-]{1,200}$")


class SettingsError(ValueError):
    """A setting has a value the pipeline cannot use; the message names both."""


@dataclass(frozen=True, slots=True)
class Topics:
    """Topic names derived from the prefix (CONTRACT.md, Transport)."""

    input: str
    dlq: str
    quarantine: str
    runs_closed: str
    alerts: str
    limit_deaths: str

    @classmethod
    def from_prefix(cls, prefix: str) -> Topics:
        return cls(
            input=f"{prefix}.agent-events",
            dlq=f"{prefix}.agent-events.dlq",
            quarantine=f"{prefix}.agent-events.quarantine",
            runs_closed=f"{prefix}.runs.closed",
            alerts=f"{prefix}.alerts",
            limit_deaths=f"{prefix}.limit-deaths",
        )


class Settings(BaseSettings):
    """Every knob of the pipeline; each field maps to ``PRISM_<FIELD_NAME>``."""

    model_config = SettingsConfigDict(env_prefix="PRISM_", frozen=True, extra="ignore")

    # Kafka
    kafka_bootstrap_servers: str = "127.0.0.1:9092"
    topic_prefix: str = "prism"
    partitions: int = Field(default=4, ge=1, le=1024)
    replication_factor: int = Field(default=1, ge=1, le=16)
    consumer_group: str = "prism-pipeline"
    kafka_security_protocol: Literal["PLAINTEXT", "SSL", "SASL_SSL", "SASL_PLAINTEXT"] = "PLAINTEXT"
    kafka_sasl_mechanism: Literal["SCRAM-SHA-512", "SCRAM-SHA-256", "PLAIN"] = "SCRAM-SHA-512"
    kafka_sasl_username: str | None = None
    kafka_sasl_password: SecretStr | None = None
    kafka_ssl_cafile: Path | None = None
    max_event_bytes: int = Field(default=1_048_576, ge=1024, le=64 * 1_048_576)

    # ClickHouse (through clickhouse-connect only)
    clickhouse_dsn: str = "chdb://./.data/ledger"
    clickhouse_database: str = "prism"
    clickhouse_cluster: str | None = None
    raw_event_ttl_days: int = Field(default=90, ge=1, le=10000)

    # Batching and run semantics
    batch_max_events: int = Field(default=5000, ge=1, le=1_000_000)
    batch_max_seconds: float = Field(default=0.5, gt=0, le=60)
    grace_period_seconds: float = Field(default=30.0, ge=0)
    stale_run_seconds: float = Field(default=3600.0, gt=0)
    tombstone_retention_seconds: float = Field(default=86400.0, gt=0)
    alert_window_seconds: float = Field(default=300.0, gt=0)
    max_clock_skew_seconds: float = Field(default=300.0, ge=0, le=86400)
    alert_limit_deaths_threshold: int = Field(default=5, ge=1)
    alert_webhook_url: str | None = None

    # Worker state and observability
    state_store: Literal["rocksdb", "memory"] = "rocksdb"
    state_dir: Path = Path(".data/state")
    otel_exporter: Literal["none", "console", "otlp"] = "none"
    otel_endpoint: str | None = None

    @field_validator("topic_prefix")
    @classmethod
    def _prefix_is_topic_safe(cls, v: str) -> str:
        if not _TOPIC_RE.match(v):
            raise ValueError("must be 1..200 chars of [A-Za-z0-9._-]")
        return v

    @field_validator("kafka_bootstrap_servers")
    @classmethod
    def _bootstrap_is_host_port_list(cls, v: str) -> str:
        for part in v.split(","):
            host, sep, port = part.strip().rpartition(":")
            if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
                raise ValueError(f"{part!r} is not host:port (comma-separated list expected)")
        return v

    @field_validator("clickhouse_dsn")
    @classmethod
    def _dsn_scheme(cls, v: str) -> str:
        if not re.match(r"^(chdb|clickhouse|https?)://", v):
            raise ValueError("must start with chdb://, http://, https:// or clickhouse://")
        return v

    @field_validator("clickhouse_database")
    @classmethod
    def _database_identifier(cls, v: str) -> str:
        if not re.match(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$", v):
            raise ValueError("must be an identifier [A-Za-z_][A-Za-z0-9_]*")
        return v

    @model_validator(mode="after")
    def _sasl_needs_credentials(self) -> Settings:
        if self.kafka_security_protocol.startswith("SASL") and not (
            self.kafka_sasl_username and self.kafka_sasl_password
        ):
            raise ValueError(
                "PRISM_KAFKA_SECURITY_PROTOCOL="
                f"{self.kafka_security_protocol} needs PRISM_KAFKA_SASL_USERNAME and "
                "PRISM_KAFKA_SASL_PASSWORD"
            )
        return self

    @property
    def topics(self) -> Topics:
        return Topics.from_prefix(self.topic_prefix)

    def core_config(self, *, processing_grace: bool = True) -> CoreConfig:
        """The run-semantics knobs (file replays pass ``processing_grace=False``)."""
        return CoreConfig(
            grace_period_s=self.grace_period_seconds,
            stale_after_s=self.stale_run_seconds,
            tombstone_retention_s=self.tombstone_retention_seconds,
            alert_window_s=self.alert_window_seconds,
            alert_threshold=self.alert_limit_deaths_threshold,
            max_clock_skew_s=self.max_clock_skew_seconds,
            processing_grace=processing_grace,
        )

    def aiokafka_kwargs(self) -> dict[str, Any]:
        """Connection keyword arguments shared by aiokafka producers, consumers and admins."""
        kw: dict[str, Any] = {
            "bootstrap_servers": self.kafka_bootstrap_servers,
            "security_protocol": self.kafka_security_protocol,
        }
        if self.kafka_security_protocol in ("SSL", "SASL_SSL"):
            from aiokafka.helpers import create_ssl_context

            kw["ssl_context"] = create_ssl_context(
                cafile=str(self.kafka_ssl_cafile) if self.kafka_ssl_cafile else None
            )
        if self.kafka_security_protocol.startswith("SASL"):
            kw["sasl_mechanism"] = self.kafka_sasl_mechanism
            kw["sasl_plain_username"] = self.kafka_sasl_username
            kw["sasl_plain_password"] = (
                self.kafka_sasl_password.get_secret_value() if self.kafka_sasl_password else None
            )
        return kw


def load_settings(**overrides: Any) -> Settings:
    """Build settings from the environment plus ``overrides``; raise ``SettingsError`` if bad."""
    try:
        return Settings(**overrides)
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            loc = ".".join(str(p) for p in err["loc"])
            name = f"PRISM_{loc.upper()}" if loc else "settings"
            value = err.get("input")
            shown = "<hidden>" if "password" in loc else repr(value)
            problems.append(f"{name}={shown}: {err['msg']}")
        raise SettingsError("invalid settings: " + "; ".join(problems)) from None
