"""Errors of the replay consumers.

Hierarchy::

    ReplayError (RuntimeError)
    +-- TopicNotFound        the input topic does not exist on the broker
    +-- RunNotFound          the ledger holds no event of the run (``--from-ledger``)
    +-- RebuildRefused       the target database already holds runs (no ``--force``)
"""

from __future__ import annotations

__all__ = ["RebuildRefused", "ReplayError", "RunNotFound", "TopicNotFound"]


class ReplayError(RuntimeError):
    """Base of every error raised by ``pipeline.replay``."""


class TopicNotFound(ReplayError):
    """The topic to read does not exist (wrong prefix or bootstrap servers)."""


class RunNotFound(ReplayError):
    """No event of the run is recorded where it was looked up."""


class RebuildRefused(ReplayError):
    """The rebuild target is not a fresh ledger database."""
