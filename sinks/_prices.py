"""The price book: unit prices for reported usage that arrives without a cost.

A price file (YAML or CSV) lists one price per provider, model, token kind and currency,
valid from a time on. ``read_price_file`` checks every row and names the file, line,
field and value of each mistake; ``load_prices`` writes the rows that are new or changed
(loading the same file again writes nothing); ``price_book`` lists the current book.
Billing applies the price valid at each usage row's event time (sinks/BILLING.md).

YAML (a list, or a mapping with a ``prices`` list)::

    prices:
      - {provider: anthropic, model: claude-sonnet-4, token_kind: input,
         unit_price: "3.00", currency: USD, valid_from: 2026-11-01}

CSV: a header line naming the same fields, then one price per line.
"""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any

from clickhouse_connect.driver.client import Client

from prism.sinks._client import validate_identifier
from prism.sinks._errors import LedgerQueryError, PriceBookError

__all__ = [
    "DEFAULT_PER_TOKENS",
    "PRICE_FIELDS",
    "PRICE_TABLES",
    "TOKEN_KINDS",
    "LoadSummary",
    "PriceRow",
    "load_prices",
    "price_book",
    "read_price_file",
]

PRICE_TABLES = ("prices_store", "prices")  # the storage table and its view (0005_prices.sql)
TOKEN_KINDS = ("input", "output", "cache_read", "cache_write")
DEFAULT_PER_TOKENS = 1_000_000
REQUIRED = ("provider", "model", "token_kind", "unit_price", "currency", "valid_from")
PRICE_FIELDS = (*REQUIRED, "per_tokens")
_MAX_LISTED = 20
_NAME_RE = re.compile(r"^[^\s\x00-\x1f](?:[^\x00-\x1f]{0,126}[^\s\x00-\x1f])?$")
_CURRENCY_RE = re.compile(r"^[A-Z]{3}$")
_MAX_PRICE = Decimal(10) ** 15
_COLUMNS = (
    "provider", "model", "token_kind", "currency", "valid_from", "unit_price", "per_tokens",
    "source", "loaded_at", "version",
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class PriceRow:
    """One price: ``unit_price`` in ``currency`` per ``per_tokens`` tokens of ``token_kind``."""

    provider: str
    model: str
    token_kind: str
    currency: str
    valid_from: datetime
    unit_price: Decimal
    per_tokens: int = DEFAULT_PER_TOKENS
    line: int = field(default=0, compare=False)

    @property
    def key(self) -> tuple[str, str, str, str, datetime]:
        return (self.provider, self.model, self.token_kind, self.currency, self.valid_from)


@dataclass(frozen=True, slots=True)
class LoadSummary:
    """What ``load_prices`` wrote: rows new to the book, rows whose price changed, the rest."""

    new: int
    changed: int
    unchanged: int


def read_price_file(path: str | Path) -> list[PriceRow]:
    """Every price of a YAML or CSV price file, checked (``PriceBookError`` lists mistakes).

    Example::

        rows = read_price_file("prices.yaml")
        load_prices(client, "prism", rows, source="prices.yaml")
    """
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise PriceBookError(f"cannot read the price file {str(p)!r}: {exc}") from None
    suffix = p.suffix.lower()
    if suffix in (".yaml", ".yml"):
        records = list(_yaml_records(text, p))
    elif suffix == ".csv":
        records = list(_csv_records(text, p))
    else:
        raise PriceBookError(
            f"price file {str(p)!r} has the suffix {suffix!r}; use a .yaml, .yml or .csv file"
        )
    errors: list[str] = []
    rows: list[PriceRow] = []
    for line, values in records:
        row = _check(values, line, lambda msg, line=line: errors.append(f"{p}:{line}: {msg}"))
        if row is not None:
            rows.append(row)
    seen: dict[tuple[Any, ...], PriceRow] = {}
    for row in rows:
        first = seen.setdefault(row.key, row)
        if first is not row:
            errors.append(
                f"{p}:{row.line}: {row.provider}/{row.model} {row.token_kind} in {row.currency} "
                f"from {row.valid_from.isoformat()} is already priced on line {first.line}; "
                "keep one of the two lines"
            )
    if errors:
        more = f"\n  ... and {len(errors) - _MAX_LISTED} more" if len(errors) > _MAX_LISTED else ""
        raise PriceBookError(
            f"{len(errors)} mistake(s) in the price file {str(p)!r}, nothing loaded:\n  "
            + "\n  ".join(errors[:_MAX_LISTED])
            + more
        )
    if not rows:
        raise PriceBookError(f"the price file {str(p)!r} holds no price")
    return rows


def load_prices(
    client: Client, database: str, rows: Iterable[PriceRow], *, source: str
) -> LoadSummary:
    """Write the new or changed rows (a higher version wins); the same rows again write nothing."""
    validate_identifier(database)
    current = {row.key: row for row in price_book(client, database)}
    new = changed = unchanged = 0
    pending: list[PriceRow] = []
    for row in rows:
        was = current.get(row.key)
        if was is None:
            new += 1
        elif (was.unit_price, was.per_tokens) != (row.unit_price, row.per_tokens):
            changed += 1
        else:
            unchanged += 1
            continue
        pending.append(row)
    if pending:
        version = _max_version(client, database) + 1
        now = datetime.now(UTC)
        data = [
            [r.provider, r.model, r.token_kind, r.currency, r.valid_from, r.unit_price,
             r.per_tokens, source, now, version]
            for r in pending
        ]  # fmt: skip
        try:
            client.insert(f"{database}.prices_store", data, column_names=list(_COLUMNS))
        except Exception as exc:
            raise LedgerQueryError(
                f"could not write {len(data)} price(s) to {database}.prices_store: {exc}; "
                "run `prism-pipeline migrate` if the table is missing"
            ) from exc
    return LoadSummary(new, changed, unchanged)


def price_book(client: Client, database: str) -> list[PriceRow]:
    """The current price book, ordered by provider, model, token kind, currency, valid_from."""
    validate_identifier(database)
    try:
        result = client.query(
            f"SELECT provider, model, token_kind, currency, valid_from, unit_price, per_tokens "
            f"FROM {database}.prices ORDER BY provider, model, token_kind, currency, valid_from"
        )
    except Exception as exc:
        raise LedgerQueryError(
            f"could not read the price book of {database!r}: {exc}; run `prism-pipeline "
            "migrate` if the prices table is missing"
        ) from exc
    return [
        PriceRow(p, m, k, c, _utc(v), Decimal(u), int(n))
        for p, m, k, c, v, u, n in result.result_rows
    ]


def _max_version(client: Client, database: str) -> int:
    rows = client.query(f"SELECT max(version) FROM {database}.prices_store").result_rows
    return int(rows[0][0] or 0) if rows else 0


def _utc(value: datetime) -> datetime:
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def _yaml_records(text: str, path: Path) -> Iterator[tuple[int, dict[str, str]]]:
    """(line, field -> scalar text) per list item; values stay text so prices stay exact."""
    import yaml

    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as exc:
        raise PriceBookError(f"{path}: not valid YAML: {exc}") from None
    if isinstance(root, yaml.MappingNode):
        items = {k.value: v for k, v in root.value if isinstance(k, yaml.ScalarNode)}
        if set(items) != {"prices"}:
            raise PriceBookError(
                f"{path}:{root.start_mark.line + 1}: a mapping must hold only `prices:` "
                f"(found {sorted(items)!r})"
            )
        root = items["prices"]
    if not isinstance(root, yaml.SequenceNode):
        raise PriceBookError(f"{path}: expected a list of prices (or `prices:` and a list)")
    for item in root.value:
        line = item.start_mark.line + 1
        if not isinstance(item, yaml.MappingNode):
            raise PriceBookError(f"{path}:{line}: a price is a mapping of {', '.join(REQUIRED)}")
        values: dict[str, str] = {}
        for key, value in item.value:
            if not isinstance(value, yaml.ScalarNode):
                raise PriceBookError(
                    f"{path}:{value.start_mark.line + 1}: {key.value} is not a value"
                )
            values[str(key.value)] = str(value.value)
        yield line, values


def _csv_records(text: str, path: Path) -> Iterator[tuple[int, dict[str, str]]]:
    reader = csv.DictReader(io.StringIO(text))
    header = [h.strip() for h in reader.fieldnames or []]
    missing = [f for f in REQUIRED if f not in header]
    if missing:
        raise PriceBookError(
            f"{path}:1: the CSV header {','.join(header)!r} lacks {', '.join(missing)}; "
            f"the columns are {','.join(PRICE_FIELDS)} (per_tokens optional)"
        )
    reader.fieldnames = header
    for record in reader:
        if not any((v or "").strip() for k, v in record.items() if k is not None):
            continue
        extra = record.pop(None, None)  # type: ignore[call-overload]
        values = {k: (v or "").strip() for k, v in record.items()}
        if extra:
            values["(extra columns)"] = ",".join(extra)
        yield reader.line_num, values


def _check(values: dict[str, str], line: int, error: Any) -> PriceRow | None:
    """One record as a ``PriceRow``, or ``None`` after reporting each mistake to ``error``."""
    ok = True

    def bad(name: str, why: str) -> None:
        nonlocal ok
        ok = False
        error(f"{name} {values.get(name)!r} {why}")

    for name in sorted(set(values) - set(PRICE_FIELDS)):
        ok = False
        error(f"unknown field {name!r} (fields: {', '.join(PRICE_FIELDS)})")
    for name in REQUIRED:
        if not values.get(name, "").strip():
            ok = False
            error(f"{name} is missing")
    text = {k: v.strip() for k, v in values.items()}
    for name in ("provider", "model"):
        if text.get(name) and not _NAME_RE.match(values[name]):
            bad(name, "is not a name (1..128 characters, no control characters or edge spaces)")
    kind = text.get("token_kind")
    if kind and kind not in TOKEN_KINDS:
        bad("token_kind", f"is not one of {', '.join(TOKEN_KINDS)}")
    currency = text.get("currency")
    if currency and not _CURRENCY_RE.match(currency):
        bad("currency", "is not an ISO 4217 code (three capital letters, e.g. USD)")
    price = _decimal(text.get("unit_price"))
    if text.get("unit_price") and price is None:
        bad("unit_price", "is not a decimal number >= 0, below 10^15, with at most 12 decimals")
    per = text.get("per_tokens") or str(DEFAULT_PER_TOKENS)
    if not per.isdigit() or not 1 <= int(per) <= 10**9:
        bad("per_tokens", "is not a whole number of tokens from 1 to 1000000000")
    valid_from = _when(text.get("valid_from"))
    if text.get("valid_from") and valid_from is None:
        bad("valid_from", "is not a date (2026-11-01) or a time with a UTC offset (…T00:00:00Z)")
    if not ok or price is None or valid_from is None:
        return None
    return PriceRow(
        provider=values["provider"],
        model=values["model"],
        token_kind=str(kind),
        currency=str(currency),
        valid_from=valid_from,
        unit_price=price,
        per_tokens=int(per),
        line=line,
    )


def _decimal(text: str | None) -> Decimal | None:
    if not text:
        return None
    try:
        value = Decimal(text)
    except InvalidOperation:
        return None
    exponent = value.as_tuple().exponent
    if not value.is_finite() or value < 0 or value >= _MAX_PRICE:
        return None
    if isinstance(exponent, int) and exponent < -12:
        return None
    return value


def _when(text: str | None) -> datetime | None:
    if not text:
        return None
    try:
        if len(text) == 10:
            return datetime.combine(date.fromisoformat(text), datetime.min.time(), tzinfo=UTC)
        value = datetime.fromisoformat(text.replace("Z", "+00:00").replace(" ", "T", 1))
    except ValueError:
        return None
    if value.utcoffset() is None:
        return None
    value = value.astimezone(UTC)
    return value.replace(microsecond=(value.microsecond // 1000) * 1000)
