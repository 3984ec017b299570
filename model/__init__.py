"""streamrank's model package: the feature contract, the DLRM ranker and its tooling.

Modules (import them directly; this package module imports nothing so that light users such
as the event producer do not pay for torch/torchrec unless they need them):

- :mod:`model.spec`: feature spec, table sizes, id hashing.
- :mod:`model.features`: numpy feature columns -> dense tensor + KeyedJaggedTensor.
- :mod:`model.ranker`: the DLRM ranker and its builder.
- :mod:`model.topk`: per-event top-K over a flat batch of scores.
- :mod:`model.checkpoint`: checkpoint directories (``meta.json`` + ``model.pt``).
- :mod:`model.synthetic`: the deterministic synthetic world (features, events, clicks).
- :mod:`model.metrics`: AUC and log loss.
- :mod:`model.train`: training the ranker on the synthetic world.
- :mod:`model.sharding`: sharding the tables across ranks with ``DistributedModelParallel``.
- :mod:`model.distributed_checkpoint`: sharded checkpoints (``torch.distributed.checkpoint``).
- :mod:`model.quantize`: quantized embedding tables for single-process inference.
- :mod:`model.compile`: optional ``torch.compile`` of the ranker.
"""
