"""streamrank's model package: the feature contract, the DLRM ranker and its tooling.

Modules (import them directly; this package module imports nothing so that light users such
as the event producer do not pay for torch/torchrec unless they need them):

- :mod:`model.features.spec`: feature spec, table sizes, id hashing.
- :mod:`model.features.segments`: index arithmetic over per-segment counts (offsets, positions,
  ...).
- :mod:`model.features.columns`: a micro-batch's features as numpy columns (no torch).
- :mod:`model.features.build`: those columns -> dense tensor + KeyedJaggedTensor.
- :mod:`model.features.recent_items`: the recent-items rule shared by serving and training data.
- :mod:`model.ranker`: the DLRM ranker and its builder.
- :mod:`model.serving.inference`: the one scoring forward (``score_probabilities``).
- :mod:`model.serving.device`: which device a process or rank runs on; binding threads to it.
- :mod:`model.serving.transfer`: pinned, asynchronous host -> GPU copies of a batch's input.
- :mod:`model.serving.memory`: bytes of embedding tables held (plain, quantized, sharded).
- :mod:`model.serving.topk`: per-event top-K over a flat batch of scores.
- :mod:`model.store.checkpoint`: checkpoint directories (``meta.json`` + ``model.pt``).
- :mod:`model.synthetic`: the deterministic synthetic world (features, events, clicks).
- :mod:`model.synthetic.evaluation`: AUC and log loss.
- :mod:`model.synthetic.train`: training the ranker on the synthetic world.
- :mod:`model.distributed`: sharding the tables across ranks with ``DistributedModelParallel``
  (config, planner, report, process group, runtime, sharded checkpoints); the only modules
  that import ``torchrec.distributed``.
- :mod:`model.options` / :mod:`model.serving.quantize`: quantized tables for single-process
  serving.
- :mod:`model.serving.compile`: optional ``torch.compile`` of the ranker.
- :mod:`model.serving.graph_shapes`: static batch shapes for the CUDA-graph compile modes.
- :mod:`model.store.versions` (with :mod:`model.store.version_info`,
  :mod:`model.store.durable_files`): versions
  directories, a pointer to the served version, switched atomically.
- :mod:`model.store.tables`: embedding tables read from a checkpoint (either format) as numpy.
- :mod:`model.retrieval.index` (config in :mod:`model.retrieval.config`): the Faiss inner-product
  index over item vectors; :mod:`model.retrieval.candidates`: retrieved candidates into a batch.
"""
