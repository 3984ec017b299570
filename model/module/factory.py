"""Building the served module: import its factory, build its collections, call the factory.

The factory is ``"package.module:function"`` (a class works too), imported from the installed
packages or from :attr:`~model.module.types.ModuleConfig.code_dir` (put first on the import
path): never from a model version directory, which holds weights and JSON only. streamrank
builds the collections from the configured tables (on the ``meta`` device when the job is
sharded: ``DistributedModelParallel`` allocates each rank's shards) and passes them by keyword:

- the pooled tables' ``EmbeddingBagCollection`` under
  :attr:`~model.module.types.ModuleConfig.collection_argument` (``is_weighted`` with
  :attr:`~model.module.types.ModuleConfig.weighted`; a
  ``ManagedCollisionEmbeddingBagCollection`` with
  :attr:`~model.module.types.ModuleConfig.managed_collision`);
- the sequence tables' ``EmbeddingCollection`` under
  :attr:`~model.module.types.ModuleConfig.sequence_collection_argument`.

The other keyword arguments are the TOML's. TorchRec's models then need no user code:
``torchrec.models.dlrm.DLRM``, ``DLRM_DCN`` and ``torchrec.models.deepfm.SimpleDeepFMNN``.
Their constraints (one embedding dim for every table; DLRM's last dense layer equal to it) are
checked here, in one line, before TorchRec's own assertions would fire.

Example::

    module = build_module(config, device="cpu")                          # one process
    module = build_module(config, device="cuda:0", embedding_device="meta")  # sharded
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, cast

import torch
from torch import nn
from torchrec.modules.embedding_configs import EmbeddingBagConfig, EmbeddingConfig, PoolingType
from torchrec.modules.embedding_modules import EmbeddingBagCollection, EmbeddingCollection

from model.module.types import ManagedCollision, ModelConfigError, ModuleConfig, TableConfig

__all__ = [
    "build_collection",
    "build_collections",
    "build_module",
    "build_sequence_collection",
    "embedding_bag_configs",
    "embedding_configs",
    "load_factory",
]

_POOLING = {"sum": PoolingType.SUM, "mean": PoolingType.MEAN}
#: Factories with TorchRec's constraints on the collection (checked before they assert).
_ONE_DIM_FACTORIES = (
    "torchrec.models.dlrm:DLRM",
    "torchrec.models.dlrm:DLRM_DCN",
    "torchrec.models.dlrm:DLRM_Projection",
    "torchrec.models.deepfm:SimpleDeepFMNN",
)
_DLRM_FACTORIES = _ONE_DIM_FACTORIES[:3]


def embedding_bag_configs(tables: Sequence[TableConfig]) -> list[EmbeddingBagConfig]:
    """TorchRec configs of the pooled ``tables``, in order.

    Args:
        tables: the configured tables (sequence tables are left out).

    Returns:
        One pooled ``EmbeddingBagConfig`` per pooled table.

    Example::

        ebc = EmbeddingBagCollection(tables=embedding_bag_configs(config.tables), device="meta")
    """
    return [
        EmbeddingBagConfig(
            name=t.name,
            embedding_dim=t.embedding_dim,
            num_embeddings=t.num_embeddings,
            feature_names=list(t.feature_names),
            pooling=_POOLING[t.pooling],
        )
        for t in tables
        if not t.sequence
    ]


def embedding_configs(tables: Sequence[TableConfig]) -> list[EmbeddingConfig]:
    """TorchRec configs of the sequence ``tables``, in order (pooled tables are left out).

    Example::

        ec = EmbeddingCollection(tables=embedding_configs(config.tables), device="meta")
    """
    return [
        EmbeddingConfig(
            name=t.name,
            embedding_dim=t.embedding_dim,
            num_embeddings=t.num_embeddings,
            feature_names=list(t.feature_names),
        )
        for t in tables
        if t.sequence
    ]


def build_collection(
    tables: Sequence[TableConfig], device: torch.device | str, weighted: bool = False
) -> EmbeddingBagCollection:
    """The ``EmbeddingBagCollection`` of the pooled ``tables`` on ``device`` (``meta``:
    unallocated), ``is_weighted`` when ``weighted``."""
    return EmbeddingBagCollection(
        tables=embedding_bag_configs(tables), is_weighted=weighted, device=torch.device(device)
    )


def build_sequence_collection(
    tables: Sequence[TableConfig], device: torch.device | str
) -> EmbeddingCollection:
    """The ``EmbeddingCollection`` of the sequence ``tables`` on ``device`` (a
    ``torch.device``: TorchRec's sharder compares it with ``torch.device("meta")``)."""
    return EmbeddingCollection(tables=embedding_configs(tables), device=torch.device(device))


def _managed(ebc: EmbeddingBagCollection, mc: ManagedCollision, device: torch.device) -> nn.Module:
    """``ebc`` behind one MCH remapper per table (:class:`ManagedCollision`)."""
    from torchrec.modules.mc_embedding_modules import ManagedCollisionEmbeddingBagCollection
    from torchrec.modules.mc_modules import (
        DistanceLFU_EvictionPolicy,
        LFU_EvictionPolicy,
        LRU_EvictionPolicy,
        ManagedCollisionCollection,
        MCHEvictionPolicy,
        MCHManagedCollisionModule,
    )

    policies: dict[str, type[MCHEvictionPolicy]] = {
        "lfu": LFU_EvictionPolicy,
        "lru": LRU_EvictionPolicy,
        "distance_lfu": DistanceLFU_EvictionPolicy,
    }
    configs = ebc.embedding_bag_configs()
    remappers = {
        cfg.name: MCHManagedCollisionModule(
            zch_size=cfg.num_embeddings,
            device=device,
            eviction_policy=policies[mc.eviction_policy](),
            eviction_interval=mc.eviction_interval,
            input_hash_size=mc.input_hash_size,
        )
        for cfg in configs
    }
    collection = ManagedCollisionCollection(remappers, configs)
    return ManagedCollisionEmbeddingBagCollection(ebc, collection)


def build_collections(config: ModuleConfig, device: torch.device | str) -> dict[str, nn.Module]:
    """The collections of ``config``'s tables, by the keyword each is passed under.

    Args:
        config: the module config.
        device: where the tables are allocated (``meta``: not at all).

    Returns:
        ``{collection_argument: EmbeddingBagCollection}`` when there are pooled tables (a
        ``ManagedCollisionEmbeddingBagCollection`` with managed collisions), and
        ``{sequence_collection_argument: EmbeddingCollection}`` when there are sequence tables.

    Example::

        kwargs = {**config.kwargs, **build_collections(config, "meta")}
    """
    dev = torch.device(device)
    out: dict[str, nn.Module] = {}
    if config.pooled_tables:
        ebc = build_collection(config.tables, dev, config.weighted)
        mc = config.managed_collision
        out[config.collection_argument] = ebc if mc is None else _managed(ebc, mc, dev)
    if config.sequence_tables:
        out[config.sequence_collection_argument] = build_sequence_collection(config.tables, dev)
    return out


@contextmanager
def _import_root(code_dir: str) -> Any:
    """``code_dir`` first on ``sys.path`` while importing (nothing when empty)."""
    if not code_dir:
        yield
        return
    root = str(Path(code_dir).resolve())
    if not Path(root).is_dir():
        raise ModelConfigError(f"model.module.code_dir {code_dir!r} is not a directory")
    added = root not in sys.path
    if added:
        sys.path.insert(0, root)
    try:
        yield
    finally:
        if added and root in sys.path:
            sys.path.remove(root)


def load_factory(config: ModuleConfig) -> Callable[..., nn.Module]:
    """The factory ``config.factory`` names.

    Args:
        config: the module config.

    Returns:
        The callable.

    Raises:
        ModelConfigError: it cannot be imported, or names no callable (one line).

    Example::

        factory = load_factory(config)  # torchrec.models.deepfm.SimpleDeepFMNN
    """
    module_name, _, attribute = config.factory.partition(":")
    try:
        with _import_root(config.code_dir):
            module = importlib.import_module(module_name)
    except ModelConfigError:
        raise
    except Exception as exc:  # ImportError, and whatever the user's module raises on import
        where = f" (code_dir {config.code_dir})" if config.code_dir else ""
        raise ModelConfigError(
            f"model.module.factory {config.factory!r}: cannot import {module_name}{where}: "
            f"{type(exc).__name__}: {exc}"
        ) from exc
    target: Any = module
    for part in attribute.split("."):
        target = getattr(target, part, None)
        if target is None:
            raise ModelConfigError(
                f"model.module.factory {config.factory!r}: {module_name} has no {attribute}"
            )
    if not callable(target):
        raise ModelConfigError(f"model.module.factory {config.factory!r} is not callable")
    return cast(Callable[..., nn.Module], target)


def check_constraints(config: ModuleConfig) -> None:
    """TorchRec's constraints on the collection of its own models, checked in one line.

    Raises:
        ModelConfigError: tables of several widths for a model that needs one, or a DLRM whose
            last dense layer differs from the embedding dim.
    """
    if config.factory not in _ONE_DIM_FACTORIES:
        return
    dims = sorted({t.embedding_dim for t in config.pooled_tables})
    if not dims:  # no pooled table: the factory's own call says what it lacks
        return
    if len(dims) > 1:
        raise ModelConfigError(
            f"model.module.tables: {config.factory} needs one embedding_dim for every table, "
            f"got {dims}"
        )
    if config.factory in _DLRM_FACTORIES:
        layers = list(config.kwargs.get("dense_arch_layer_sizes", []))
        if not layers or layers[-1] != dims[0]:
            raise ModelConfigError(
                f"model.module.kwargs.dense_arch_layer_sizes {layers}: {config.factory} needs "
                f"the last dense layer equal to embedding_dim {dims[0]}"
            )


def build_module(
    config: ModuleConfig,
    device: torch.device | str = "cpu",
    embedding_device: torch.device | str | None = None,
    seed: int | None = None,
) -> nn.Module:
    """A freshly initialised module of ``config``.

    Args:
        config: the module config.
        device: where the dense layers live.
        embedding_device: where the tables are allocated (``"meta"``: not at all, for
            ``DistributedModelParallel``); default ``device``.
        seed: deterministic initialisation when given (the global RNG is left as it was).

    Returns:
        The module (in the mode its factory left it: training, for TorchRec's models).

    Raises:
        ModelConfigError: the factory cannot be imported, breaks a constraint, or fails.

    Example::

        module = build_module(config, seed=0)
    """
    factory = load_factory(config)
    check_constraints(config)
    dense_device = torch.device(device)
    ebc_device = dense_device if embedding_device is None else torch.device(embedding_device)
    cuda = [dense_device.index or 0] if dense_device.type == "cuda" else []
    with torch.random.fork_rng(devices=cuda, enabled=seed is not None):
        if seed is not None:
            torch.manual_seed(seed)
        kwargs: dict[str, Any] = {**config.kwargs, **build_collections(config, ebc_device)}
        if config.device_argument:
            kwargs[config.device_argument] = dense_device
        try:
            module = factory(**kwargs)
        except Exception as exc:  # TypeError for a bad keyword, AssertionError, ValueError...
            raise ModelConfigError(
                f"model.module.factory {config.factory!r} failed with the configured kwargs: "
                f"{type(exc).__name__}: {exc}"
            ) from exc
    if not isinstance(module, nn.Module):
        raise ModelConfigError(
            f"model.module.factory {config.factory!r} returned {type(module).__name__}, "
            "not a torch.nn.Module"
        )
    if not config.device_argument:
        _move_dense(module, dense_device)
    return module


def _move_dense(module: nn.Module, device: torch.device) -> None:
    """Move every non-meta parameter and buffer to ``device`` (meta tables stay unallocated)."""
    tensors = [*module.parameters(), *module.buffers()]
    if all(t.device == device or t.is_meta for t in tensors):
        return
    if not any(t.is_meta for t in tensors):
        module.to(device)  # nothing on meta: the module's own move (tied weights stay tied)
        return
    for sub in module.modules():
        for name, param in list(sub.named_parameters(recurse=False)):
            if not param.is_meta and param.device != device:
                setattr(sub, name, nn.Parameter(param.data.to(device), param.requires_grad))
        for name, buf in list(sub.named_buffers(recurse=False)):
            if buf is not None and not buf.is_meta and buf.device != device:
                sub.register_buffer(name, buf.to(device))
