"""One colour per run status, from the Okabe-Ito palette, for the dashboards and the report.

Okabe and Ito's eight colours stay apart for the common colour-vision deficiencies. Each
run status (CONTRACT.md rule 9) has one fixed colour, in one order: the order of
``RUN_STATUSES`` is the legend order and the stacking order (bottom first) wherever runs
are drawn by status. Grafana gets the colours as field overrides by name
(``color_by_name``); ``prism-pipeline report`` reads them back from the dashboard JSON.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from grafana_foundation_sdk.models import dashboard as dashboard_models

__all__ = [
    "OKABE_ITO",
    "OTHER_COLOR",
    "OTHER_SERIES",
    "RUN_STATUSES",
    "STATUS_COLORS",
    "color_by_name",
    "fixed_color",
    "status_columns",
]

# name -> hex, in Okabe and Ito's order
OKABE_ITO = {
    "orange": "#E69F00",
    "sky blue": "#56B4E9",
    "bluish green": "#009E73",
    "yellow": "#F0E442",
    "blue": "#0072B2",
    "vermillion": "#D55E00",
    "reddish purple": "#CC79A7",
    "black": "#000000",
}

# Every run status, outcomes first (bottom of a stack), then the runs still open.
STATUS_COLORS: dict[str, str] = {
    "succeeded": OKABE_ITO["bluish green"],
    "failed": OKABE_ITO["vermillion"],
    "aborted": OKABE_ITO["orange"],
    "denied": OKABE_ITO["reddish purple"],
    "incomplete": OKABE_ITO["yellow"],
    "running": OKABE_ITO["sky blue"],
    "suspended": OKABE_ITO["blue"],
}
RUN_STATUSES: tuple[str, ...] = tuple(STATUS_COLORS)

# The series that folds everything past a chart's top N ("other"): a neutral grey, matched
# by a regular expression, since Grafana shows a long-format series as '<value> <label>'.
OTHER_COLOR = "#8C8C8C"
OTHER_SERIES = r"^(\w+ )?other$"


def status_columns(column: str = "status") -> str:
    """One SQL column per run status, in ``RUN_STATUSES`` order: ``countIf(...) AS succeeded``.

    Wide columns keep every status's name, colour and legend place fixed; Grafana would
    otherwise sort long-format series by name and prefix them with the value column.
    """
    return ", ".join(f"countIf({column} = '{s}') AS {s}" for s in RUN_STATUSES)


def fixed_color(color: str) -> dashboard_models.DynamicConfigValue:
    """The field-config property that paints a series in ``color``."""
    return dashboard_models.DynamicConfigValue(
        id_val="color", value={"mode": "fixed", "fixedColor": color}
    )


def color_by_name(panel: Any, colors: Mapping[str, str]) -> None:
    """Give each series of ``panel`` (a panel builder) named in ``colors`` its fixed colour."""
    for name, color in colors.items():
        panel.override_by_name(name, [fixed_color(color)])
