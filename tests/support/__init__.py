"""Tests-only helpers that wrap the real serving code from the outside (no hooks inside it)."""
