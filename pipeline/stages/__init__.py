"""The stages of the scoring loop, one job each, in the order the data flows.

===============  =====================================================================
module           job
===============  =====================================================================
``source``       consume from the input topic; the assignment; input activity
``decode``       message bytes -> validated UserEvent record, or a rejection (DLQ reason)
``batch``        records -> micro-batches bounded by rows and delay; numpy columns
``enrich``       one Redis round trip per batch for user and item features
``features``     event columns + enrichment -> the ranker's feature columns
``score``        feature columns -> KJT, one forward, top-K per event (forward executor)
``publish``      one Recommendation per event to the output topic; seals the checkpoint
``dead_letter``  rejected messages, untouched, to the dead-letter topic with their reason
``commit``       offsets committed only after everything they caused is delivered
===============  =====================================================================

:mod:`pipeline.runtime.loop` wires them (a rebalance is :mod:`pipeline.runtime.rebalance`'s);
none of them builds Kafka clients. A stage imports the types of :mod:`pipeline.types`, the
settings, observability and the connectors, never another stage (docs/architecture.md).
"""
