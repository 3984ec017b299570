"""streamrank's model package: the feature contract, the DLRM ranker and its tooling.

Modules (import them directly; this package module imports nothing so that light users such
as the event producer do not pay for torch/torchrec unless they need them):

- :mod:`model.spec`: feature spec, table sizes, id hashing.
- :mod:`model.segments`: index arithmetic over per-segment counts (offsets, positions, ...).
- :mod:`model.feature_columns`: a micro-batch's features as numpy columns (no torch).
- :mod:`model.features`: those columns -> dense tensor + KeyedJaggedTensor.
- :mod:`model.recent_items`: the recent-items rule shared by serving and training data.
- :mod:`model.ranker`: the DLRM ranker and its builder.
- :mod:`model.inference`: the one scoring forward (``score_probabilities``).
- :mod:`model.device`: which device a process or rank runs on; binding threads to it.
- :mod:`model.transfer`: pinned, asynchronous host -> GPU copies of a batch's input.
- :mod:`model.memory`: bytes of embedding tables held (plain, quantized, sharded).
- :mod:`model.topk`: per-event top-K over a flat batch of scores.
- :mod:`model.checkpoint`: checkpoint directories (``meta.json`` + ``model.pt``).
- :mod:`model.synthetic`: the deterministic synthetic world (features, events, clicks).
- :mod:`model.metrics`: AUC and log loss.
- :mod:`model.train`: training the ranker on the synthetic world.
- :mod:`model.distributed`: sharding the tables across ranks with ``DistributedModelParallel``
  (config, planner, report, process group, runtime, sharded checkpoints); the only modules
  that import ``torchrec.distributed``.
- :mod:`model.quant_dtype` / :mod:`model.quantize`: quantized tables for single-process serving.
- :mod:`model.compile`: optional ``torch.compile`` of the ranker.
- :mod:`model.graph_shapes`: static batch shapes for the CUDA-graph compile modes.
- :mod:`model.versions` (with :mod:`model.version_info`, :mod:`model.durable_files`): versions
  directories, a pointer to the served version, switched atomically.
- :mod:`model.tables`: embedding tables read from a checkpoint (either format) as numpy.
- :mod:`model.retrieval` (config in :mod:`model.retrieval_config`): the Faiss inner-product
  index over item vectors; :mod:`model.candidates`: retrieved candidates into a batch.
"""
