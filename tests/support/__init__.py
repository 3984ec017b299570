"""Tests-only helpers shared by the test folders: wrappers of the real serving code from the
outside (no hooks inside it), foreign checkpoints, malformed input."""
