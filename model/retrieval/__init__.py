"""Candidate retrieval for events that bring no candidates.

``index`` (a Faiss inner-product index over item vectors: exact or IVFPQ; the built-in model's
queries), ``config`` (how it is built and queried; no Faiss or torch import), ``sources``
(where a configured model's query and item vectors come from; plain data), ``candidates`` (a
batch's events without candidates get retrieved ones, vectorised).
"""
