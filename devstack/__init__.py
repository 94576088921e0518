"""Development and test tooling: the local Kafka broker, worker subprocesses, the demo, faults.

Nothing here runs in production. ``prism-pipeline devstack kafka up|down|status`` (a
``LocalKafkaCluster`` with ``--brokers 3``) and
``make demo`` / ``make test`` use it; the fault-injection suite drives workers through
``workerproc`` and ``faults``.

Example::

    from prism.devstack import LocalKafka, free_port
    broker = LocalKafka(state_dir=Path(".data/kafka"), port=free_port())
    broker.up()
"""

from ._cluster import LocalKafkaCluster
from ._kafka import (
    KAFKA_VERSION,
    PORT_VARIABLE,
    DevstackError,
    LocalKafka,
    free_port,
    kafka_home,
)

__all__ = [
    "KAFKA_VERSION",
    "PORT_VARIABLE",
    "DevstackError",
    "LocalKafka",
    "LocalKafkaCluster",
    "free_port",
    "kafka_home",
]
