"""All settings of the pipeline in one frozen pydantic-settings model (env prefix ``PRISM_``).

Defaults run on a laptop: a local broker on 127.0.0.1:9092 and an embedded chDB ledger
under ``./.data/``. A bad value fails at start with ``SettingsError`` naming the setting
(as its environment variable) and the value; a secret's value is never shown (the DSN
with its password masked, the webhook URL as scheme and host only). Secrets are
``SecretStr`` (``SecretDsn`` for the ledger DSN, ``SecretUrl`` for the webhook URL): their
``str``/``repr`` are masked and the real value comes from ``get_secret_value()``. Every
duration is a finite number of seconds within bounds. A ``PRISM_*`` variable that is no
setting is reported once per process with the closest setting name (a log line, not an
error: other tools use ``PRISM_`` variables too).

Example::

    settings = load_settings()                 # from the environment
    settings = load_settings(kafka_bootstrap_servers="127.0.0.1:19092")
    settings.topics.input                      # "prism.agent-events"
"""

from __future__ import annotations

import difflib
import logging
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import unquote, urlsplit

from pydantic import Field, SecretStr, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from prism.schemas import DEFAULT_DENY, deny_list
from prism.sinks import SecretDsn, parse_dsn, redact_dsn

from .core import CoreConfig

__all__ = [
    "TOOL_VARIABLES",
    "SecretUrl",
    "Settings",
    "SettingsError",
    "Topics",
    "load_settings",
    "redact_url",
    "unknown_variables",
]

log = logging.getLogger("prism.settings")

_TOPIC_RE = re.compile(r"^[A-Za-z0-9._-]{1,200}$")
_DAY = 86_400.0
RECORD_MARGIN_BYTES = 65_536  # a record batch's framing and the timer's small state changes
# PRISM_* variables read by the dev tools and tests, not by the settings.
# Read by the tools, or before any setting: PRISM_CORE picks the core's build at import
# (schemas/_compiled.py: auto, compiled, pure).
TOOL_VARIABLES = frozenset(
    {
        "PRISM_KAFKA_PORT",
        "PRISM_KAFKA_STATE_DIR",
        "PRISM_KAFKA_HOME",
        "PRISM_TEST_KAFKA_BOOTSTRAP",
        "PRISM_CORE",
    }
)
_reported_unknown: set[str] = set()


class SettingsError(ValueError):
    """A setting has a value the pipeline cannot use; the message names both."""


def redact_url(url: str) -> str:
    """A URL as ``scheme://host[:port]/***``: webhook paths and queries usually hold a token."""
    try:
        parts = urlsplit(url)
        host, port = parts.hostname, parts.port
    except ValueError:
        return "***"
    if not parts.scheme or not host:
        return "***"
    address = f"{host}:{port}" if port else host
    tail = "/***" if parts.path.strip("/") or parts.query or parts.fragment else ""
    return f"{parts.scheme}://{'***@' if parts.username else ''}{address}{tail}"


class SecretUrl(SecretStr):
    """A URL that carries a credential (a webhook): shown as scheme and host only."""

    def _display(self) -> str:  # type: ignore[override]
        return redact_url(self.get_secret_value())


def _seconds(default: float, *, low: float = 0.0, strict: bool = False, high: float) -> Any:
    """A duration field: finite, ``> low`` (strict) or ``>= low``, and ``<= high``."""
    if strict:
        return Field(default=default, gt=low, le=high, allow_inf_nan=False)
    return Field(default=default, ge=low, le=high, allow_inf_nan=False)


