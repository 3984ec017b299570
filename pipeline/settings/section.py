"""The base of every settings section: unknown keys are errors; frozen once loaded."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Section(BaseModel):
    """A settings section: unknown keys are errors, not silently ignored; frozen once loaded."""

    model_config = ConfigDict(extra="forbid", frozen=True)
