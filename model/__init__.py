"""streamrank's model package: the feature contract, the DLRM ranker and its tooling.

Import the modules directly; this package module imports nothing, so that light users such as
the event producer do not pay for torch/torchrec unless they need them. Nothing here imports
``pipeline`` (docs/architecture.md).

- :mod:`model.features`: the feature spec (tables, id hashing), a batch's numpy columns, the
  dense tensor + KeyedJaggedTensor built from them, the recent-items rule, segment arithmetic.
- :mod:`model.ranker`: the DLRM ranker and its builder; :mod:`model.rank`: the rank context of
  a process (the one reader of ``RANK``/``LOCAL_RANK``/``WORLD_SIZE``); :mod:`model.options`:
  the serving options shared with configuration (precision, compile mode, quantized tables).
- :mod:`model.serving`: building the served model once (``ScorerFactory``: device, load, shard
  or quantize, precision, compile, warm-up) and scoring batches (``Scorer``: model input,
  forward, top-K); device binding, pinned host -> GPU copies, CUDA-graph shapes, memory.
- :mod:`model.distributed`: sharding the tables across ranks with ``DistributedModelParallel``
  (config, planner, report, process group, runtime, sharded checkpoints); the only modules
  that import ``torchrec.distributed``.
- :mod:`model.store`: checkpoint directories, versions directories with their atomically
  switched pointer, durable files, embedding tables read from a checkpoint as numpy.
- :mod:`model.retrieval`: the Faiss inner-product index over item vectors and retrieved
  candidates for events that bring none.
- :mod:`model.synthetic`: the deterministic synthetic world (features, events, clicks), training
  on it and offline AUC.
"""
