"""Observability: what the pipeline reports about itself.

``metrics`` defines every Prometheus metric (docs/metrics.md), ``batch_histogram`` a histogram
observed a batch at a time, ``summary`` the run summary (counts, throughput, latency
quantiles) printed as one line of strict JSON. Imports only the types of :mod:`pipeline.types`.
"""
