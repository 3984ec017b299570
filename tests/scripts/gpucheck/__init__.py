"""Tests for the modules of scripts/gpucheck."""
