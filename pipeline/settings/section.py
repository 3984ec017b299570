"""The base of every settings section: unknown keys are errors; frozen once loaded.

A section whose keys are the fields of a frozen dataclass of :mod:`model` (which must not import
:mod:`pipeline`) takes them from it (:func:`keys_of`): the dataclass is the one declaration of
the keys, their types, defaults and checks, and the section builds it once it is valid.
"""

from __future__ import annotations

import dataclasses
import typing
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, create_model

__all__ = ["Section", "keys_of"]


class Section(BaseModel):
    """A settings section: unknown keys are errors, not silently ignored; frozen once loaded."""

    model_config = ConfigDict(extra="forbid", frozen=True)


def keys_of(config: type[Any], omit: tuple[str, ...] = ()) -> type[Section]:
    """A :class:`Section` whose keys are the fields of the frozen dataclass ``config``: the
    same names, types and defaults (the dataclass's own checks run when the section builds
    it).

    Args:
        config: a dataclass of :mod:`model` (e.g. :class:`model.retrieval.config.RetrievalConfig`).
        omit: fields that are not settings (they keep the dataclass's default).

    Returns:
        The section class, to be subclassed by the settings section (which adds its own keys).

    Example::

        class RetrievalSettings(keys_of(RetrievalConfig, omit=("seed",))): ...
    """
    hints = typing.get_type_hints(config)
    keys: dict[str, Any] = {}
    for field in dataclasses.fields(config):
        if field.name in omit:
            continue
        if field.default_factory is not dataclasses.MISSING:
            keys[field.name] = (hints[field.name], Field(default_factory=field.default_factory))
        elif field.default is not dataclasses.MISSING:
            keys[field.name] = (hints[field.name], field.default)
        else:
            keys[field.name] = (hints[field.name], ...)
    return create_model(f"{config.__name__}Keys", __base__=Section, **keys)
