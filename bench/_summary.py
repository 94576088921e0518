"""The table ``python -m bench`` prints: issue 29's figures, each with its target beside it.

Every benchmark returns rows (``bench``, ``metric``, ``value``, ``unit``); the JSON keeps
them all. This module picks the figures a reader acts on, in a fixed order, derives the
comparisons the targets are stated in (the worker against the bare loop, ``ingest-file``
against the worker) and puts each target beside its figure with "met", "not met" or
"not measured". Targets are reported, never asserted.

Example::

    rows += derived_rows(rows)
    print(render_summary(summary_rows(rows)))
"""

from __future__ import annotations

import re
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "SUMMARY",
    "TARGETS",
    "Line",
    "Target",
    "derived_rows",
    "evaluate_targets",
    "format_value",
    "render_summary",
    "summary_rows",
]

Row = dict[str, Any]


@dataclass(frozen=True, slots=True)
class Target:
    """A figure the issue asks for: ``bench/metric`` compared with ``threshold``."""

    label: str
    bench: str
    metric: str
    op: str  # ">=" or "<="
    threshold: float
    unit: str

    def met(self, value: float) -> bool:
        return value >= self.threshold if self.op == ">=" else value <= self.threshold

    def text(self) -> str:
        bound = self.threshold
        shown = f"{bound:,.0f}" if bound == int(bound) else format_value(bound)
        return f"{self.op} {shown} {self.unit}"


# Issue 29, "Done when" (each the median of three runs there; one run here).
TARGETS = (
    Target("worker >= 40% of the bare loop", "pipeline", "worker_vs_baseline", ">=", 40, "%"),
    Target(
        "freshness p99 <= 1 s at 5,000 events/s", "pipeline", "freshness_5000_p99", "<=", 1000, "ms"
    ),
    Target(
        "freshness p99 <= 2 s at 10,000 events/s",
        "pipeline",
        "freshness_10000_p99",
        "<=",
        2000,
        "ms",
    ),
    Target(
        "worker peak RSS within 150 MiB of the bare loop's (backlog)",
        "pipeline",
        "worker_peak_rss_over_baseline",
        "<=",
        150,
        "MiB",
    ),
    Target(
        "worker peak RSS within 150 MiB of the bare loop's at 5,000 events/s",
        "pipeline",
        "freshness_5000_rss_over_baseline",
        "<=",
        150,
        "MiB",
    ),
    Target(
        "worker peak RSS within 150 MiB of the bare loop's at 10,000 events/s",
        "pipeline",
        "freshness_10000_rss_over_baseline",
        "<=",
        150,
        "MiB",
    ),
    Target(
        "ingest-file within 20% of the worker's events/s",
        "pipeline",
        "ingest_vs_worker",
        ">=",
        80,
        "%",
    ),
    Target(
        "billing (one tenant) p95 <= 30 ms",
        "ledger",
        "billing_month_one_tenant_p95",
        "<=",
        30,
        "ms",
    ),
    Target(
        "billing (all tenants) p95 <= 60 ms",
        "ledger",
        "billing_month_all_tenants_p95",
        "<=",
        60,
        "ms",
    ),
    Target("run timeline p95 <= 40 ms", "ledger", "run_timeline_p95", "<=", 40, "ms"),
    Target("first billing report < 2 s", "ledger", "billing_first_ms", "<=", 2000, "ms"),
)


@dataclass(frozen=True, slots=True)
class Line:
    """A line of the printed table: the rows of ``bench`` whose metric matches ``pattern``
    (a regular expression matched whole), labelled by ``label`` (``{0}``, ``{1}``: the
    pattern's groups). A line with a target is printed even when nothing measured it."""

    bench: str
    pattern: str
    label: str


