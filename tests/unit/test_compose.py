"""docker-compose.yml and the Dockerfile agree with the code: settings, ports, Grafana files.

No Docker engine runs here, so the stack is checked the way Compose reads it: the YAML with
its ``${VAR:-default}`` interpolation, then every value compared with what the code
(``pipeline.settings``, ``sinks.parse_dsn``, the CLI, the generated Grafana provisioning)
would do with it.
"""

from __future__ import annotations

import argparse
import base64
import re
import shlex
import tomllib
from collections.abc import Mapping
from importlib.metadata import version
from pathlib import Path
from typing import Any

import pytest
import yaml
from packaging.specifiers import SpecifierSet

from prism.pipeline.settings import TOOL_VARIABLES, Settings, Topics, load_settings

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yml"
DOCKERFILE = ROOT / "Dockerfile"
PYPROJECT: dict[str, Any] = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
PROVISIONING = ROOT / "dashboards" / "provisioning"

PREFIX: str = Settings.model_config["env_prefix"]
FIELDS = {f"{PREFIX}{name.upper()}": name for name in Settings.model_fields}
PIPELINE_SERVICES = ("migrate", "grants", "worker", "simulator")
ENV_EXAMPLE = ROOT / "prism.env.example"
CLICKHOUSE_CONFIG = ROOT / "deploy" / "clickhouse" / "prism.xml"
# The ClickHouse server image's own ports (not pipeline settings).
CLICKHOUSE_PORTS = {"http": 8123, "native": 9000}
# The ClickHouse release chDB (pyproject's pin) embeds: the server compose runs.
CLICKHOUSE_RELEASE = "26.9"


def _env_file(path: Path) -> dict[str, str]:
    """``NAME=value`` lines of an env file (comments and blanks skipped)."""
    out = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        name, sep, value = line.strip().partition("=")
        if sep and not name.startswith("#"):
            out[name.strip()] = value.strip()
    return out


# What a user who copied prism.env.example to .env has; and one who set everything, with
# passwords holding the characters that used to break a DSN.
EXAMPLE = _env_file(ENV_EXAMPLE)
OVERRIDES = {
    **EXAMPLE,
    "CLICKHOUSE_ADMIN_PASSWORD": "adm/in@pw",
    "CLICKHOUSE_WRITER_PASSWORD": "wr:iter@s3cret",
    "CLICKHOUSE_READER_PASSWORD": "reader-s3cret",
    "CLICKHOUSE_GRAFANA_PASSWORD": "gr@fana/s3cret",
    "PRISM_ALERT_WEBHOOK_URL": "https://hooks.example/prism",
}

_BRACED = re.compile(r"^(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<op>:?[-?+])(?P<arg>.*))?$", re.S)
_REFERENCE = re.compile(r"\$(?:(?P<esc>\$)|\{(?P<braced>[^}]*)\}|(?P<name>[A-Za-z_][A-Za-z0-9_]*))")


def _interpolate(text: str, env: Mapping[str, str]) -> str:
    """Expand Compose's ``$NAME``, ``${NAME}``, ``${NAME:-x}``, ``${NAME-x}``, ``${NAME:?x}``."""

    def expand(m: re.Match[str]) -> str:
        if m.group("esc"):
            return "$"
        if m.group("name"):
            return env.get(m.group("name"), "")
        parts = _BRACED.match(m.group("braced"))
        assert parts, f"unsupported interpolation {m.group(0)!r} in docker-compose.yml"
        name, op, arg = parts.group("name", "op", "arg")
        value = env.get(name)
        present = bool(value) if op and op.startswith(":") else value is not None
        if op in (":-", "-"):
            return value if present and value is not None else arg
        if op in (":?", "?"):
            assert present, f"docker-compose.yml requires {name}: {arg}"
        assert op in (None, ":?", "?"), f"unsupported operator in {m.group(0)!r}"
        return value or ""

    return _REFERENCE.sub(expand, text)


def _resolve(node: Any, env: Mapping[str, str]) -> Any:
    if isinstance(node, str):
        return _interpolate(node, env)
    if isinstance(node, list):
        return [_resolve(v, env) for v in node]
    if isinstance(node, dict):
        return {k: _resolve(v, env) for k, v in node.items()}
    return node


