"""The Kafka worker shell around the core (``prism-pipeline worker``).

Example::

    from prism.pipeline.settings import load_settings
    from prism.pipeline.worker import run_worker
    run_worker(load_settings())      # until SIGTERM
"""

from ._app import AlertSink, PipelineWorker
from ._run import WorkerHooks, build_worker, run_worker

__all__ = [
    "AlertSink",
    "PipelineWorker",
    "WorkerHooks",
    "build_worker",
    "run_worker",
]
