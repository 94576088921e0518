"""``prism-pipeline report``: the ledger as one self-contained HTML page of charts.

The page draws the panels of the Grafana dashboard ``prism-report``
(``prism.dashboards.report_panels``), whose queries run on the ledger after the same
macro expansion Grafana applies, so the page and Grafana agree by construction. Charts
are inline SVG; the page needs no network and no script.

Example::

    client = sinks.connect("chdb://./.data/ledger", "prism")
    report = build_report(client, "prism", ledger="chdb://./.data/ledger")
    report.write(Path(".data/report.html"))
"""

from prism.pipeline.report._build import DEFAULT_OUT, Report, build_report
from prism.pipeline.report._data import ReportError

__all__ = ["DEFAULT_OUT", "Report", "ReportError", "build_report"]