@dataclass(frozen=True, slots=True)
class Topics:
    """Topic names derived from the prefix (CONTRACT.md, Transport)."""

    input: str
    dlq: str
    quarantine: str
    runs_closed: str
    alerts: str
    limit_deaths: str
    lane_marks: str

    @classmethod
    def from_prefix(cls, prefix: str) -> Topics:
        return cls(
            input=f"{prefix}.agent-events",
            dlq=f"{prefix}.agent-events.dlq",
            quarantine=f"{prefix}.agent-events.quarantine",
            runs_closed=f"{prefix}.runs.closed",
            alerts=f"{prefix}.alerts",
            limit_deaths=f"{prefix}.limit-deaths",
            lane_marks=f"{prefix}.lane-marks",
        )

    @property
    def channel_operations(self) -> str:
        """The channel-operation input topic beside the agent events (same prefix)."""
        return self.input.removesuffix(".agent-events") + ".channel-operations"

    @property
    def repartition(self) -> str:
        """Agent events forwarded to their run's home partition (CONTRACT.md, Transport)."""
        return self.input + ".repartition"

    @property
    def channel_repartition(self) -> str:
        """Channel operations forwarded to their operation's home partition."""
        return self.channel_operations + ".repartition"

    @property
    def budget_state(self) -> str:
        """Each spend budget's current state, compacted, keyed by scope id (CONTRACT.md,
        "Outputs for runtimes and tracing tools"; docs/BUDGETS.md)."""
        return self.input.removesuffix(".agent-events") + ".budget-state"

    @property
    def slot_topics(self) -> tuple[str, str, str, str]:
        """The topics whose partition ``p`` one worker holds together (a slot)."""
        return (self.input, self.channel_operations, self.repartition, self.channel_repartition)


