"""Tools around the pipeline (benchmarks, synthetic traffic, readers, reports)."""
