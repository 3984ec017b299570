"""What one serving job serves: the module's config, its input layout and its version.

The built-in ranker and a configured module (``[model.module]``) are described the same way,
so the single-process and the sharded strategies build either through the model contract
(:func:`model.module.factory.build_module`) and load its weights strictly:

- the built-in ranker: its config comes from the checkpoint's own spec
  (:func:`model.ranker.builtin_module_config`), its layout from the spec;
- a configured module: its config and layout come from the configuration; the version's
  ``meta.json`` must record the same architecture (:func:`model.module.store.check_version`,
  once per process: checked here unless the options carry the loader's check).

Example::

    served = describe_served(options)
    module = build_module(served.config, device)
    load_weights(module, served, options.checkpoint)
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from torch import nn

from model.features.layout import InputLayout
from model.features.spec import FeatureSpec
from model.module.store import check_version, load_module_weights
from model.module.types import ModuleConfig
from model.module.weights import check_state_dict
from model.ranker import builtin_module_config
from model.serving.options import ServingOptions
from model.store.checkpoint import load_meta, load_state_dict

__all__ = ["ServedModule", "describe_served", "load_weights"]


@dataclass(frozen=True)
class ServedModule:
    """The module a job serves.

    Attributes:
        config: how to build it (the built-in ranker's, or ``[model.module]``).
        layout: the input it takes.
        model_version: the checkpoint's version (what Recommendations carry).
        spec: the built-in ranker's feature spec; ``None`` for a configured module.
    """

    config: ModuleConfig
    layout: InputLayout
    model_version: str
    spec: FeatureSpec | None = None


def describe_served(options: ServingOptions) -> ServedModule:
    """What ``options.checkpoint`` holds, for the configured module or the built-in ranker.

    Raises:
        FileNotFoundError: no checkpoint there.
        ValueError: corrupt metadata; ``ModelConfigError``: a version imported for another
            module.
    """
    path = Path(options.checkpoint)
    if options.module is None:
        meta = load_meta(path)
        spec = meta.spec
        return ServedModule(
            builtin_module_config(spec), spec.input_layout(), meta.model_version, spec
        )
    assert options.layout is not None  # ServingOptions checks it
    checked = options.checked  # checked by its loader, else here
    if checked is None or checked.path != path:
        checked = check_version(options.module, path)
    return ServedModule(options.module, options.layout, checked.meta.model_version)


def load_weights(module: nn.Module, served: ServedModule, path: Path) -> None:
    """Load the weights of the checkpoint at ``path`` into ``module`` (strict; digest verified).

    Args:
        module: the built module (possibly ``DistributedModelParallel``-wrapped).
        served: what it is.
        path: the checkpoint directory (``model.pt``).

    Raises:
        ValueError: corrupt weights, or weights that do not fit (``ModelConfigError`` for a
            configured module, naming keys or shapes).
    """
    if served.spec is None:
        load_module_weights(module, path)
        return
    state = load_state_dict(path, map_location="cpu", verify=True, mmap=True)
    check_state_dict(getattr(module, "module", module), state, f"checkpoint {path}")
    module.load_state_dict(state, strict=True)
