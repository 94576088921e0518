"""``prism-pipeline traces``: options that are wrong stop it before it reads the ledger."""

from __future__ import annotations

import pytest

from prism.pipeline.cli import EXIT_USAGE, main
from prism.pipeline.commands.traces import DEFAULT_ENDPOINT, endpoint_of


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--local", "jaeger", "--endpoint", "http://x:4318"], "give --local or --endpoint"),
        (["--endpoint", "ftp://x"], "is not an http(s) URL"),
        (["--header", "no-equals-sign"], "is not NAME=VALUE"),
        (["--local", "zipkin"], "invalid choice"),
        (["--timeout", "0"], "--timeout"),
    ],
)
def test_a_bad_option_is_one_line_and_exit_2(
    args: list[str], said: str, capsys: pytest.CaptureFixture[str], tmp_path: object
) -> None:
    try:
        code = main(["traces", *args, "--clickhouse", f"chdb://{tmp_path}/none"])
    except SystemExit as exc:  # argparse's own refusals
        code = int(exc.code or 0)
    err = capsys.readouterr().err
    assert code == EXIT_USAGE and said in err and len(err.strip().splitlines()) == 1, err


def test_the_endpoint_comes_from_the_flag_then_the_otel_variables(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", raising=False)
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_ENDPOINT", raising=False)
    assert endpoint_of(None) == DEFAULT_ENDPOINT
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://all:4318")
    assert endpoint_of(None) == "http://all:4318"
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://traces:4318/v1/traces")
    assert endpoint_of(None) == "http://traces:4318/v1/traces"
    assert endpoint_of("http://flag:1") == "http://flag:1"
