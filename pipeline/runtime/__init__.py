"""The serving loop and what it decides: when to score, how a batch is processed, how work ends.

=================  =================================================================

The path of one event through them: docs/architecture.md.
"""
