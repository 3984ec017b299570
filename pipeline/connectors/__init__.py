"""Connectors: the adapters to the systems outside, one folder each.

``kafka`` (the consumer and producer at the edge: polls as columns, records and commit
positions in; topic set-up), ``redis`` (the feature store's keys, batched reads, the enrichers'
connection, the writer) and ``avro`` (the UserEvent rules, compiled codec kernels, the
fastavro reference, the Confluent framing and registry). The stages reach the outside world
only through these; the connectors do not import each other.
"""
