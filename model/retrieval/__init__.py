"""Candidate retrieval for events that bring no candidates.

``index`` (a Faiss inner-product index over the served model's item vectors: exact or IVFPQ),
``config`` (how it is built and queried; no Faiss or torch import), ``candidates`` (a batch's
events without candidates get retrieved ones, vectorised).
"""
