"""Commands that only read the ledger never create anything, whatever path they are given.

A mistyped chDB path used to become an empty engine directory that then answered
"Unknown table"; a mistyped ``report --out`` became a directory tree. Both now stop with
one line naming the path, before any engine is opened (no engine runs in this process).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from prism.pipeline.cli import main

READERS = [
    ["billing", "--from", "2026-11-30", "--to", "2026-12-01"],
    ["billing"],
    ["invoice", "--month", "2026-11"],
    ["invoice"],
    ["query", "SELECT count() FROM runs"],
    ["report", "--out", "page.html"],
]


@pytest.fixture(autouse=True)
def _no_prism_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in ("PRISM_CLICKHOUSE_DSN", "PRISM_CLICKHOUSE_DATABASE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)


@pytest.mark.parametrize("argv", READERS, ids=lambda a: a[0] + ("" if len(a) > 1 else "-bare"))
@pytest.mark.parametrize(
    ("dsn", "where"),
    [
        ("chdb://./.data/ledgr", ".data/ledgr"),  # relative: used to be created under the cwd
        ("chdb://{tmp}/ledgr", "ledgr"),
        (None, ".data/ledger"),  # the default ledger, before any demo ran
    ],
)
def test_a_reader_on_a_missing_ledger_says_so_and_creates_nothing(
    argv: list[str],
    dsn: str | None,
    where: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    flags = [] if dsn is None else ["--clickhouse", dsn.format(tmp=tmp_path)]
    code = main([*argv, *flags])
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert err == (
        f"prism-pipeline {argv[0]}: error: no ledger at {tmp_path.resolve() / where} "
        "(run `make demo` or pass --clickhouse)"
    )
    assert list(tmp_path.iterdir()) == []  # nothing was created


def test_a_reader_on_a_directory_that_holds_no_engine_leaves_it_alone(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "photos"
    folder.mkdir()
    code = main(["query", "SELECT 1", "--clickhouse", f"chdb://{folder}"])
    assert code == 2
    assert f"no ledger at {folder.resolve()}" in capsys.readouterr().err
    assert list(folder.iterdir()) == []


def test_report_refuses_an_out_path_whose_directory_is_missing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "typo" / "deeper" / "x.html"
    code = main(["report", "--out", str(out)])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert err == (
        f"prism-pipeline report: error: --out {out}: the directory {out.parent} does not "
        "exist; create it first (mkdir -p) or pick another path"
    )
    assert not (tmp_path / "typo").exists()
