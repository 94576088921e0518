"""The faust-streaming worker shell around the core (``prism-pipeline worker``)."""

from ._app import AlertSink, PipelineWorker, core_config
from ._faust import make_app

__all__ = ["AlertSink", "PipelineWorker", "core_config", "make_app"]
