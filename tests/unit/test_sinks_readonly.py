"""What ``prism-pipeline query`` promises without an engine: its errors and its help.

The statement check itself is ClickHouse's parser plus a walk of its tree, so its cases
(reads that pass, hostile statements that are refused) run on a real chDB ledger in
tests/integration/test_query_readonly.py.
"""

from __future__ import annotations

import pytest

from prism.pipeline.cli import exit_code_of, main
from prism.sinks import LedgerQueryError, LedgerReadOnlyError
from prism.sinks._readonly import QuerySyntaxError


def test_refusal_is_a_query_error_of_the_ledger() -> None:
    assert issubclass(LedgerReadOnlyError, LedgerQueryError)


def test_a_syntax_error_is_a_usage_error_not_a_refusal_to_write() -> None:
    assert exit_code_of(QuerySyntaxError("parse error: Syntax error")) == 2
    assert exit_code_of(LedgerReadOnlyError("refused")) == 2


def test_help_says_what_runs_and_what_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["query", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--allow-writes" in text and "readonly=1" in text and "file()" in text
    assert "ClickHouse parses the statement" in text and "examples:" in text


def test_a_param_that_fills_no_placeholder_is_named(
    capsys: pytest.CaptureFixture[str],
) -> None:
    sql = "SELECT count() FROM runs WHERE run_id LIKE 'run%'"
    assert main(["query", sql, "--param", "tenant=acme"]) == 2
    assert capsys.readouterr().err.strip() == (
        "prism-pipeline query: error: --param tenant fills nothing: the SQL has no "
        "{tenant:Type} placeholder"
    )
