"""The stages of the scoring loop, one job each, in the order the data flows.

=============  =====================================================================
module         job
=============  =====================================================================
``source``     consume from the input topic; the assignment; input activity
``decode``     message bytes -> validated UserEvent record, or a rejection (DLQ reason)
``batch``      records -> micro-batches bounded by rows and delay; numpy columns
``enrich``     one Redis round trip per batch for user and item features
``features``   event columns + enrichment -> the ranker's feature columns
``score``      feature columns -> KJT, one forward, top-K per event (forward executor)
``publish``    Recommendations to the output topic, rejects to the dead-letter topic
``commit``     offsets committed only after everything they caused is delivered
``rebalance``  what the member does when the group moves partitions
=============  =====================================================================

:mod:`pipeline.runtime.loop` wires them; none of them builds Kafka clients.
"""
