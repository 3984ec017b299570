"""Lazy re-exports for a package (PEP 562): a name is imported from its submodule on first use.

``model.distributed`` and ``model.serving`` re-export their submodules' public names without
importing them: configuration code imports ``model.distributed.config`` or
``model.serving.options`` without torch or ``torchrec.distributed``.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any


def lazy_exports(
    package: str, exports: Mapping[str, tuple[str, ...]]
) -> tuple[list[str], Callable[[str], Any], Callable[[], list[str]]]:
    """The ``__all__``, ``__getattr__`` and ``__dir__`` of a package that re-exports lazily.

    Args:
        package: the package's ``__name__``.
        exports: for each submodule (relative name), the names it exports.

    Returns:
        ``(__all__, __getattr__, __dir__)``: the sorted names; a module ``__getattr__`` that
        imports the submodule defining a name and caches the value in the package; the
        package's names with the exports.

    Example::

        __all__, __getattr__, __dir__ = lazy_exports(__name__, {"options": ("ServingOptions",)})
    """
    where = {name: module for module, names in exports.items() for name in names}

    def get(name: str) -> Any:
        module = where.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{module}"), name)
        setattr(sys.modules[package], name, value)
        return value

    def names() -> list[str]:
        return sorted(set(vars(sys.modules[package])) | set(where))

    return sorted(where), get, names
