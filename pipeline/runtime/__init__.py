"""The runtime: what decides *when*, wiring the stages into one loop per consumer-group member.

``loop`` (consume -> decode -> batch -> process -> commit), ``processor`` (one closed batch:
enrich -> features -> forward -> top-K -> publish), ``stepping`` (whether to score this
iteration, agreed across ranks), ``batch_policy`` (when an open batch is ready), ``isolation``
(bisecting a batch that fails on a poison event), ``rebalance`` (assigned, revoked, lost
partitions), ``retrieve`` (candidates for events that bring none), ``backpressure`` (a full
producer queue), ``model_swap`` (switching model versions between two steps). The path of one
event through them: docs/architecture.md.
"""
