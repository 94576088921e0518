"""How many records the worker's next fetch may take: a batch bounded in time, not only
in records.

A take-over of newly assigned slots waits for the batch in hand (it takes the batch
lock), and so does a SIGTERM. A batch of ``batch_max_events`` records takes well under a
second on a worker that keeps up, but a minute on one that a loaded machine slows to a
few hundred events/s: the slots assigned to it wait that long (when the revocation
callback still waited for the batch too, one member held the whole group in
``PreparingRebalance`` for 30 s in a 5,000 events/s soak on two cores). ``BatchPace``
keeps a moving estimate of the seconds a record costs (step, ledger insert and
transaction together) and lets the next fetch take as many records as fit in
``target_s``, between ``least`` and ``most``. Under load the batches shrink to what the
machine can do in ``target_s``; when the worker is fast they grow back to ``most``, where
the per-batch costs (one insert, one transaction per slot) are spread thinnest.

Until a batch was measured the pace takes ``least``: a process's first batch is its
slowest (a cold process after a restart, a slot just restored, the ledger's first
inserts), and at ``most`` it held a just-restored slot without progress for about 20 s in a
10-minute soak at 5,000 events/s. The estimate grows from there within a few batches.

A batch of fewer than ``least`` records leaves the estimate as it is: its time is mostly
what every batch pays (the inserts, the transactions), not its records'. Divided by a
few records, that made a record look tens of times dearer than it is, so after a quiet
spell of small batches the next burst was cut into batches of ``least`` until the
estimate came back, some eight batches later at the default weight. A batch that took at
least half of the records it was allowed counts all the same: at the start the limit is
``least`` itself, and a live stream's fetch hands over the records in hand, often a few
short of it. The benchmark's first batches at 5,000 events/s were 497, 498 and 497
records, and they left the pace at 500 records a batch while the backlog grew.
"""

from __future__ import annotations

__all__ = ["BatchPace"]


class BatchPace:
    """``limit()`` for the next fetch; ``took(records, seconds)`` after each batch."""

    def __init__(self, most: int, target_s: float, *, least: int = 500, weight: float = 0.3):
        if most < 1:
            raise ValueError(f"most must be at least 1, not {most}")
        if target_s <= 0:
            raise ValueError(f"target_s must be positive, not {target_s}")
        if not 0 < weight <= 1:
            raise ValueError(f"weight must be in (0, 1], not {weight}")
        self.most, self.target_s = most, target_s
        self.least = min(least, most)
        self.weight = weight
        self.per_record_s: float | None = None  # the moving estimate; None: none measured

    def limit(self) -> int:
        """The records the next fetch may take."""
        if self.per_record_s is None:
            return self.least  # nothing measured yet: start small
        if self.per_record_s <= 0:
            return self.most
        fit = int(self.target_s / self.per_record_s)
        return max(self.least, min(self.most, fit))

    def took(self, records: int, seconds: float) -> None:
        """A batch of ``records`` took ``seconds`` from fetch to commit (fewer than
        ``least`` and fewer than half the limit it was fetched under: it says little of a
        record's cost, and changes nothing)."""
        if records < 1 or seconds < 0 or (records < self.least and 2 * records < self.limit()):
            return
        sample = seconds / records
        if self.per_record_s is None:
            self.per_record_s = sample
        else:
            self.per_record_s += self.weight * (sample - self.per_record_s)
