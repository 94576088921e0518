"""``BudgetGuard`` without a broker (fed through ``apply``), the desk's records it reads,
and the import direction: an agent runtime never imports the pipeline."""

from __future__ import annotations

import subprocess
import sys
from datetime import UTC, datetime

from prism.pipeline.budgets import BudgetDesk, Budgets
from prism.pipeline.core import LaneReport
from prism.runtime import BudgetGuard
from tests.unit.test_budgets_desk import at, budgets, row

NOW = datetime(2026, 11, 20, 12, tzinfo=UTC)


def test_the_guard_reads_the_desks_records_and_refuses_every_call_in_an_exceeded_scope() -> None:
    desk = BudgetDesk(budgets(), lanes=[0])
    desk.observe([row("a", 1, "6", agent="other"), row("b", 2, "5")])  # acme 11 of 10 USD
    desk.report(0, LaneReport(at(10)))
    desk.decide()
    guard = BudgetGuard()
    for rec in desk.states():
        guard.apply(rec.key, rec.value)
    refused = guard.check("acme", agent="other", now=NOW)
    assert (refused.allowed, refused.scope_id) == (False, "tenant=acme")
    assert refused.reason.startswith("budget tenant=acme exceeded: spent 11 of 10 USD")
    assert guard.check("globex", agent="other", now=NOW)
    guard.apply(b"tenant=acme", None)  # a tombstone: the budget is gone
    assert guard.check("acme", agent="bot", now=NOW)  # the bot budget: 2.5 of 4 EUR


def test_provisional_refuses_only_when_asked_and_bad_records_are_skipped() -> None:
    desk = BudgetDesk(Budgets.model_validate(budgets().model_dump(by_alias=True)), lanes=[0])
    desk.observe([row("a", 1, "1"), row("b", 30, "20")])  # 20 beyond the settled time
    desk.report(0, LaneReport(at(10)))
    desk.decide()
    records = desk.states()
    lenient, strict = BudgetGuard(), BudgetGuard(use_provisional=True)
    for guard in (lenient, strict):
        for rec in records:
            guard.apply(rec.key, rec.value)
        guard.apply(b"tenant=x", b"not json")
        guard.apply(None, b"{}")
        assert guard.skipped == 2
    assert lenient.check("acme", now=NOW).allowed
    decision = strict.check("acme", now=NOW)
    assert not decision.allowed and "provisional spend: 21 of 10 USD" in decision.reason


def test_the_runtime_package_does_not_import_the_pipeline() -> None:
    code = (
        "import sys, prism.runtime; "
        "print(sorted(m for m in sys.modules if m.startswith(('prism.pipeline', 'prism.sinks'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
