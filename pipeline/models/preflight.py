"""Start-up checks of a configured model (``[model.module]``), before anything else starts.

Run by ``streamrank run`` (in the launcher, before any rank) and ``streamrank model import``:
every mistake of the user's is one line naming the key (the CLI exits with code 2), never a
traceback from the first batch. In order:

1. the factory imports and builds (on the ``meta`` device: nothing allocated), its module
   holds only what the contract serves (:mod:`model.module.checks`);
2. the feature map resolves: the schema parses, every role and feature field exists with a type
   its use can take, every KJT key is one of the module's features and back, every Redis field
   is declared (:func:`pipeline.models.mapping.resolve_feature_map`);
3. a trial forward on one-row tables takes the configured dense width and returns an output the
   output config can read;
4. the served version (when there is one) was imported for this architecture;
5. with ``retrieval.enabled``, the vectors that query and those that are indexed resolve
   (:func:`pipeline.models.retrieval.resolve_retrieval`): tables or Redis vector fields that
   exist, looked up by the right id, of one width;
6. the output contract resolves (``[output]``: :func:`pipeline.models.output.resolve_output`),
   its task scores naming columns of ``model.module.output_names``.

The checks' result, a :class:`ConfiguredModel` (the module config, the feature map, the
retrieval plan and the output contract), is handed on to the serving path
(:class:`pipeline.models.loader.ModelLoader`), which resolves it itself only where no check ran
in its process (the ranks of ``--nproc N``, ingest workers).

Example::

    configured = check_configured_model(settings, served_checkpoint)
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from model.features.mapping import FeatureMap
from model.module.checks import collections, managed_collisions, module_tables, trial_forward
from model.module.factory import build_module
from model.module.store import CheckedVersion, check_version, is_module_version
from model.module.types import ModelConfigError, ModuleConfig
from model.retrieval.sources import RetrievalPlan
from pipeline.models.mapping import resolve_feature_map
from pipeline.models.output import OutputContract, published_columns, resolve_output
from pipeline.models.retrieval import resolve_retrieval
from pipeline.settings.loading import Settings

__all__ = [
    "ConfiguredModel",
    "check_configured_model",
    "configured_module",
    "resolve_configured_model",
]


@dataclass(frozen=True)
class ConfiguredModel:
    """A configured model (``[model.module]``) resolved from the settings, once per process.

    Attributes:
        module: the module config (:func:`configured_module`).
        fmap: its feature map.
        retrieval: its retrieval plan (:func:`pipeline.models.retrieval.resolve_retrieval`);
            ``None`` with ``retrieval.enabled = false``.
        output: its output contract (:func:`pipeline.models.output.resolve_output`).
        checked: the version to serve, its architecture checked by the start-up checks
            (:func:`model.module.store.check_version`); ``None``: not checked in this process
            (the loader checks each version it loads).
    """

    module: ModuleConfig
    fmap: FeatureMap
    retrieval: RetrievalPlan | None
    output: OutputContract
    checked: CheckedVersion | None = None


def configured_module(settings: Settings) -> tuple[ModuleConfig, FeatureMap]:
    """The module config (with the map's ids per key, and the task columns ``[output]``
    publishes) and the feature map of ``settings``.

    Raises:
        ModelConfigError / FeatureMapError / OutputContractError: one line naming the key.
    """
    if settings.model.module is None:
        raise ModelConfigError("no [model.module]: the built-in model is served")
    config = settings.model.module.config
    fmap = resolve_feature_map(settings, config)
    layout = fmap.layout
    per_key = dict(zip(layout.keys, layout.ids_per_key, strict=True))
    tables = tuple(
        dataclasses.replace(
            t, ids_per_row=max((per_key.get(f, 1) for f in t.feature_names), default=1)
        )
        for t in config.tables
    )
    output = dataclasses.replace(config.output, task_columns=published_columns(settings))
    return dataclasses.replace(config, tables=tables, output=output), fmap


def resolve_configured_model(settings: Settings) -> ConfiguredModel:
    """The module config, feature map, retrieval plan and output contract of ``settings``,
    without the other checks of :func:`check_configured_model` (where they ran in another process).

    Raises:
        ModelConfigError / FeatureMapError / OutputContractError / RetrievalConfigError: one
            line naming the key.

    Example::

        configured = resolve_configured_model(settings)
    """
    config, fmap = configured_module(settings)
    plan = None
    if settings.retrieval.enabled:
        probe = build_module(config, "meta", embedding_device="meta")
        tables, managed = module_tables(probe), managed_collisions(probe)
        plan = resolve_retrieval(settings, fmap, tables, managed)
    return ConfiguredModel(config, fmap, plan, resolve_output(settings, fmap))


def check_configured_model(settings: Settings, checkpoint: Path | None = None) -> ConfiguredModel:
    """Every start-up check of a configured model (module docstring).

    Args:
        settings: the configuration (``[model.module]`` set).
        checkpoint: the version to serve (``None``: no version yet, e.g. before an import).

    Returns:
        The module config, the feature map, the retrieval plan and the output contract, for
        the serving path.

    Raises:
        ModelConfigError / FeatureMapError / OutputContractError: the first mistake, one line
            naming the key.
    """
    module = settings.model.module
    assert module is not None
    probe = build_module(module.config, "meta", embedding_device="meta")
    tables = module_tables(probe)
    served = {f for t in tables for f in t.feature_names}
    collections(probe)  # refuses the embedding modules the contract does not serve
    managed = managed_collisions(probe)
    if managed and settings.batching.ingest_workers:
        raise ModelConfigError(
            f"batching.ingest_workers = {settings.batching.ingest_workers}: {managed[0]} is a "
            "managed-collision collection, served by the one-process path only (its remapping "
            "behind ingest workers is not verified); set batching.ingest_workers = 0"
        )
    config, fmap = configured_module(settings)
    for key in fmap.layout.keys:
        if key not in served:
            raise ModelConfigError(
                f"features.sparse.{key}: no embedding collection of the module looks it up "
                f"(the module's features: {sorted(served)})"
            )
    trial_forward(config, fmap.layout)
    plan = resolve_retrieval(settings, fmap, tables, managed)
    checked = None
    if checkpoint is not None:
        if not is_module_version(checkpoint):
            raise ModelConfigError(
                f"{checkpoint} is not a version of a configured module: import the weights "
                "with `streamrank model import STATE_DICT_FILE`"
            )
        checked = check_version(config, checkpoint)
    return ConfiguredModel(config, fmap, plan, resolve_output(settings, fmap), checked)
