"""The faust-streaming worker shell around the core (``prism-pipeline worker``)."""

from ._app import AlertSink, PipelineWorker
from ._faust import make_app
from ._records import core_config
from ._run import WorkerHooks, build_worker, run_worker

__all__ = [
    "AlertSink",
    "PipelineWorker",
    "WorkerHooks",
    "build_worker",
    "core_config",
    "make_app",
    "run_worker",
]
