"""streamrank's streaming side: Kafka in, Redis features, micro-batches, scores, Kafka out.

Modules in the order one event flows through them: :mod:`pipeline.runner` (the loop) drives
:mod:`~pipeline.kafka_io` (source) -> :mod:`~pipeline.codec` (decode/validate, with
:mod:`~pipeline.dead_letter` for rejects) -> :mod:`~pipeline.batch` -> :mod:`~pipeline.enrich`
-> :mod:`~pipeline.features` -> :mod:`~pipeline.score` -> :mod:`~pipeline.sink`, with
:mod:`~pipeline.checkpointing` owning offset commits.
"""
