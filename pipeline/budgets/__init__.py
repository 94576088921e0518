"""Spend budgets (issue 31): a budgets file, the spend lanes send, and the one budget desk.

Every lane turns its step's ledger rows into spend records (``spend_records``) for the
single-partition ``<prefix>.limit-deaths`` topic; one ``BudgetDesk`` reads that topic,
settles spend at the watermark less the allowed lateness (schemas/CONTRACT.md rule 16),
decides ``budget_threshold`` alerts and produces the compacted ``prism.budget-state``
records. docs/BUDGETS.md describes the file and the records.

Example::

    budgets = read_budgets("budgets.toml")
    # each lane, per step, before its lane report:
    records = spend_records(out, prices=PriceBook(price_book(client, db)))
    # the desk, per batch of limit-deaths values:
    desk = BudgetDesk(budgets, lateness_s=30, lanes=range(partitions))
    alerts, states = desk.step(values)
"""

from ._config import SCOPE_DIMENSIONS, Budget, Budgets, BudgetScope, Rate, Thresholds, read_budgets
from ._desk import BudgetDesk
from ._errors import BudgetConfigError, BudgetError, BudgetStateError
from ._period import PERIODS, period_bounds
from ._records import RULE_BUDGET, alert_id
from ._spend import PriceBook, SpendRow, decode_budget_input, spend_records, spend_rows

__all__ = [
    "PERIODS",
    "RULE_BUDGET",
    "SCOPE_DIMENSIONS",
    "Budget",
    "BudgetConfigError",
    "BudgetDesk",
    "BudgetError",
    "BudgetScope",
    "BudgetStateError",
    "Budgets",
    "PriceBook",
    "Rate",
    "SpendRow",
    "Thresholds",
    "alert_id",
    "decode_budget_input",
    "period_bounds",
    "read_budgets",
    "spend_records",
    "spend_rows",
]
