"""``python -m pipeline.cli ...``: the ``streamrank`` command (torchrun re-executes this)."""

from pipeline.cli import app

app(prog_name="streamrank")
