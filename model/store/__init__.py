"""Storage of models on disk.

``checkpoint`` (a checkpoint directory: ``meta.json`` + ``model.pt``), ``versions`` and
``version_info`` (a versions directory: checkpoints plus a pointer to the current one),
``durable_files`` (atomic replace, fsync, a lock file), ``tables`` (embedding tables as numpy
arrays, read from a checkpoint).
"""
