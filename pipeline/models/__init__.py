"""Model versions as the pipeline serves them.

``loader`` loads one version for serving (its scorer and its retrieval index, together),
``watch`` follows a versions directory and loads a promoted version off the scoring path,
``catalogue`` says which item ids exist and builds a version's retrieval index. When the loop
swaps a loaded version in is :mod:`pipeline.runtime.model_swap`'s decision.
"""
