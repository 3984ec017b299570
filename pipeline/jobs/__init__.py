"""Jobs: the processes around the loop.

``launch`` starts the ranks of ``streamrank run --nproc N`` under torchrun (and degrades to
fewer ranks with ``--min-nproc``), ``lifetime`` makes every process of a job die with the one
that started it, ``summaries`` writes each rank's summary and merges them into the job's.
"""