class Settings(BaseSettings):
    """Every knob of the pipeline; each field maps to ``PRISM_<FIELD_NAME>``."""

    model_config = SettingsConfigDict(env_prefix="PRISM_", frozen=True, extra="ignore")

    # Kafka
    kafka_bootstrap_servers: str = "127.0.0.1:9092"
    topic_prefix: str = "prism"
    partitions: int = Field(default=4, ge=1, le=1024)
    replication_factor: int = Field(default=1, ge=1, le=16)
    consumer_group: str = "prism-pipeline"
    # A worker that has not heartbeated for this long loses its partitions to the others
    # (and its later writes are fenced): the bound on how long a dead or paused worker's
    # partitions wait.
    consumer_session_timeout_seconds: float = _seconds(10.0, low=1.0, high=600.0)
    # A stable name for this worker process (Kafka static membership, KIP-345): a worker
    # restarted under the same name within the session timeout gets its partitions back
    # without a rebalance. Unique per process; unset (the default): a dynamic member.
    consumer_group_instance_id: str | None = Field(
        default=None, min_length=1, max_length=249, pattern=r"^[A-Za-z0-9._-]+$"
    )
    # How the worker compresses what it produces (run state, outputs, forwarded copies):
    # the state changelog alone is larger than the input uncompressed, and the brokers
    # replicate and compact every byte of it. zstd: aiokafka's lz4 is the slow high-
    # compression level (about 100 MB/s on the run state; zstd 600 MB/s, twice the ratio).
    kafka_compression: Literal["none", "gzip", "snappy", "lz4", "zstd"] = "zstd"
    kafka_security_protocol: Literal["PLAINTEXT", "SSL", "SASL_SSL", "SASL_PLAINTEXT"] = "PLAINTEXT"
    kafka_sasl_mechanism: Literal["SCRAM-SHA-512", "SCRAM-SHA-256", "PLAIN"] = "SCRAM-SHA-512"
    kafka_sasl_username: str | None = None
    kafka_sasl_password: SecretStr | None = None
    kafka_ssl_cafile: Path | None = None
    max_event_bytes: int = Field(default=1_048_576, ge=1024, le=64 * 1_048_576)

    # ClickHouse (through clickhouse-connect only)
    clickhouse_dsn: SecretDsn = SecretDsn("chdb://./.data/ledger")
    clickhouse_database: str = "prism"
    clickhouse_cluster: str | None = None
    raw_event_ttl_days: int = Field(default=90, ge=1, le=10000)

    # Batching and run semantics (seconds; every duration finite and bounded)
    batch_max_events: int = Field(default=20_000, ge=1, le=1_000_000)
    batch_max_seconds: float = _seconds(0.5, strict=True, high=60.0)
    grace_period_seconds: float = _seconds(30.0, high=_DAY)
    stale_run_seconds: float = _seconds(3600.0, strict=True, high=366 * _DAY)
    tombstone_retention_seconds: float = _seconds(86400.0, strict=True, high=366 * _DAY)
    max_clock_skew_seconds: float = _seconds(300.0, high=_DAY)
    channel_stuck_seconds: float = _seconds(300.0, strict=True, high=_DAY)
    alert_window_seconds: float = _seconds(300.0, strict=True, high=7 * _DAY)
    alert_limit_deaths_threshold: int = Field(default=5, ge=1, le=1_000_000)
    # How far behind the event-time watermark alerts wait for late deaths (rule 16);
    # None: the grace period
    allowed_lateness_seconds: float | None = Field(default=None, ge=0, le=_DAY, allow_inf_nan=False)
    alert_webhook_url: SecretUrl | None = None
    # Spend budgets (docs/BUDGETS.md): a TOML or YAML budgets file; set, every lane sends its
    # billed spend to the one budget desk beside the exhaustion alerter. None: no budgets.
    budgets_file: Path | None = None

    # Channel alert rules written by `dashboards build` (open items, capacity denials)
    alert_channel_open_item_minutes: float = Field(
        default=30.0, gt=0, le=7 * 24 * 60, allow_inf_nan=False
    )
    alert_channel_capacity_denials_per_minute: float = Field(
        default=1.0, ge=0, le=1_000_000, allow_inf_nan=False
    )

    # What the ledger keeps outside the contract (schemas.redact_unknown_data)
    redact_keys: Annotated[frozenset[str], NoDecode] = DEFAULT_DENY

    # How long the worker's threads hold the GIL before handing it to a waiting one
    # (sys.setswitchinterval). The batch step runs in a thread beside the event loop, which
    # fetches, produces and acknowledges; at Python's 5 ms default they traded the GIL so
    # often that every stage of the step ran about a quarter slower (bench/README.md). The
    # loop waits up to this long for the GIL, far below any Kafka timeout.
    gil_switch_interval_seconds: float = Field(default=0.05, ge=0.001, le=1.0, allow_inf_nan=False)
    # ingest-file: parse the next batch's records while this batch's insert waits on
    # ClickHouse (which holds no GIL then); off: each batch is parsed in its own step.
    parse_ahead: bool = True
    # How long a held partition's consumer position may stay past the worker's own (records
    # handed out and never stepped, with no later record to show the gap) before the worker
    # reads them back itself; 0 = never.
    undelivered_read_back_seconds: float = _seconds(5.0, high=3600.0)

    # Worker state and observability
    state_store: Literal["rocksdb", "memory"] = "rocksdb"
    state_dir: Path = Path(".data/state")
    otel_exporter: Literal["none", "console", "otlp"] = "none"
    otel_endpoint: str | None = None

    # The worker's HTTP endpoint: GET /metrics (Prometheus text) and /healthz; port 0 = off.
    metrics_host: str = "127.0.0.1"
    metrics_port: int = Field(default=9464, ge=0, le=65535)
    # How often each worker writes its position per partition to worker_progress (consumer
    # lag on the Pipeline dashboard); 0 = never.
    progress_interval_seconds: float = Field(default=15.0, ge=0, le=3600, allow_inf_nan=False)

    # Grafana alert rules (`dashboards build`; dashboards/README.md, "Alert rules"). A rule
    # pages only when a human must act: rates against a baseline, never "more than 0".
    # Limit deaths per minute on one axis, averaged over the window.
    alert_exhaustion_per_minute: float = Field(default=1.0, gt=0, le=1e6, allow_inf_nan=False)
    alert_exhaustion_window_seconds: int = Field(default=600, ge=60, le=7 * 86_400)
    # Dead letters: the recent window's rate against `factor` x the baseline rate before it,
    # and never below `min_per_minute` (a ledger with no baseline pages only above that).
    alert_dead_letter_window_seconds: int = Field(default=300, ge=60, le=86_400)
    alert_dead_letter_baseline_seconds: int = Field(default=86_400, ge=300, le=30 * 86_400)
    alert_dead_letter_factor: float = Field(default=3.0, ge=1, le=1e6, allow_inf_nan=False)
    alert_dead_letter_min_per_minute: float = Field(default=1.0, gt=0, allow_inf_nan=False)
    # Stale runs: runs marked incomplete in the window against `factor` x the baseline, and
    # at least `min_runs` of them (a few dying runtimes are the run explorer's job).
    alert_stale_window_seconds: int = Field(default=3_600, ge=60, le=7 * 86_400)
    alert_stale_baseline_seconds: int = Field(default=86_400, ge=300, le=30 * 86_400)
    alert_stale_factor: float = Field(default=3.0, ge=1, le=1e6, allow_inf_nan=False)
    alert_stale_min_runs: int = Field(default=5, ge=1, le=1_000_000)
    # Freshness: seconds since the newest event reached the ledger while events are expected
    # (a run active within `expect_seconds` is still open); none in the lookback is NoData.
    alert_freshness_seconds: int = Field(default=300, ge=10, le=86_400)
    alert_freshness_lookback_seconds: int = Field(default=3_600, ge=60, le=7 * 86_400)
    alert_freshness_expect_seconds: int = Field(default=86_400, ge=60, le=30 * 86_400)

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
    def _dsn_parses(cls, v: SecretDsn) -> SecretDsn:
        parse_dsn(v)  # the one DSN parser; its errors mask the password
        return v

    @field_validator("clickhouse_database")
    @classmethod
    def _database_identifier(cls, v: str) -> str:
        if not re.match(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$", v):
            raise ValueError("must be an identifier [A-Za-z_][A-Za-z0-9_]*")
        return v

    @field_validator("alert_webhook_url", "otel_endpoint", mode="before")
    @classmethod
    def _empty_is_unset(cls, v: Any) -> Any:
        return None if isinstance(v, str) and not v.strip() else v

    @field_validator("alert_webhook_url", "otel_endpoint")
    @classmethod
    def _http_url(cls, v: Any) -> Any:
        if v is None:
            return v
        url = v.get_secret_value() if isinstance(v, SecretStr) else v
        try:
            parts = urlsplit(url)
            ok = parts.scheme in ("http", "https") and bool(parts.hostname) and parts.port != 0
        except ValueError:
            ok = False
        if not ok:
            raise ValueError("must be an http(s)://host[:port]/path URL")
        return v

    @field_validator("budgets_file", mode="before")
    @classmethod
    def _empty_file_is_unset(cls, v: Any) -> Any:
        return None if isinstance(v, str) and not v.strip() else v

    @field_validator("budgets_file")
    @classmethod
    def _budgets_file_reads(cls, v: Path | None) -> Path | None:
        if v is not None:  # a bad file fails at start, named as its reader names it
            from .budgets import BudgetConfigError, read_budgets

            try:
                read_budgets(v)
            except BudgetConfigError as exc:
                raise ValueError(str(exc)) from None
        return v

    @field_validator("redact_keys", mode="before")
    @classmethod
    def _deny_list(cls, v: Any) -> Any:
        return deny_list(v) if isinstance(v, str) else v

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

    @property
    def max_record_bytes(self) -> int:
        """The largest record the workers produce (a dead-lettered event with its headers,
        a run's state, a closed run's timeline): twice the largest event, at least 1 MiB.
        Every pipeline topic accepts it (``topics.ensure_topics`` sets max.message.bytes)."""
        return max(1_048_576, self.max_event_bytes * 2)

    @property
    def max_state_bytes(self) -> int:
        """The largest run state a batch may leave (one changelog record): a step that would
        leave more is refused and its record dead-lettered (contract rule 15). A margin
        below ``max_record_bytes``: room for the timer's small changes and the framing."""
        return self.max_record_bytes - RECORD_MARGIN_BYTES

    @property
    def max_message_bytes(self) -> int:
        """The topics' max.message.bytes: ``max_record_bytes`` plus a batch's framing."""
        return self.max_record_bytes + RECORD_MARGIN_BYTES

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
            redact_keys=self.redact_keys,
            channel_stuck_s=self.channel_stuck_seconds,
            allowed_lateness_s=self.allowed_lateness_seconds,
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


_SECRET_FIELDS = frozenset(
    name for name, f in Settings.model_fields.items() if "Secret" in str(f.annotation)
)


def _shown(field: str, value: Any) -> str:
    """How a bad value appears in an error: secrets masked, everything else as ``repr``."""
    if isinstance(value, SecretStr):
        value = value.get_secret_value()
    if field == "clickhouse_dsn":
        return repr(redact_dsn(str(value)))
    if field in ("alert_webhook_url", "otel_endpoint"):
        return repr(redact_url(str(value)))
    if field in _SECRET_FIELDS:
        return "<hidden>"
    return repr(value)


def _scrub(text: str, secrets: list[str]) -> str:
    for secret in sorted((s for s in secrets if len(s) >= 3), key=len, reverse=True):
        text = text.replace(secret, "***")
    return text


def _secret_inputs(overrides: Mapping[str, Any]) -> list[str]:
    """Every secret given (environment or ``overrides``), to scrub from errors: whole values
    for passwords and webhook URLs, the password part of DSNs and endpoints."""
    values: list[str] = []
    for name in _SECRET_FIELDS | {"otel_endpoint"}:
        for raw in (os.environ.get(f"PRISM_{name.upper()}"), overrides.get(name)):
            text = raw.get_secret_value() if isinstance(raw, SecretStr) else raw
            if not isinstance(text, str) or not text:
                continue
            if name in ("kafka_sasl_password", "alert_webhook_url"):
                values.append(text)
            if name == "alert_webhook_url":  # webhook paths and queries are tokens
                values.append(text.partition("://")[2].partition("/")[2])
            userinfo = text.partition("://")[2].rpartition("@")[0] or text.rpartition("@")[0]
            if ":" in userinfo:  # a URL password, unencoded '@' or '/' included
                password = userinfo.partition(":")[2]
                values += [password, unquote(password)]
    return values


def unknown_variables(environ: Mapping[str, str]) -> list[tuple[str, str | None]]:
    """``PRISM_*`` names in ``environ`` that are no setting, each with the closest setting."""
    known = {f"PRISM_{name.upper()}" for name in Settings.model_fields}
    out = []
    for name in sorted(environ):
        if name.startswith("PRISM_") and name not in known and name not in TOOL_VARIABLES:
            close = difflib.get_close_matches(name, sorted(known), n=1, cutoff=0.6)
            out.append((name, close[0] if close else None))
    return out


def _report_unknown_variables() -> None:
    for name, close in unknown_variables(os.environ):
        if name in _reported_unknown:
            continue
        _reported_unknown.add(name)
        hint = f"; did you mean {close}?" if close else ""
        log.warning("%s is not a prism-pipeline setting and is ignored%s", name, hint)


def load_settings(**overrides: Any) -> Settings:
    """Build settings from the environment plus ``overrides``; raise ``SettingsError`` if bad."""
    _report_unknown_variables()
    try:
        return Settings(**overrides)
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            loc = ".".join(str(p) for p in err["loc"])
            if loc:
                problems.append(
                    f"PRISM_{loc.upper()}={_shown(loc, err.get('input'))}: {err['msg']}"
                )
            else:  # a rule across settings: its message names the variables, not their values
                problems.append(str(err["msg"]).removeprefix("Value error, "))
        message = "invalid settings: " + "; ".join(problems)
        raise SettingsError(_scrub(message, _secret_inputs(overrides))) from None
