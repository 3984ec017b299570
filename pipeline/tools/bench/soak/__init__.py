"""``streamrank bench soak``: hours of paced load, watched (RELIABILITY.md's soak).

=============  ==================================================================
module         job
=============  ==================================================================
``plan``       :class:`~.plan.SoakPlan` (the pass marks), :class:`~.plan.SoakRun` (what
               was observed) and :func:`~.plan.evaluate` (the verdict)
``run``        :func:`~.run.bench_soak`: the capacity run, the paced producer, the pipeline,
               the samples, the audit of the topics
``sampler``    samples every ``sample_s``: RSS, consumer lag, p99, CPU per process
``probe``      what a sample reads: RSS from /proc, the group's lag, a metrics scrape, the
               event ids on a topic
``trend``      RSS growth fitted after warm-up and projected over 24 h
``trace``      the pipeline run under a tracer (``--trace``): GC pauses, allocator, RSS
``plot``       ``soak.png``
=============  ==================================================================
"""
