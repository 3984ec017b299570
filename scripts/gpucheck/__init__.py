"""The sections of scripts/gpu_check.py, one module each, and the report that keeps them.

- :mod:`.report`: :class:`~.report.CheckReport`, the JSON file rewritten after every section;
- :mod:`.common`: the small spec, synthetic batches, score differences;
- :mod:`.model_sections`: ``parity`` and ``forward``;
- :mod:`.worker_transfer`: ``worker_transfer`` (only torch and ``model.*`` imported);
- :mod:`.scoring_stage`: ``scoring_stage`` (needs the pipeline's dependencies);
- :mod:`.nccl`: ``nccl_2_ranks``, two ranks in child processes, polled.
"""
