"""Ingest workers: K processes per rank consume, decode, enrich and build the model input; the
rank's process only scores (``batching.ingest_workers = K``).

The host work around the model (Kafka, decode, Redis, features, the model input, top-K, encode,
produce, commit) costs tens of microseconds of CPU per event; a GPU scores far more events per
second than one Python process can prepare. With ``ingest_workers = K`` each rank:

=======================  ==================================================================
module                   job
=======================  ==================================================================
``transport``            shared-memory slots and the pipe between a worker and its rank
``remote_scorer``        the worker's :class:`~model.serving.Scorer`: builds the model input
                         into a slot, the rank runs the forward
``workers``              spawn, watch and stop the workers; merge their summaries
``worker``               a worker's process around its loop (lifetime, logging, metrics)
``server``               the rank's loop: take a ready request, forward, answer
``stepping``             a worker stops on idleness only when every worker of the rank is idle
``relay``                the workers' metrics on the rank's one Prometheus endpoint
``rank``                 a rank with workers, start to end
=======================  ==================================================================

Each worker is a complete member of the consumer group (its own consumer, producer and
:class:`~pipeline.stages.commit.Checkpointer`), so the commit protocol holds per worker
unchanged: an offset is committed only after every output and dead letter before it is
delivered; with exactly-once each worker has its own ``transactional.id``.
"""

from pipeline.ingest.rank import serve_with_workers
from pipeline.ingest.worker import worker_process
from pipeline.ingest.workers import IngestWorkerFailed, IngestWorkers, WorkerAssignment

__all__ = [
    "IngestWorkerFailed",
    "IngestWorkers",
    "WorkerAssignment",
    "serve_with_workers",
    "worker_process",
]
