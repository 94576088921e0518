"""``tail --operation``: an operation's transitions in seq order, each once, ending on a final
state; an open item (``delivery_unknown``) is not an end."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import orjson
import pytest

from prism.pipeline.cli import main
from prism.pipeline.replay import OperationSequencer, format_operation
from prism.schemas import ChannelOperation, parse_channel_operation

T0 = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


def op(seq: int, state: str, eid: str | None = None, **extra: Any) -> ChannelOperation:
    return parse_channel_operation(
        orjson.dumps(
            {
                "schema": "prism.channel-operation/v1",
                "eventId": eid or f"e{seq}-{state}",
                "operationId": extra.pop("operationId", "op-1"),
                "seq": seq,
                "ts": (T0 + timedelta(seconds=seq)).isoformat(),
                "connectionId": "telegram:main",
                "kind": "message",
                "state": state,
                **extra,
            }
        )
    )


def test_records_come_out_in_seq_order_once_and_end_on_a_final_state() -> None:
    seq = OperationSequencer("op-1")
    assert seq.push(op(1, "executing")) == []  # waits for seq 0
    assert seq.push(op(0, "admitted", operationId="op-2")) == []  # another operation
    released = seq.push(op(0, "admitted")) + seq.push(op(0, "admitted"))  # a re-delivery
    assert [(r.seq, r.state) for r in released] == [(0, "admitted"), (1, "executing")]
    assert not seq.complete
    assert [r.state for r in seq.push(op(2, "delivery_unknown", reason="send threw"))] == [
        "delivery_unknown"
    ]
    assert not seq.complete  # an open item waits for a reconcile
    assert seq.result().describe().startswith("operation op-1: not finished, last state delivery")
    assert [r.state for r in seq.push(op(3, "reconciled", reason="resent"))] == ["reconciled"]
    assert seq.complete and seq.push(op(4, "delivered")) == []
    result = seq.result()
    assert (result.printed, result.duplicates, result.state) == (4, 1, "reconciled")
    assert result.describe() == "operation op-1: reconciled, 4 transitions"


def test_an_unfinished_tail_names_the_missing_seqs() -> None:
    seq = OperationSequencer("op-1")
    seq.push(op(0, "admitted"))
    seq.push(op(3, "delivered"))
    result = seq.result()
    assert not result.complete and result.missing == [(1, 2)]
    assert "missing seqs: 1-2" in result.describe()


def test_pretty_and_jsonl_formats() -> None:
    rec = op(2, "notice_delivered", reason="run failed", runId="run-9")
    assert format_operation(rec, "pretty") == (
        "  2 2026-11-30T12:00:02+00:00 notice_delivered (run failed) telegram:main run=run-9"
    )
    assert orjson.loads(format_operation(rec, "jsonl"))["state"] == "notice_delivered"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["tail", "--operation", "op-1", "--tenant", "acme"], "--tenant do not apply"),
        (["tail", "--operation", "op-1", "--from-ledger"], "--from-ledger do not apply"),
    ],
)
def test_cli_refuses_options_that_do_not_fit_an_operation(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    assert message in capsys.readouterr().err
