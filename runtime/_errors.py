"""Errors of the runtime publisher; every one derives from ``PublisherError``.

Hierarchy::

    PublisherError (Exception)
    ├── EventTooLarge (+ ValueError)   an event's wire form exceeds ``max_event_bytes``
    ├── InvalidEvent (+ ValueError)    an event violates the contract (``.reason``)
    ├── PublisherClosed                ``publish()`` after ``close()``
    ├── DeliveryFailed                 the broker did not take events (``raise_errors=True`` only)
    └── SpoolError                     the on-disk spool cannot be used (a bad setting, a
                                       directory held by another process)

``EventTooLarge``, ``InvalidEvent`` and ``PublisherClosed`` are programming errors in the
runtime and always raise from ``publish()``/``emit()``. Delivery failures are counted and
logged; they raise only when the publisher was built with ``raise_errors=True`` (tests).
"""

from __future__ import annotations

__all__ = [
    "DeliveryFailed",
    "EventTooLarge",
    "InvalidEvent",
    "PublisherClosed",
    "PublisherError",
    "SpoolError",
]


class PublisherError(Exception):
    """Base class of every error the runtime publisher raises."""


class EventTooLarge(PublisherError, ValueError):
    """An event's serialised size exceeds the publisher's ``max_event_bytes``."""

    def __init__(
        self, *, event_id: object, run_id: object, type_: object, size: int, limit: int
    ) -> None:
        self.event_id = event_id
        self.run_id = run_id
        self.type = type_
        self.size = size
        self.limit = limit
        super().__init__(
            f"event {event_id!r} (run {run_id!r}, type {type_!r}) is {size} bytes as JSON, "
            f"over the {limit}-byte limit; it was not published. Keep large content out of "
            "events (they carry counters and ids, never prompts or tool results)."
        )


class InvalidEvent(PublisherError, ValueError):
    """An event does not follow the wire contract; ``reason`` names the field and value."""

    def __init__(
        self, reason: str, *, event_id: object = None, run_id: object = None, type_: object = None
    ) -> None:
        self.reason = reason
        self.event_id = event_id
        self.run_id = run_id
        self.type = type_
        super().__init__(
            f"event {event_id!r} (run {run_id!r}, type {type_!r}) violates the contract: "
            f"{reason}; it was not published. Fix the event at its source."
        )


class PublisherClosed(PublisherError):
    """``publish()`` was called after ``close()``."""


class DeliveryFailed(PublisherError):
    """Events could not be delivered to the broker (raised only with ``raise_errors=True``)."""

    def __init__(self, count: int, first_error: BaseException, detail: str) -> None:
        self.count = count
        self.first_error = first_error
        super().__init__(
            f"{count} event(s) could not be delivered; first failure: {detail}: "
            f"{type(first_error).__name__}: {first_error}. Check that the broker is reachable "
            "and the topic accepts records of this size."
        )


class SpoolError(PublisherError):
    """The spool cannot be used: a bad setting, or its directory is held by another process."""