def load_compose(env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The compose file as Compose sees it, with ``env`` as the shell/.env variables."""
    raw = yaml.safe_load(COMPOSE.read_text(encoding="utf-8"))
    assert isinstance(raw, dict) and isinstance(raw.get("services"), dict)
    resolved: dict[str, Any] = _resolve(
        {k: v for k, v in raw.items() if not k.startswith("x-")}, env or {}
    )
    return resolved


def environment(service: Mapping[str, Any]) -> dict[str, str | None]:
    """A service's environment (map or list form); ``None`` means passed through if set."""
    env = service.get("environment") or {}
    if isinstance(env, list):
        pairs = [item.split("=", 1) if "=" in item else [item, None] for item in env]
        env = dict(pairs)
    return {k: None if v is None else str(v) for k, v in env.items()}


def volumes(service: Mapping[str, Any]) -> dict[str, tuple[str, bool]]:
    """Container path -> (source, read-only) from the short volume syntax."""
    out = {}
    for spec in service.get("volumes", []):
        source, target, *mode = spec.split(":")
        out[target] = (source, "ro" in mode)
    return out


def published(service: Mapping[str, Any]) -> dict[int, int]:
    """Container port -> host port."""
    out = {}
    for spec in service.get("ports", []):
        host, container = str(spec).rsplit(":", 2)[-2:]
        out[int(container)] = int(host)
    return out


def command(service: Mapping[str, Any]) -> list[str]:
    cmd = service["command"]
    return shlex.split(cmd) if isinstance(cmd, str) else [str(c) for c in cmd]


def default(field: str) -> Any:
    return Settings.model_fields[field].default


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return load_compose(EXAMPLE)


@pytest.fixture(scope="module")
def services(compose: dict[str, Any]) -> dict[str, Any]:
    svc: dict[str, Any] = compose["services"]
    return svc


def test_the_stack_has_every_service_and_pinned_images(services: dict[str, Any]) -> None:
    assert {"kafka", "clickhouse", "grafana", *PIPELINE_SERVICES} <= set(services)
    # One Kafka version everywhere: the broker `make test` and `make demo` run.
    pom = (ROOT / "devstack" / "kafka" / "pom.xml").read_text(encoding="utf-8")
    kafka_version = re.search(r"<kafka\.version>([\d.]+)</kafka\.version>", pom)
    assert kafka_version and services["kafka"]["image"] == f"apache/kafka:{kafka_version[1]}"
    # The engine the tests run: chDB's (tests/integration/test_compose_engine.py checks
    # that the tag's release is chDB's own), never a floating `latest`.
    assert re.fullmatch(
        rf"clickhouse/clickhouse-server:{re.escape(CLICKHOUSE_RELEASE)}(\.\d+)*",
        services["clickhouse"]["image"],
    )
    # ... and the engine is pinned, so a clean install cannot take a newer one
    pipeline = PYPROJECT["project"]["optional-dependencies"]["pipeline"]
    engine = [r for r in pipeline if re.match(r"chdb-core\b", r)]
    assert len(engine) == 1 and re.fullmatch(
        rf"chdb-core=={re.escape(CLICKHOUSE_RELEASE)}\.\d+", engine[0]
    ), engine
    # Grafana runs the release the dashboards are built for (grafana-foundation-sdk's pin).
    sdk_grafana = version("grafana-foundation-sdk").split("!")[-1]
    assert services["grafana"]["image"] == f"grafana/grafana:{sdk_grafana}"
    plugins = dict(
        p.strip().partition(" ")[::2]
        for p in (environment(services["grafana"])["GF_INSTALL_PLUGINS"] or "").split(",")
    )
    assert re.fullmatch(r"4\.\d+\.\d+", plugins.get("grafana-clickhouse-datasource", "")), (
        f"the ClickHouse plugin is not pinned to a 4.x release: {plugins}"
    )
    assert services["simulator"]["profiles"] == ["demo"], "the simulator runs only on demand"


def test_every_service_others_wait_for_is_healthchecked(services: dict[str, Any]) -> None:
    for name, svc in services.items():
        for dep, spec in (svc.get("depends_on") or {}).items():
            assert isinstance(spec, dict), f"{name}: depends_on {dep} needs a condition"
            condition = spec.get("condition")
            assert condition in ("service_healthy", "service_completed_successfully"), (
                f"{name}: depends_on {dep} has condition {condition!r}"
            )
            target = services[dep]
            if condition == "service_healthy":
                assert target.get("healthcheck", {}).get("test"), f"{dep} has no healthcheck"
            else:
                assert target.get("restart", "no") == "no", f"{dep} is not a one-shot job"
    # Services from public images are long-running infrastructure: each reports health.
    for name, svc in services.items():
        if "build" not in svc:
            check = svc.get("healthcheck") or {}
            assert check.get("test") and check.get("interval") and check.get("retries"), name


def test_prism_variables_are_settings_fields() -> None:
    texts = {p.name: p.read_text(encoding="utf-8") for p in (COMPOSE, DOCKERFILE)}
    texts |= {str(p): p.read_text(encoding="utf-8") for p in PROVISIONING.rglob("*.y*ml")}
    for source, text in texts.items():
        for name in set(re.findall(rf"\b{PREFIX}[A-Z0-9_]+", text)):
            assert name in FIELDS or name in TOOL_VARIABLES, (
                f"{source} uses {name}, which is no setting in pipeline/settings.py"
            )


@pytest.mark.parametrize("env", [EXAMPLE, OVERRIDES], ids=["example", "overrides"])
def test_pipeline_containers_load_valid_settings(
    env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    services = load_compose(env)["services"]
    loaded = {}
    for name in PIPELINE_SERVICES:
        for var in FIELDS:
            monkeypatch.delenv(var, raising=False)
        for var, value in environment(services[name]).items():
            value = env.get(var) if value is None else value  # pass-through from the shell
            if value is not None:
                monkeypatch.setenv(var, value)
        loaded[name] = settings = load_settings()
        assert settings.topic_prefix == default("topic_prefix"), name
        assert settings.topics == Topics.from_prefix(default("topic_prefix")), name
        assert settings.clickhouse_database == default("clickhouse_database"), name
    # Only the worker delivers alerts, and only to a webhook the user configured.
    webhook = loaded["worker"].alert_webhook_url
    assert (webhook.get_secret_value() if webhook else None) == env.get("PRISM_ALERT_WEBHOOK_URL")
    assert loaded["migrate"].alert_webhook_url is None


def test_kafka_listens_where_the_pipeline_connects(services: dict[str, Any]) -> None:
    port = int(default("kafka_bootstrap_servers").rpartition(":")[2])
    kafka = environment(services["kafka"])
    bootstrap = {
        environment(services[n])["PRISM_KAFKA_BOOTSTRAP_SERVERS"] for n in PIPELINE_SERVICES
    }
    assert bootstrap == {f"kafka:{port}"}
    sim = command(services["simulator"])
    assert sim[sim.index("--kafka") + 1] == f"kafka:{port}"

    listeners = dict(re.findall(r"(\w+)://[^:,]*:(\d+)", kafka["KAFKA_LISTENERS"] or ""))
    advertised = dict(re.findall(r"(\w+)://([^,]+)", kafka["KAFKA_ADVERTISED_LISTENERS"] or ""))
    internal = kafka["KAFKA_INTER_BROKER_LISTENER_NAME"]
    assert internal and advertised[internal] == f"kafka:{port}"
    assert listeners[internal] == str(port)
    # Every other advertised listener is reachable from the host on the same port.
    ports = published(services["kafka"])
    for name, address in advertised.items():
        if name != internal:
            host, _, ext = address.rpartition(":")
            assert host in ("127.0.0.1", "localhost") and ports.get(int(ext)) == int(ext), name
    check = " ".join(services["kafka"]["healthcheck"]["test"])
    assert "kafka-broker-api-versions.sh" in check and f":{port}" in check


def test_kafka_is_one_node_that_fits_the_topic_defaults(services: dict[str, Any]) -> None:
    kafka = environment(services["kafka"])
    assert set((kafka["KAFKA_PROCESS_ROLES"] or "").split(",")) == {"broker", "controller"}
    voters = (kafka["KAFKA_CONTROLLER_QUORUM_VOTERS"] or "").split(",")
    assert voters == [f"{kafka['KAFKA_NODE_ID']}@kafka:{voters[0].rpartition(':')[2]}"]
    assert default("replication_factor") <= len(voters)
    assert int(kafka["KAFKA_NUM_PARTITIONS"] or 0) == default("partitions")
    cluster_id = kafka["CLUSTER_ID"] or ""
    assert len(base64.urlsafe_b64decode(cluster_id + "==")) == 16, "KRaft needs a 16-byte id"
    assert kafka["KAFKA_LOG_DIRS"] in volumes(services["kafka"])


@pytest.mark.parametrize("env", [EXAMPLE, OVERRIDES], ids=["example", "overrides"])
def test_clickhouse_dsn_names_the_compose_server(env: dict[str, str]) -> None:
    from prism.sinks import parse_dsn

    services = load_compose(env)["services"]
    server = environment(services["clickhouse"])
    # Who logs in as whom: the administrator only for DDL, the worker as the writer.
    expected = {
        "migrate": (server["CLICKHOUSE_USER"], server["CLICKHOUSE_PASSWORD"]),
        "grants": (server["CLICKHOUSE_USER"], server["CLICKHOUSE_PASSWORD"]),
        "worker": ("prism_writer", env["CLICKHOUSE_WRITER_PASSWORD"]),
    }
    for name, (user, password) in expected.items():
        target = parse_dsn(environment(services[name])["PRISM_CLICKHOUSE_DSN"] or "")
        assert (target.kind, target.host, target.port) == (
            "http",
            "clickhouse",
            CLICKHOUSE_PORTS["http"],
        )
        assert target.database == default("clickhouse_database") == server["CLICKHOUSE_DB"]
        assert target.password is not None
        assert (target.username, target.password.get_secret_value()) == (user, password), name
    assert server["CLICKHOUSE_PASSWORD"] == env["CLICKHOUSE_ADMIN_PASSWORD"]
    assert "PRISM_CLICKHOUSE_DSN" not in environment(services["simulator"]), "Kafka only"
    assert published(services["clickhouse"]) == {8123: 8123}
    assert "8123/ping" in " ".join(services["clickhouse"]["healthcheck"]["test"])
    assert services["clickhouse"]["ulimits"]["nofile"]["hard"] >= 262144


def test_no_credential_is_a_literal_and_a_missing_one_stops_compose() -> None:
    raw = yaml.safe_load(COMPOSE.read_text(encoding="utf-8"))
    required = set(re.findall(r"\$\{([A-Z_]+PASSWORD):\?", COMPOSE.read_text(encoding="utf-8")))
    assert required == {
        "CLICKHOUSE_ADMIN_PASSWORD", "CLICKHOUSE_WRITER_PASSWORD",
        "CLICKHOUSE_READER_PASSWORD", "CLICKHOUSE_GRAFANA_PASSWORD", "GRAFANA_ADMIN_PASSWORD",
    }  # fmt: skip
    assert required <= set(EXAMPLE), "prism.env.example lists every password compose needs"
    for name, svc in raw["services"].items():
        for key, value in environment(svc).items():
            if "PASSWORD" in key and value is not None:
                assert re.fullmatch(r"\$\{[A-Z_]+:\?[^}]*\}", value), (name, key, value)
    for name in required:
        with pytest.raises(AssertionError, match=f"requires {name}"):
            load_compose({k: v for k, v in EXAMPLE.items() if k != name})


def test_only_the_administrator_manages_access() -> None:
    from prism.sinks import accounts

    services = load_compose(EXAMPLE)["services"]
    server = environment(services["clickhouse"])
    admin = server["CLICKHOUSE_USER"]
    assert server["CLICKHOUSE_DEFAULT_ACCESS_MANAGEMENT"] == "1" and admin == "prism_admin"
    grafana = environment(services["grafana"])
    assert grafana["CLICKHOUSE_USER"] == "prism_grafana" != admin
    # The grants step creates exactly the accounts the code defines, passwords from .env.
    grants = environment(services["grants"])
    assert command(services["grants"]) == ["grants", "--execute"]
    for account in accounts():
        assert grants[account.password_env] == EXAMPLE[account.password_env], account.user
    assert {a.user for a in accounts()} >= {"prism_writer", "prism_reader", "prism_grafana"}
    # Nothing that runs for long uses the administrator.
    for name in ("worker", "grafana"):
        deps = services[name]["depends_on"]
        assert deps["grants"]["condition"] == "service_completed_successfully", name
    assert services["grants"]["depends_on"]["migrate"]["condition"] == (
        "service_completed_successfully"
    )
    assert ".env" in (ROOT / ".gitignore").read_text(encoding="utf-8").split()


def test_clickhouse_server_has_the_settings_the_accounts_need() -> None:
    services = load_compose(EXAMPLE)["services"]
    mounted = volumes(services["clickhouse"])
    source, read_only = mounted["/etc/clickhouse-server/config.d/prism.xml"]
    assert (ROOT / source).resolve() == CLICKHOUSE_CONFIG and read_only
    import xml.etree.ElementTree as ET

    config = ET.parse(CLICKHOUSE_CONFIG).getroot()
    assert "SQL_" in (config.findtext("custom_settings_prefixes") or "").split(",")
    improvements = config.find("access_control_improvements")
    assert improvements is not None
    for flag in (
        "settings_constraints_replace_previous",
        "select_from_system_db_requires_grant",
    ):
        assert improvements.findtext(flag) == "true", flag
    from prism.sinks import TENANT_SETTING

    assert TENANT_SETTING.startswith("SQL_")


def _architecture_mounts() -> dict[str, str]:
    text = (ROOT / "ARCHITECTURE.md").read_text(encoding="utf-8")
    section = text.split("### Grafana files", 1)[1].split("\n#", 1)[0]
    mounts = dict(re.findall(r"`(\./[^`]+)`\s+at\s+`(/[^`]+)`", section))
    assert len(mounts) == 2, f"ARCHITECTURE.md's Grafana mounts changed: {mounts}"
    return mounts


def test_grafana_mounts_the_repo_folders_architecture_names(services: dict[str, Any]) -> None:
    mounted = volumes(services["grafana"])
    for source, target in _architecture_mounts().items():
        assert mounted.get(target) == (source, True), (
            f"{source} must be mounted read-only at {target}"
        )
        assert (ROOT / source).is_dir(), f"{source} is missing from the repo"
    providers = [
        p
        for path in (PROVISIONING / "dashboards").glob("*.y*ml")
        for p in yaml.safe_load(path.read_text(encoding="utf-8")).get("providers", [])
    ]
    for provider in providers:
        assert provider["options"]["path"] in mounted, (
            f"provider {provider['name']} reads elsewhere"
        )


def _grafana_env(env: Mapping[str, str]) -> dict[str, str]:
    grafana = environment(load_compose(env)["services"]["grafana"])
    return {k: v if v is not None else env.get(k, "") for k, v in grafana.items()}


def _expand_grafana(text: str, env: Mapping[str, str]) -> str:
    """Grafana provisioning's ``$NAME`` / ``${NAME}`` / ``$__env{NAME}`` (no defaults)."""
    text = re.sub(r"\$__env\{(\w+)\}", lambda m: env.get(m.group(1), ""), text)
    return re.sub(r"\$(?:\{([A-Z]\w*)\}|([A-Z]\w*))", lambda m: env.get(m[1] or m[2], ""), text)


@pytest.mark.parametrize("env", [EXAMPLE, OVERRIDES], ids=["example", "overrides"])
def test_grafana_gets_every_variable_its_provisioning_reads(env: dict[str, str]) -> None:
    grafana = _grafana_env(env)
    for path in PROVISIONING.rglob("*.y*ml"):
        text = path.read_text(encoding="utf-8")
        names = re.findall(r"\$__env\{(\w+)\}|\$\{?([A-Z][A-Z0-9_]*)", text)
        for name in {a or b for a, b in names}:
            assert grafana.get(name), f"{path.relative_to(ROOT)} reads ${name}; grafana has none"


@pytest.mark.parametrize("env", [EXAMPLE, OVERRIDES], ids=["example", "overrides"])
def test_grafana_datasource_reaches_the_compose_clickhouse(env: dict[str, str]) -> None:
    files = sorted((PROVISIONING / "datasources").glob("*.y*ml"))
    if not files:
        pytest.skip("no datasource provisioning yet: run `prism-pipeline dashboards build`")
    services = load_compose(env)["services"]
    server = environment(services["clickhouse"])
    grafana = _grafana_env(env)
    sources = [
        ds
        for path in files
        for ds in yaml.safe_load(_expand_grafana(path.read_text(encoding="utf-8"), grafana))[
            "datasources"
        ]
        if ds["type"] == "grafana-clickhouse-datasource"
    ]
    assert sources, "no grafana-clickhouse-datasource in dashboards/provisioning/datasources"
    for ds in sources:
        data = ds["jsonData"]
        assert data["host"] == "clickhouse" and "clickhouse" in services
        assert data["defaultDatabase"] == server["CLICKHOUSE_DB"] == default("clickhouse_database")
        assert data["port"] == CLICKHOUSE_PORTS[data.get("protocol", "native")]
        assert data["username"] == "prism_grafana" != server["CLICKHOUSE_USER"], (
            f"datasource {ds['uid']} logs in as {data['username']!r}; Grafana must use the "
            "read-only prism_grafana account, never the administrator"
        )
        assert ds["secureJsonData"]["password"] == env["CLICKHOUSE_GRAFANA_PASSWORD"]


def test_worker_keeps_state_on_a_volume_and_stops_gracefully(
    compose: dict[str, Any], services: dict[str, Any]
) -> None:
    worker = services["worker"]
    state_dir = environment(worker)["PRISM_STATE_DIR"]
    source, read_only = volumes(worker)[state_dir or ""]
    assert source in compose["volumes"] and not read_only
    assert f"PRISM_STATE_DIR={state_dir}" in DOCKERFILE.read_text(encoding="utf-8")
    assert command(worker) == ["worker"] and worker["restart"] == "unless-stopped"
    assert worker["init"] is True, "tini forwards SIGTERM so the worker can flush"
    grace = re.fullmatch(r"(\d+)s", str(worker.get("stop_grace_period")))
    assert grace and int(grace[1]) >= 30, "the worker needs time to flush its last batch"


@pytest.mark.parametrize("service", PIPELINE_SERVICES)
def test_pipeline_commands_parse_with_the_cli(service: str, services: dict[str, Any]) -> None:
    from prism.pipeline.cli import build_parser

    argv = command(services[service])
    parser = build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    if argv[0] not in commands.choices:
        pytest.skip(f"`prism-pipeline {argv[0]}` is not registered in pipeline/cli.py yet")
    try:
        parser.parse_args(argv)
    except SystemExit:
        pytest.fail(f"{service}: `prism-pipeline {shlex.join(argv)}` is rejected by the CLI")


def _dockerignored(path: str, patterns: list[str]) -> bool:
    """Docker's .dockerignore rule: the last matching pattern wins; a parent match counts."""
    ignored = False
    for raw in patterns:
        negate = raw.startswith("!")
        pattern = raw.lstrip("!").strip("/")
        regex = re.escape(pattern).replace(r"\*\*", ".*").replace(r"\*", "[^/]*")
        regex = regex.replace(r"\?", "[^/]")
        parts = path.split("/")
        if any(re.fullmatch(regex, "/".join(parts[:i])) for i in range(1, len(parts) + 1)):
            ignored = not negate
    return ignored


def test_image_installs_the_project_and_runs_its_console_script() -> None:
    project = PYPROJECT["project"]
    text = DOCKERFILE.read_text(encoding="utf-8")
    stages = re.findall(r"^FROM\s+python:(\d+\.\d+)-slim\b", text, re.M)
    assert stages, "the image runs on a python:X.Y-slim base"
    assert SpecifierSet(project["requires-python"]).contains(stages[-1]), stages[-1]
    entry = re.findall(r"^ENTRYPOINT\s+(\[.*\])", text, re.M)
    assert entry and yaml.safe_load(entry[-1]) == list(project["scripts"])
    patterns = [
        line.strip()
        for line in (ROOT / ".dockerignore").read_text(encoding="utf-8").splitlines()
        if line.strip() and not line.startswith("#")
    ]
    copied = [
        src
        for args in re.findall(r"^COPY\s+(?!--from)(.+)$", text, re.M)
        for src in args.split()[:-1]
    ]
    packages = sorted(set(PYPROJECT["tool"]["setuptools"]["package-dir"].values()))
    for src in ["pyproject.toml", project["readme"], *packages]:
        assert src in copied, f"the image build needs {src}, which the Dockerfile does not copy"
    for src in copied:
        assert (ROOT / src).exists(), f"the Dockerfile copies {src}, which is not in the repo"
        assert not _dockerignored(src, patterns), f".dockerignore hides {src} from the build"
    for local in (".venv/bin/python", ".data/ledger", "devstack/kafka/lib", "dashboards/json"):
        assert _dockerignored(local, patterns), f"{local} would be sent to the image build"


def _compose_spec() -> dict[str, Any]:
    """The Compose Specification's JSON schema, as check-jsonschema vendors it."""
    import json
    from importlib.metadata import files

    found = [f for f in files("check-jsonschema") or [] if f.name == "compose-spec.json"]
    assert found, "check-jsonschema (a dev dependency) no longer vendors compose-spec.json"
    schema: dict[str, Any] = json.loads(found[0].read_text(encoding="utf-8"))
    return schema


@pytest.mark.parametrize("env", [None, EXAMPLE], ids=["as-written", "interpolated"])
def test_the_file_validates_against_the_compose_spec(env: dict[str, str] | None) -> None:
    from jsonschema import Draft7Validator

    raw = yaml.safe_load(COMPOSE.read_text(encoding="utf-8"))
    document = raw if env is None else _resolve(raw, env)
    validator = Draft7Validator(_compose_spec())
    errors = [
        f"{'/'.join(map(str, e.absolute_path))}: {e.message}"
        for e in validator.iter_errors(document)
    ]
    assert not errors, errors
    # the schema is strict enough to notice a mistake
    broken = {
        **document,
        "services": {
            **document["services"],
            "worker": {
                **document["services"]["worker"],
                "depends_on": {"migrate": {"condition": "done"}},
            },
        },
    }
    assert not validator.is_valid(broken)


def test_migrate_runs_before_every_service_that_reads_the_ledger(services: dict[str, Any]) -> None:
    readers = {
        name
        for name, svc in services.items()
        if "PRISM_CLICKHOUSE_DSN" in environment(svc) or "CLICKHOUSE_HOST" in environment(svc)
    } - {"migrate"}
    assert {"grants", "worker", "grafana"} <= readers
    for name in readers:
        dep = (services[name].get("depends_on") or {}).get("migrate") or {}
        assert dep.get("condition") == "service_completed_successfully", name


def test_worker_healthcheck_asks_healthz_on_the_metrics_port(services: dict[str, Any]) -> None:
    check = services["worker"]["healthcheck"]
    url = re.search(r"http://127\.0\.0\.1:(\d+)/healthz", " ".join(check["test"]))
    assert url, "the worker's healthcheck must GET /healthz"
    assert check["test"][0] == "CMD" and check["test"][1] == "python", "the image has no curl"
    if "metrics_port" not in Settings.model_fields:
        pytest.skip("the worker's /healthz endpoint (PRISM_METRICS_PORT) is not in this tree")
    assert int(url[1]) == default("metrics_port")
    host = environment(services["worker"]).get("PRISM_METRICS_HOST") or default("metrics_host")
    assert host in ("127.0.0.1", "0.0.0.0"), "the probe runs inside the container"


def test_readme_and_the_file_header_start_the_simulator_alike() -> None:
    pattern = r"docker compose --profile demo [^`\n#]*simulator"
    header = re.findall(pattern, COMPOSE.read_text(encoding="utf-8").split("\nname:", 1)[0])
    readme = re.findall(pattern, (ROOT / "README.md").read_text(encoding="utf-8"))
    assert header and readme
    assert {h.strip() for h in header} == {r.strip() for r in readme}


def test_image_compiles_the_core_with_the_projects_mypy_and_runs_only_that_build() -> None:
    """The image runs the mypyc build (``PRISM_CORE=compiled``), made in the build stage
    with the mypy and setuptools the dev extra pins (``make compile``'s);
    tests/integration/test_compiled_install.py replays the step outside Docker."""
    from prism.schemas._compiled import MODES

    text = DOCKERFILE.read_text(encoding="utf-8")
    dev = PYPROJECT["project"]["optional-dependencies"]["dev"]
    pins = {re.split(r"[<>=!~ ]", d, maxsplit=1)[0]: d for d in dev}
    installs = re.findall(r"/opt/mypyc/bin/pip install ([^\n\\]+)", text)
    assert installs, "the build stage installs no compiler"
    assert sorted(shlex.split(installs[0])) == sorted([pins["mypy"], pins["setuptools"]])
    build, final = text.split(" AS build\n", 1)[1].split("\nFROM ", 1)
    assert "/opt/mypyc/bin/python -m prism.devstack.compile" in build
    env = dict(re.findall(r"\b(PRISM_CORE)=(\S+)", final))
    assert env == {"PRISM_CORE": "compiled"} and env["PRISM_CORE"] in MODES
    assert "/opt/mypyc" not in final  # the compiler stays in the build stage
