"""Benchmarks behind ``streamrank bench``: one module per benchmark, shared helpers in
:mod:`pipeline.tools.bench.common`.

- :mod:`~pipeline.tools.bench.model`: bare forward rows/s;
- :mod:`~pipeline.tools.bench.pipeline`: bare forward vs the whole pipeline on the stack;
- :mod:`~pipeline.tools.bench.serving`: quantized tables and ``torch.compile`` vs fp32 eager;
- :mod:`~pipeline.tools.bench.ranks`: 1 vs N ranks end to end.
"""
