"""The base of every settings section: unknown keys are errors; frozen once loaded; a copy with
changes is validated as the section was read (what it builds when read is built again).

A section whose keys are the fields of a frozen dataclass of :mod:`model` (which must not import
:mod:`pipeline`) takes them from it (:func:`keys_of`): the dataclass is the one declaration of
the keys, their types, defaults and checks, and the section builds it once, when it is read
(:attr:`ConfigSection.config`).
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Mapping
from typing import Any, ClassVar, Generic, Self, TypeVar

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, create_model, model_validator

__all__ = ["ConfigSection", "Section", "keys_of"]

ConfigT = TypeVar("ConfigT")


class Section(BaseModel):
    """A settings section: unknown keys are errors, not silently ignored; frozen once loaded."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False) -> Self:
        """A copy of the section; with ``update``, validated as the section was read: its checks
        run on the new values, and what it builds once when read (:attr:`ConfigSection.config`,
        ``KafkaSettings.config``...) is built for them, never left as the original's.

        Args:
            update: new values of some keys (pydantic's own copy would skip every check).
            deep: copy the values too.

        Returns:
            The copy.

        Raises:
            pydantic.ValidationError: ``update`` holds a bad value or an unknown key.

        Example::

            kafka = settings.kafka.model_copy(update={"group_id": "bench"})
            kafka.config.consumer["group.id"]  # "bench"
        """
        if not update:
            return super().model_copy(deep=deep)
        values = {name: getattr(self, name) for name in type(self).model_fields}
        copied = type(self).model_validate({**values, **update})
        return copied.model_copy(deep=True) if deep else copied


class ConfigSection(Section, Generic[ConfigT]):
    """A section whose keys are a dataclass's fields (made by :func:`keys_of`): once valid, it
    builds the dataclass (whose own checks raise ``ValueError``: one line naming the key)."""

    config_type: ClassVar[type[Any]]
    """The dataclass."""
    config_keys: ClassVar[tuple[str, ...]]
    """Its fields that are keys of the section."""
    _config: Any = PrivateAttr()

    @model_validator(mode="after")
    def _build_config(self) -> Self:
        self._config = self.config_type(**{key: getattr(self, key) for key in self.config_keys})
        return self

    @property
    def config(self) -> ConfigT:
        """The dataclass these keys describe, made once when the section was read."""
        return typing.cast(ConfigT, self._config)


def keys_of(config: type[Any], omit: tuple[str, ...] = ()) -> type[ConfigSection[Any]]:
    """A :class:`ConfigSection` whose keys are the fields of the frozen dataclass ``config``:
    the same names, types and defaults.

    Args:
        config: a dataclass of :mod:`model` (e.g. :class:`model.retrieval.config.RetrievalConfig`).
        omit: fields that are not settings (they keep the dataclass's default).

    Returns:
        The section class, to be subclassed by the settings section (which may add keys).

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
    section = create_model(f"{config.__name__}Keys", __base__=ConfigSection, **keys)
    section.config_type = config
    section.config_keys = tuple(keys)
    return section
