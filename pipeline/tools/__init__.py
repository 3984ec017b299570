"""Tools around the serving pipeline: benchmarks, the synthetic world on the stack, a reader
of the output topic, and run reports drawn from Prometheus.

Nothing in the serving path (``pipeline.*`` outside ``pipeline.tools`` and ``pipeline.cli``)
imports this package; the CLI and the tests do.
"""
