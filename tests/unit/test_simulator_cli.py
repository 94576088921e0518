"""``prism-pipeline simulate`` writes the fleet and its manifest, deterministically."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest

from prism.pipeline.cli import main
from prism.runtime.simulator import FLEET_SPAN, FleetConfig, simulate


def test_writes_jsonl_and_manifest_deterministically(tmp_path, capsys) -> None:
    args = [
        "simulate",
        "--runs",
        "40",
        "--seed",
        "4",
        "--malformed",
        "0.1",
        "--duplicates",
        "0.05",
        "--start",
        "2027-01-01T08:00:00+01:00",
        "--stale-after",
        "1800",
    ]
    for name in ("a", "b"):
        code = main(
            [
                *args,
                "--out",
                str(tmp_path / f"{name}.jsonl"),
                "--manifest",
                str(tmp_path / f"{name}.json"),
            ]
        )
        assert code == 0
    assert (tmp_path / "a.jsonl").read_bytes() == (tmp_path / "b.jsonl").read_bytes()
    manifest = json.loads((tmp_path / "a.json").read_text())
    lines = (tmp_path / "a.jsonl").read_bytes().split(b"\n")[:-1]
    assert len(lines) == manifest["counts"]["records"]
    assert manifest["params"]["seed"] == 4 and manifest["params"]["runs"] == 40
    assert manifest["params"]["stale_after_seconds"] == 1800
    assert manifest["params"]["knobs"]["malformed"] == 0.1
    assert manifest["params"]["start"] == "2027-01-01T07:00:00+00:00"
    assert sum(manifest["dlq"].values()) > 0
    out = capsys.readouterr().out
    assert f"wrote {len(lines)} lines" in out


def test_needs_an_output(capsys) -> None:
    assert main(["simulate", "--runs", "5"]) == 2
    assert "give --out FILE" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--duplicates", "2"], "not a probability"),
        (["--rate", "0"], "must be > 0"),
        (["--start", "2026-01-01T00:00:00"], "needs a UTC offset"),
        (["--clock", "sundial"], "invalid choice"),
        (["--hostile", "-0.1"], "not a probability"),
        (["--limit-death-burst", "many"], "'many' is not a whole number"),
        (["--channel-operations", "-3"], "-3 must be >= 0"),
        (["--processing-clock", "noon"], "is not an ISO 8601 timestamp"),
    ],
)
def test_bad_options_are_explained(argv: list[str], needle: str, capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["simulate", "--out", "x.jsonl", *argv])
    assert exc.value.code == 2
    assert needle in capsys.readouterr().err


def test_help_describes_the_chaos_knobs(capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["simulate", "--help"])
    assert exc.value.code == 0
    text = capsys.readouterr().out
    for flag in (
        "--duplicates",
        "--reorder-window",
        "--post-terminal",
        "--conflicting-terminals",
        "--malformed",
        "--oversized",
        "--hostile",
        "--guardrail-denials",
        "--limit-death-burst",
        "--channel-operations",
        "--partitions",
        "--processing-clock",
        "--kafka",
        "--rate",
    ):
        assert flag in text
    for kind in (
        "reorder_terminal",
        "late_tenant",
        "clock_skew",
        "run_id_collision",
        "duplicate_usage",
        "quiet_partition",
        "delivery_unknown",
        "execution_unknown",
    ):
        assert kind in text  # fmt: skip


def test_new_knobs_reach_the_fleet_and_the_manifest(tmp_path, capsys) -> None:
    manifest_path = tmp_path / "m.json"
    code = main(
        [
            "simulate", "--runs", "80", "--seed", "6", "--hostile", "0.05",
            "--guardrail-denials", "0.3", "--limit-death-burst", "5",
            "--channel-operations", "60", "--partitions", "6",
            "--processing-clock", "2026-11-30T04:00:00+00:00",
            "--out", str(tmp_path / "f.jsonl"), "--manifest", str(manifest_path),
        ]
    )  # fmt: skip
    assert code == 0
    manifest = json.loads(manifest_path.read_text())
    knobs = manifest["params"]["knobs"]
    assert (knobs["hostile"], knobs["guardrail_denials"]) == (0.05, 0.3)
    assert (knobs["limit_death_burst"], knobs["channel_operations"]) == (5, 60)
    assert manifest["params"]["partitions"] == 6
    assert manifest["params"]["processing_clock"] == "2026-11-30T04:00:00.000+00:00"
    assert manifest["injected"]["quiet_partition"] == 5
    assert manifest["guardrails"]["denials"] > 0
    assert manifest["channels"]["counts"]["operations"] > 0
    (alert,) = manifest["alerts"]["run_limit_exhaustion"]
    out = capsys.readouterr().out
    assert f"expected exhaustion alerts: acme-corp/maxTurns at {alert['fired_at']}" in out
    assert "channel operations:" in out and "open items" in out


def test_wall_clock_fleets_end_near_now() -> None:
    fleet = simulate(FleetConfig(runs=30, seed=1, clock="wall"))
    end = datetime.fromisoformat(fleet.manifest["watermark"])
    now = datetime.now(UTC)
    assert now - FLEET_SPAN <= end <= now + timedelta(minutes=1)
    fixed = simulate(FleetConfig(runs=30, seed=1))
    assert fleet.manifest["watermark"] != fixed.manifest["watermark"]
    assert [r["status"] for r in fleet.manifest["runs"].values()] == [
        r["status"] for r in fixed.manifest["runs"].values()
    ]
