"""streamrank's serving pipeline: Kafka UserEvents in, scored Recommendations out.

:mod:`pipeline.runtime.loop` wires the stages of :mod:`pipeline.stages`, in the order one event
flows through them: source -> decode -> batch -> enrich -> features -> score -> publish -> commit
(see :mod:`pipeline.stages`). Kafka clients live behind the Protocols of
:mod:`pipeline.connectors.kafka.clients`; ranks of a sharded model are launched by
:mod:`pipeline.jobs.launch`, and each process is built by :mod:`pipeline.serve`. What lives in
which folder, and which folder may import which: docs/architecture.md.
"""
