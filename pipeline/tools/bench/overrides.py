"""One setting changed from the command line (``bench pipeline --variant section.key=value``),
validated like a config file's; imports nothing heavy, so a bad value is one line at once."""

from __future__ import annotations

from pydantic import BaseModel, ValidationError

from pipeline.settings.loading import Settings

__all__ = ["with_override"]


def with_override(settings: Settings, assignment: str) -> Settings:
    """``settings`` with one ``section.key=value`` changed (validated like a config file's).

    Args:
        settings: the settings.
        assignment: e.g. ``retrieval.enabled=false``.

    Returns:
        The new settings.

    Raises:
        ValueError: not ``section.key=value``, an unknown section or key, or a bad value.

    Example::

        without_retrieval = with_override(settings, "retrieval.enabled=false")
    """
    dotted, equals, value = assignment.partition("=")
    name, dot, key = dotted.strip().partition(".")
    section = getattr(settings, name, None) if dot and equals else None
    if not isinstance(section, BaseModel) or key not in type(section).model_fields:
        raise ValueError(f"{assignment!r} is not section.key=value of a setting")
    try:
        changed = type(section).model_validate({**section.model_dump(), key: value.strip()})
    except ValidationError as exc:
        first = exc.errors()[0]["msg"]
        raise ValueError(f"{assignment!r}: {first}") from exc
    return settings.model_copy(update={name: changed})