_RATE = r"freshness_(\d+)"
SUMMARY = (
    Line("pipeline", "worker_events_per_s", "worker events/s (backlog)"),
    Line("pipeline", "baseline_events_per_s", "bare loop events/s (backlog)"),
    Line("pipeline", "worker_vs_baseline", "worker / bare loop"),
    Line("pipeline", "machinery_events_per_s", "worker without its core events/s (backlog)"),
    Line("pipeline", "machinery_vs_baseline", "worker without its core / bare loop"),
    Line("pipeline", _RATE + "_offered_rate", "offered at {0}/s: reached"),
    Line("pipeline", _RATE + "_p99", "freshness p99 at {0}/s offered"),
    Line("pipeline", "worker_peak_rss", "worker peak RSS (backlog)"),
    Line("pipeline", "worker_end_rss", "worker end RSS (backlog)"),
    Line("pipeline", "baseline_peak_rss", "bare loop peak RSS"),
    Line("pipeline", "baseline_end_rss", "bare loop end RSS"),
    Line("pipeline", "worker_peak_rss_over_baseline", "worker peak - bare loop peak (backlog)"),
    Line("pipeline", _RATE + "_worker_idle_rss", "worker RSS after warm-up, {0}/s run"),
    Line("pipeline", _RATE + "_worker_peak_rss", "worker peak RSS at {0}/s"),
    Line("pipeline", _RATE + "_worker_end_rss", "worker end RSS at {0}/s"),
    Line("pipeline", _RATE + "_rss_over_baseline", "worker peak - bare loop peak at {0}/s"),
    Line("pipeline", r"worker_stage_(\w+)", "worker stage {0}"),
    Line("stages", r"stage_([\w.]+)", "stage {0} (no Kafka)"),
    Line("stages", "stages_events_per_s", "stages loop events/s (no Kafka)"),
    Line("pipeline", "ingest_events_per_s", "ingest-file events/s"),
    Line("pipeline", "ingest_vs_worker", "ingest-file / worker"),
    Line("pipeline", "ingest_peak_rss", "ingest-file peak RSS"),
    Line("ledger", "billing_month_one_tenant_p95", "billing one tenant p95"),
    Line("ledger", "billing_month_all_tenants_p95", "billing all tenants p95"),
    Line("ledger", "run_timeline_p95", "run timeline p95"),
    Line("ledger", "billing_first_ms", "first billing report"),
    Line("scaleout", r"scaleout_(\d+)w_events_per_s", "{0} worker process(es) events/s"),
    Line("scaleout", r"scaleout_(\d+)w_speedup", "{0} worker process(es) speed-up"),
)


def _value(rows: Sequence[Row], bench: str, metric: str) -> float | None:
    for r in rows:
        if r["bench"] == bench and r["metric"] == metric:
            return float(r["value"])
    return None


def _derived(metric: str, value: float, unit: str) -> Row:
    return {"bench": "pipeline", "metric": metric, "value": round(value, 3), "unit": unit}


def derived_rows(rows: Sequence[Row]) -> list[Row]:
    """The comparisons the targets are stated in, from the rows measured in this run:
    ``worker_peak_rss_over_baseline`` and ``freshness_<rate>_rss_over_baseline`` (MiB
    above the bare loop's peak) and ``ingest_vs_worker`` (%). Each only when both sides
    were measured; a row already present is not derived again."""
    have = {r["metric"] for r in rows if r["bench"] == "pipeline"}
    out: list[Row] = []
    base = _value(rows, "pipeline", "baseline_peak_rss")
    if base is not None:
        peaks = [("worker_peak_rss", "worker_peak_rss_over_baseline")]
        for metric in sorted(have):
            m = re.fullmatch(_RATE + "_worker_peak_rss", metric)
            if m:
                peaks.append((metric, f"freshness_{m.group(1)}_rss_over_baseline"))
        for peak, name in peaks:
            value = _value(rows, "pipeline", peak)
            if value is not None and name not in have:
                out.append(_derived(name, value - base, "MiB"))
    worker = _value(rows, "pipeline", "worker_events_per_s")
    ingest = _value(rows, "pipeline", "ingest_events_per_s")
    if worker and ingest is not None and "ingest_vs_worker" not in have:
        out.append(_derived("ingest_vs_worker", 100 * ingest / worker, "%"))
    return out


