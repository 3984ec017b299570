"""``[events]``: the event schema and the field that plays each role.

Absent (no ``schema_file``): the built-in ``schemas/user_event.avsc``, decoded by the compiled
kernels. With ``schema_file``, any Avro record schema is decoded (:mod:`pipeline.stages.decode`'s
configured decoder); the roles name its fields, dotted for a field inside a nested record.

Example::

    [events]
    schema_file = "examples/deepfm/page_view.avsc"
    event_id = "view_id"
    user_id = "viewer.id"
    candidates = "offer_ids"
    event_time = "viewed_at"
    num_results = ""            # not in the schema: every event asks for num_results_default
    num_results_default = 5
"""

from __future__ import annotations

from pathlib import Path

from pydantic import model_validator

from pipeline.settings.section import Section

__all__ = ["EventSettings"]


class EventSettings(Section):
    """The event schema (``schema_file``) and its roles (the built-in schema's names by
    default)."""

    schema_file: Path | None = None
    """An ``.avsc`` file with one record schema; unset: the built-in UserEvent."""
    event_id: str = "event_id"
    """A string (or long) field: echoed in the Recommendation."""
    user_id: str = "user_id"
    """A long field: the user whose Redis features are read."""
    candidates: str = "candidate_item_ids"
    """An array of longs: the items to rank."""
    event_time: str = "event_time"
    """A long (epoch milliseconds, e.g. ``timestamp-millis``): latency is measured from it."""
    num_results: str = "num_results"
    """An int or long field: how many items to return; empty: ``num_results_default``."""
    num_results_default: int = 10
    """Items returned per event when ``num_results`` is empty."""

    @model_validator(mode="after")
    def _valid(self) -> EventSettings:
        if self.num_results_default < 1:
            raise ValueError("events.num_results_default must be >= 1")
        for role in ("event_id", "user_id", "candidates", "event_time"):
            if not getattr(self, role):
                raise ValueError(f"events.{role} must name a field of the schema")
        return self

    @property
    def configured(self) -> bool:
        """Whether a schema of the user's is named (else the built-in UserEvent)."""
        return self.schema_file is not None
