"""Kafka, at the edge: ``consumer`` turns each poll into a :class:`~pipeline.types.PolledBatch`
(values, keys, partitions, offsets, timestamps, headers as columns) and speaks
``(topic, partition)`` for rebalances, seeks and commits; ``producer`` sends a batch's records
and acknowledges each to its :class:`~pipeline.types.Checkpoint`, and makes exactly-once's
transactional calls; ``errors`` is :class:`~pipeline.connectors.kafka.errors.KafkaClientError`,
librdkafka's errors as ours. ``clients`` creates the clients from ``[kafka]`` (``connect``: a
loop's clients, the real broker by default, fakes of the raw clients in unit tests), one
record's produce for the tools, and topic set-up; ``admin`` the admin client and the logger
every librdkafka client logs through; ``limits`` the input side's size limits. Nothing past
this folder sees a ``confluent_kafka`` type.
"""
