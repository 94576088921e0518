"""The faust-streaming worker shell around the core (``prism-pipeline worker``)."""

from ._app import AlertSink, PipelineWorker
from ._faust import make_app
from ._records import core_config

__all__ = ["AlertSink", "PipelineWorker", "core_config", "make_app"]
