"""``prices list`` only reads: on a ledger that is not there it says so and creates nothing.

It used to open the ledger as a writer does, so a mistyped chDB path became an empty
engine directory before the read failed on a database that does not exist.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from prism.pipeline.cli import main


@pytest.fixture(autouse=True)
def _no_prism_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in ("PRISM_CLICKHOUSE_DSN", "PRISM_CLICKHOUSE_DATABASE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)


@pytest.mark.parametrize(
    ("dsn", "where"),
    [
        ("chdb://./.data/ledgr", ".data/ledgr"),
        ("chdb://{tmp}/ledgr", "ledgr"),
        (None, ".data/ledger"),  # the default ledger, before any demo ran
    ],
)
@pytest.mark.parametrize("fmt", ["table", "json"])
def test_prices_list_on_a_missing_ledger_says_so_and_creates_nothing(
    dsn: str | None, where: str, fmt: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    flags = [] if dsn is None else ["--clickhouse", dsn.format(tmp=tmp_path)]
    code = main(["prices", "list", "--format", fmt, *flags])
    captured = capsys.readouterr()
    assert code == 2, captured.err
    assert captured.err.strip() == (
        f"prism-pipeline prices: error: no ledger at {tmp_path.resolve() / where} "
        "(run `make demo` or pass --clickhouse)"
    )
    assert captured.out == ""
    assert list(tmp_path.iterdir()) == []  # nothing was created
