"""Billable and estimated usage of the manifest: per tenant, tenant/model/currency, agent/month.

Billable: accepted, reported ``provider_turn`` usage rows (tokens, rows, cost per
currency as exact decimals). Estimated: accepted estimates no accepted reported row of the
same ``(turn, attempt)`` supersedes, by confidence; estimates are never priced. Per agent
and month: the run's agent (its lowest-seq accepted event naming one) and the UTC month of
each usage row's ``ts``, reported rows per currency.
"""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from ._truth import ts_ms

__all__ = ["UsageTotals"]

_ESTIMATE_FIGURES = ("rows", "input_tokens", "output_tokens", "total_tokens")
_WIRE = {
    "input_tokens": "inputTokens",
    "output_tokens": "outputTokens",
    "total_tokens": "totalTokens",
}


class UsageTotals:
    """Billable (reported provider_turn rows) and estimated (unsuperseded estimates) totals."""

    def __init__(self) -> None:
        self._groups: dict[tuple[str, str, str, str | None], dict[str, Any]] = {}
        self._agent_month: dict[tuple[str, str, str | None], dict[str, Any]] = {}
        self._confidence: dict[str, dict[str, int]] = {
            conf: dict.fromkeys(_ESTIMATE_FIGURES, 0) for conf in ("medium", "low")
        }

    def _group(
        self, ev: dict[str, Any], tenant: str | None, currency: str | None
    ) -> dict[str, Any]:
        model = ev.get("model") or {}
        key = (
            tenant or "",
            model.get("provider") or "",
            model.get("model") or "",
            currency,
        )
        group = self._groups.get(key)
        if group is None:
            group = self._groups[key] = _empty_figures()
        return group

    def add_run(
        self, tenant: str | None, accepted: list[dict[str, Any]], agent: str | None = None
    ) -> None:
        """Add one run's accepted events, billed to the run's owner ``tenant`` and ``agent``."""
        reported: set[tuple[int, int]] = set()
        estimates: list[tuple[tuple[int, int], dict[str, Any]]] = []
        for ev in accepted:
            data = ev["data"]
            if ev["type"] != "usage_recorded" or data["scope"] != "provider_turn":
                continue
            row = data["usage"]
            key = (int(data["turn"]), int(data["attempt"]))
            if row.get("estimated") is True:
                estimates.append((key, ev))
                continue
            reported.add(key)
            self._add_agent_month(agent, ev, row)
            bill = self._group(ev, tenant, row.get("currency"))["billable"]
            bill["input_tokens"] += int(row.get("inputTokens", 0))
            bill["output_tokens"] += int(row.get("outputTokens", 0))
            bill["total_tokens"] += int(row.get("totalTokens", 0))
            bill["cache_read_tokens"] += int(row.get("cacheReadTokens", 0))
            bill["cache_write_tokens"] += int(row.get("cacheWriteTokens", 0))
            bill["rows"] += 1
            if row.get("cost") is not None and row.get("currency"):
                cost = bill["cost"]
                cost[row["currency"]] = cost.get(row["currency"], Decimal(0)) + Decimal(
                    str(row["cost"])
                )
        for key, ev in estimates:
            if key in reported:
                continue
            row = ev["data"]["usage"]
            est = self._group(ev, tenant, None)["estimated"]
            est["input_tokens"] += int(row.get("inputTokens", 0))
            est["output_tokens"] += int(row.get("outputTokens", 0))
            est["total_tokens"] += int(row.get("totalTokens", 0))
            est["rows"] += 1
            conf = row.get("confidence") or "low"
            est["by_confidence"][conf] = est["by_confidence"].get(conf, 0) + int(
                row.get("totalTokens", 0)
            )
            summary = self._confidence.setdefault(conf, dict.fromkeys(_ESTIMATE_FIGURES, 0))
            summary["rows"] += 1
            for name in _ESTIMATE_FIGURES[1:]:
                summary[name] += int(row.get(_WIRE[name], 0))

    def _add_agent_month(self, agent: str | None, ev: dict[str, Any], row: dict[str, Any]) -> None:
        month = datetime.fromtimestamp(ts_ms(ev) / 1000, UTC).strftime("%Y-%m")
        key = (agent or "", month, row.get("currency"))
        fig = self._agent_month.setdefault(
            key, {"rows": 0, "input_tokens": 0, "output_tokens": 0, "total_tokens": 0, "cost": None}
        )
        fig["rows"] += 1
        for name, wire in _WIRE.items():
            fig[name] += int(row.get(wire, 0))
        if row.get("cost") is not None and row.get("currency"):
            fig["cost"] = (fig["cost"] or Decimal(0)) + Decimal(str(row["cost"]))

    def by_agent_month(self) -> list[dict[str, Any]]:
        """Reported provider_turn usage per agent, UTC month and currency (cost as text)."""
        return [
            {
                "agent_id": agent,
                "month": month,
                "currency": currency,
                **{k: v for k, v in fig.items() if k != "cost"},
                "cost": None if fig["cost"] is None else format(fig["cost"], "f"),
            }
            for (agent, month, currency), fig in sorted(
                self._agent_month.items(), key=lambda kv: (*kv[0][:2], kv[0][2] or "")
            )
        ]

    def by_confidence(self) -> dict[str, dict[str, int]]:
        """Unsuperseded estimates over the whole fleet, per confidence: rows and tokens."""
        return {conf: dict(figures) for conf, figures in sorted(self._confidence.items())}

    def by_model(self) -> list[dict[str, Any]]:
        out = []
        for (tenant, provider, model, currency), figures in sorted(
            self._groups.items(), key=lambda kv: (*kv[0][:3], kv[0][3] or "")
        ):
            out.append(
                {
                    "tenant_id": tenant,
                    "provider": provider,
                    "model": model,
                    "currency": currency,
                    **_render(figures),
                }
            )
        return out

    def tenants(self, run_rows: dict[str, Any]) -> dict[str, Any]:
        merged: dict[str, dict[str, Any]] = {
            str(r["tenant_id"]): _empty_figures() for r in run_rows.values() if r["tenant_id"]
        }
        for (tenant, _, _, _), figures in self._groups.items():
            target = merged.setdefault(tenant, _empty_figures())
            for block in ("billable", "estimated"):
                for name, value in figures[block].items():
                    if isinstance(value, dict):
                        for k, v in value.items():
                            target[block][name][k] = target[block][name].get(k, 0) + v
                    else:
                        target[block][name] += value
        return {tenant: _render(merged[tenant]) for tenant in sorted(merged)}


def _empty_figures() -> dict[str, Any]:
    return {
        "billable": {
            "input_tokens": 0,
            "output_tokens": 0,
            "total_tokens": 0,
            "cache_read_tokens": 0,
            "cache_write_tokens": 0,
            "rows": 0,
            "cost": {},
        },
        "estimated": {
            "input_tokens": 0,
            "output_tokens": 0,
            "total_tokens": 0,
            "rows": 0,
            "by_confidence": {"medium": 0, "low": 0},
        },
    }


def _render(figures: dict[str, Any]) -> dict[str, Any]:
    billable = dict(figures["billable"])
    billable["cost"] = {
        cur: format(amount, "f") for cur, amount in sorted(billable["cost"].items())
    }
    estimated = dict(figures["estimated"])
    estimated["by_confidence"] = dict(estimated["by_confidence"])
    return {"billable": billable, "estimated": estimated}