def _target_of(bench: str, metric: str) -> Target | None:
    return next((t for t in TARGETS if (t.bench, t.metric) == (bench, metric)), None)


def summary_rows(rows: Sequence[Row], ran: Collection[str] | None = None) -> list[Row]:
    """The printed table's lines in ``SUMMARY`` order: ``label``, ``row`` (bench/metric),
    ``value``, ``unit``, ``target`` (text or "") and ``status`` ("met", "not met", "not
    measured", or "" without a target). A target no row measured still gets its line when
    its benchmark ran (``ran``: "pipeline", "ledger", ...; None: every target's)."""
    out: list[Row] = []
    shown: set[tuple[str, str]] = set()
    for line in SUMMARY:
        matched = [
            (r, m)
            for r in rows
            if r["bench"] == line.bench and (m := re.fullmatch(line.pattern, r["metric"]))
        ]
        if line.pattern.startswith(_RATE):  # rates in ascending order, not run order
            matched.sort(key=lambda rm: float(rm[1].group(1)))
        for r, m in matched:
            key = (r["bench"], r["metric"])
            if key in shown:
                continue
            shown.add(key)
            target = _target_of(*key)
            status = "" if target is None else ("met" if target.met(r["value"]) else "not met")
            out.append(
                {
                    "label": line.label.format(*m.groups()),
                    "row": f"{r['bench']}/{r['metric']}",
                    "value": r["value"],
                    "unit": r["unit"],
                    "target": target.text() if target else "",
                    "status": status,
                }
            )
        for t in TARGETS:  # the targets of this line that nothing measured
            key = (t.bench, t.metric)
            if ran is not None and t.bench not in ran:
                continue
            if t.bench == line.bench and re.fullmatch(line.pattern, t.metric) and key not in shown:
                shown.add(key)
                m = re.fullmatch(line.pattern, t.metric)
                assert m is not None
                out.append(
                    {
                        "label": line.label.format(*m.groups()),
                        "row": f"{t.bench}/{t.metric}",
                        "value": None,
                        "unit": t.unit,
                        "target": t.text(),
                        "status": "not measured",
                    }
                )
    return out


def evaluate_targets(rows: Sequence[Row]) -> list[dict[str, Any]]:
    """Each target with its measured value and status ("met", "not met", "not measured");
    a freshness target is measured only when its rate was offered (``--rate``)."""
    found = {(r["bench"], r["metric"]): r["value"] for r in rows}
    out = []
    for t in TARGETS:
        value = found.get((t.bench, t.metric))
        status = "not measured" if value is None else ("met" if t.met(value) else "not met")
        out.append(
            {
                "target": t.label,
                "metric": f"{t.bench}/{t.metric}",
                "op": t.op,
                "threshold": t.threshold,
                "unit": t.unit,
                "value": value,
                "status": status,
            }
        )
    return out


def format_value(value: float | None) -> str:
    """A figure for the table: thousands separators for large values, 2 decimals otherwise."""
    if value is None:
        return "-"
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    if abs(value) >= 1 or value == 0:
        return f"{value:.2f}"
    return f"{value:.4g}"


def render_summary(lines: Sequence[Row]) -> str:
    """The lines as one aligned table: figure, value, unit, target, status, row."""
    header = ("figure", "value", "unit", "target", "status", "row")
    cells = [
        (
            str(s["label"]),
            format_value(s["value"]),
            str(s["unit"]),
            str(s["target"]),
            str(s["status"]),
            str(s["row"]),
        )
        for s in lines
    ]
    widths = [max([len(h)] + [len(c[i]) for c in cells]) for i, h in enumerate(header)]

    def line(c: Sequence[str]) -> str:
        left = f"{c[0]:<{widths[0]}}  {c[1]:>{widths[1]}}  {c[2]:<{widths[2]}}"
        return f"{left}  {c[3]:<{widths[3]}}  {c[4]:<{widths[4]}}  {c[5]}".rstrip()

    rule = "  ".join("-" * w for w in widths)
    return "\n".join([line(header), rule, *(line(c) for c in cells)])
