"""Loading one model version for serving: its scorer and its retrieval index, together.

One loader serves the start-up and every later version (:mod:`pipeline.models.watch` calls it
on its background thread, :mod:`pipeline.runtime.model_swap` finishes what needs the loop). A
version is a :class:`ServedModel`: the :class:`~model.serving.Scorer` (built by the one
:class:`~model.serving.ScorerFactory`) and, with ``[retrieval]`` on, the
:class:`~model.retrieval.index.RetrievalIndex` built from the same checkpoint's item vectors (a
configured model's: :class:`~pipeline.models.configured_index.ConfiguredIndex`, from the vectors
``[retrieval]`` names), so the candidates a version retrieves and the scores it gives always come
from the same weights.

Loading has two parts:

- :meth:`ModelLoader.load_local` needs no other process and runs off the loop (the watcher's
  thread): the metadata and its compatibility with what is served (the Redis feature layout
  and the decoder depend on ``user_dense_dim``, ``item_dense_dim`` and ``recent_items_cap``),
  the item catalogue and the retrieval index, and in one process the whole scorer. With
  several ranks it also checks the weights (the digest of ``model.pt``, or a sharded
  checkpoint's index read with DCP's own classes only), so that a corrupt or foreign file is
  found by every rank alone, before any collective.
- :meth:`ModelLoader.complete` is the collective part of a sharded model (planning, sharding
  and loading the shards, on the default process group): every rank calls it at the same
  step, with no forward in flight (see :mod:`pipeline.runtime.model_swap`). In one process there is
  nothing left to do.

Neither part warms the model up: the scoring thread does, before its first batch
(:meth:`pipeline.stages.score.ForwardExecutor.swap`).

Example::

    loader = ModelLoader(settings, RankContext.from_env())
    served = loader.load(checkpoint)              # start-up: both parts
    pending = loader.load_local(new_version_dir)  # the watcher's thread
    served = loader.complete(pending)             # the agreed step
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from model.rank import RankContext
from model.serving.options import ServingOptions
from pipeline.connectors.redis.connection import FeatureClient, bulk_client
from pipeline.models.catalogue import (
    configured_catalogue,
    load_catalogue,
    load_retrieval_index,
)
from pipeline.settings.loading import Settings
from pipeline.settings.retrieval import CatalogueSource

if TYPE_CHECKING:
    from model.features.spec import FeatureSpec
    from model.module.store import CheckedVersion
    from model.module.types import ModuleConfig
    from model.retrieval.config import RetrievalConfig
    from model.retrieval.index import VectorIndex
    from model.serving import Scorer
    from pipeline.models.preflight import ConfiguredModel

__all__ = [
    "IncompatibleModel",
    "IndexedModel",
    "ModelLoader",
    "PendingModel",
    "ServedModel",
    "max_event_rows",
    "serving_options",
]

log = logging.getLogger(__name__)

#: What the serving loop depends on beyond the model (the Redis layout, the decoder's cap).
_FIXED_SPEC_FIELDS = ("user_dense_dim", "item_dense_dim", "recent_items_cap")


class IncompatibleModel(ValueError):
    """A version whose features the running pipeline cannot serve without a restart."""


@dataclass(frozen=True)
class ServedModel:
    """One model version, ready to serve.

    Attributes:
        scorer: the model (not warmed up on the scoring thread yet).
        index: its retrieval index; ``None`` with retrieval off or an empty catalogue.
        options: the serving options its scorer was built with (the largest batch, for the
            ingest workers' slots).
        configured: the configured model it serves (its feature map and output contract, for
            the loop), as the loader resolved it once; ``None`` for the built-in model.
    """

    scorer: Scorer
    index: VectorIndex | None
    options: ServingOptions
    configured: ConfiguredModel | None = None

    @property
    def version(self) -> str:
        """Its ``model_version`` (the name Recommendations carry)."""
        return self.scorer.model_version


@dataclass(frozen=True)
class PendingModel:
    """A version after :meth:`ModelLoader.load_local`.

    Attributes:
        path: its checkpoint directory.
        version: its ``model_version``.
        index: its retrieval index (or ``None``).
        scorer: the scorer when it could be built off the loop (one process); ``None``: the
            ranks build it together (:meth:`ModelLoader.complete`).
        checked: a configured module's version, its architecture checked (its scorer does
            not check it again); ``None`` for the built-in model.
        configured: the configured model (:meth:`ModelLoader.configured`); ``None`` for the
            built-in model.
        options: the serving options :attr:`scorer` was built with; ``None`` with it.
    """

    path: Path
    version: str
    index: VectorIndex | None
    scorer: Scorer | None
    checked: CheckedVersion | None = None
    configured: ConfiguredModel | None = None
    options: ServingOptions | None = None


@dataclass(frozen=True)
class IndexedModel:
    """A version's retrieval index alone (:meth:`ModelLoader.load_index`: an ingest worker's,
    whose scorer is its rank's).

    Attributes:
        index: its retrieval index; ``None`` with retrieval off or an empty catalogue.
        configured: the configured model it was built for (its feature map and output
            contract, for the worker's loop); ``None`` for the built-in model.
    """

    index: VectorIndex | None
    configured: ConfiguredModel | None = None


class ModelLoader:
    """Builds :class:`ServedModel` s of checkpoint directories for this process.

    Args:
        settings: ``[model]`` (how to serve), ``[retrieval]`` (the index: its config read
            once, here), ``[redis]`` (the catalogue), ``batching.max_batch_rows`` and
            ``codec.max_candidates``.
        rank: this process's place in the job (several ranks: sharded, collective).
        redis_client: for ``retrieval.catalogue = "redis"`` (default: one from
            ``[redis]``, made when first needed:
            :func:`pipeline.connectors.redis.connection.bulk_client`).
        configured: ``[model.module]`` resolved by the start-up checks of this process
            (:func:`pipeline.models.preflight.check_configured_model`); default: resolved here
            when first needed (:func:`pipeline.models.preflight.resolve_configured_model`).
    """

    def __init__(
        self,
        settings: Settings,
        rank: RankContext | None = None,
        redis_client: FeatureClient | None = None,
        configured: ConfiguredModel | None = None,
    ) -> None:
        self.settings = settings
        self.rank = rank or RankContext()
        self._redis = redis_client
        self._retrieval: RetrievalConfig = settings.retrieval.config
        """``[retrieval]``'s config: every index is built with it (and carries it to the loop's
        retriever), the serving options count its candidates."""
        self._spec: FeatureSpec | None = None
        self._module = configured
        """``[model.module]`` resolved: its config, feature map and retrieval plan."""

    def configured(self) -> ConfiguredModel | None:
        """The configured model (its config, feature map and retrieval plan), resolved once
        per process; ``None`` for the built-in model."""
        if self.settings.model.module is None:
            return None
        if self._module is None:
            from pipeline.models.preflight import resolve_configured_model

            self._module = resolve_configured_model(self.settings)
        return self._module

    def load(self, checkpoint: Path) -> ServedModel:
        """Both parts at once (start-up; collective with several ranks).

        Raises:
            UnsupportedOption: a ``[model]`` option this job cannot serve.
            FileNotFoundError / ValueError: a missing, corrupt or incompatible checkpoint.
        """
        return self.complete(self.load_local(checkpoint, check_weights=False))

    def load_local(self, checkpoint: Path, check_weights: bool = True) -> PendingModel:
        """Everything that needs no other rank (safe on a background thread).

        Args:
            checkpoint: the version's checkpoint directory.
            check_weights: with several ranks, read the weights against their digest now
                (``False`` at start-up, where a failure stops the job anyway and the sharded
                load checks the digest again).

        Returns:
            The pending version.

        Raises:
            IncompatibleModel: its features differ from the served version's.
            Exception: whatever reading the checkpoint, the catalogue or building the index
                raised.
        """
        configured = self.configured()
        checked = None
        if configured is None:
            from model.store.checkpoint import load_meta

            meta = load_meta(checkpoint)
            self._check_compatible(meta.spec)
            version = meta.model_version
        else:  # checked once: by the start-up checks (that version), else here (a swap too)
            checked = configured.checked
            if checked is None or checked.path != checkpoint:
                checked = _check_module_version(configured.module, checkpoint)
            version = checked.meta.model_version
        scorer = options = None
        if self.rank.distributed:
            if check_weights:
                _verify_weights(checkpoint, configured is not None)
        else:
            from model.serving import ScorerFactory

            options = serving_options(
                self.settings, configured, checkpoint, checked, self._retrieval
            )
            scorer = ScorerFactory(options, self.rank).create_scorer()
        index = self.retrieval_index(checkpoint)  # after the weights: a corrupt one fails first
        return PendingModel(checkpoint, version, index, scorer, checked, configured, options)

    def complete(self, pending: PendingModel) -> ServedModel:
        """The rest: with several ranks, build the sharded scorer (collective: every rank at
        the same step, nothing else on the default process group meanwhile).

        Raises:
            Exception: whatever building the scorer raised.
        """
        scorer, options = pending.scorer, pending.options
        if scorer is None or options is None:
            from model.serving import ScorerFactory

            options = serving_options(
                self.settings, pending.configured, pending.path, pending.checked, self._retrieval
            )
            scorer = ScorerFactory(options, self.rank).create_scorer()
        if self._spec is None and scorer.builtin:
            self._spec = scorer.spec
        return ServedModel(scorer, pending.index, options, pending.configured)

    def _check_compatible(self, spec: FeatureSpec) -> None:
        served = self._spec
        if served is None:
            return
        changed = [
            f"{name} {getattr(served, name)} -> {getattr(spec, name)}"
            for name in _FIXED_SPEC_FIELDS
            if getattr(served, name) != getattr(spec, name)
        ]
        if changed:
            raise IncompatibleModel(
                f"its features differ from the served model's ({', '.join(changed)}): "
                "restart the pipeline to serve it"
            )

    def load_index(self, checkpoint: Path) -> IndexedModel:
        """The retrieval index of ``checkpoint`` alone, with the configured model it serves
        (an ingest worker builds its own; its scorer is its rank's).

        Args:
            checkpoint: the version's checkpoint directory.

        Returns:
            The index and the configured model.

        Example::

            indexed = ModelLoader(settings).load_index(checkpoint)
        """
        return IndexedModel(self.retrieval_index(checkpoint), self.configured())

    def retrieval_index(self, checkpoint: Path) -> VectorIndex | None:
        """The retrieval index of ``checkpoint`` (:meth:`load_local`, :meth:`load_index`).

        Args:
            checkpoint: the version's checkpoint directory.

        Returns:
            The index; ``None`` with ``[retrieval]`` off or an empty catalogue (logged).

        Example::

            index = ModelLoader(settings).retrieval_index(checkpoint)
        """
        settings = self.settings
        if not settings.retrieval.enabled:
            return None
        if settings.model.module is not None:
            return self._configured_index(checkpoint)
        client = None
        if settings.retrieval.catalogue is CatalogueSource.REDIS:
            client = self._redis_client()
        catalogue = load_catalogue(settings.retrieval, client, settings.redis.key_prefix)
        if catalogue.size == 0:
            _empty_catalogue(settings.retrieval.catalogue)
            return None
        return load_retrieval_index(checkpoint, self._retrieval, catalogue)

    def _configured_index(self, checkpoint: Path) -> VectorIndex | None:
        """A configured model version's index (:mod:`pipeline.models.configured_index`)."""
        from model.module.store import load_module_meta
        from model.retrieval.sources import RecordVectors
        from pipeline.models.configured_index import load_configured_index

        retrieval = self.settings.retrieval
        configured = self.configured()
        assert configured is not None and configured.retrieval is not None  # retrieval is on
        plan = configured.retrieval
        redis_items = isinstance(plan.items, RecordVectors)
        client = None
        if retrieval.catalogue is CatalogueSource.REDIS or redis_items:
            client = self._redis_client()
        catalogue = configured_catalogue(retrieval, plan, client)
        if catalogue.size == 0:
            _empty_catalogue(retrieval.catalogue)
            return None
        version = load_module_meta(checkpoint).model_version
        max_bytes = self.settings.redis.max_value_bytes
        return load_configured_index(
            checkpoint, self._retrieval, plan, catalogue, client, version, max_bytes
        )

    def _redis_client(self) -> FeatureClient:
        if self._redis is None:
            self._redis = bulk_client(self.settings.redis)
        return self._redis


def _empty_catalogue(source: CatalogueSource) -> None:
    log.warning(
        "retrieval: the item catalogue (%s) is empty: events without candidates go to "
        "the dead-letter topic (no_candidates) until a model version loads with items",
        source.value,
    )


def serving_options(
    settings: Settings,
    configured: ConfiguredModel | None = None,
    checkpoint: Path | None = None,
    checked: CheckedVersion | None = None,
    retrieval: RetrievalConfig | None = None,
) -> ServingOptions:
    """The complete serving options of ``settings``: what the one
    :class:`~model.serving.ScorerFactory` builds, for the loader, ``run``'s launch check and
    the benchmarks alike (the same batch and graph shapes everywhere).

    Args:
        settings: ``[model]`` (device, precision, quantize, compile, sharding),
            ``batching.max_batch_rows`` and the largest one-event batch
            (:func:`max_event_rows`).
        configured: the configured model (``[model.module]`` resolved: its module config and
            feature map's layout); ``None``: the built-in model.
        checkpoint: the version to serve (a versions directory's current version); default
            ``model.checkpoint``.
        checked: ``checkpoint``'s version, its architecture checked against ``configured``
            (``None``: the scorer checks it); ignored for the built-in model.
        retrieval: ``settings.retrieval.config`` as the caller read it (the model loader);
            default: read here.

    Example::

        ScorerFactory(serving_options(settings)).create_scorer()
    """
    model = settings.model
    return ServingOptions(
        checkpoint=checkpoint or model.checkpoint,
        device=model.device,
        quantize=model.quantize,
        compile=model.compile,
        compile_mode=model.compile_mode,
        precision=model.precision,
        sharding=model.sharding.config,
        max_batch_rows=settings.batching.max_batch_rows,
        max_event_rows=max_event_rows(settings, retrieval),
        module=configured.module if configured is not None else None,
        layout=configured.fmap.layout if configured is not None else None,
        checked=checked if configured is not None else None,
    )


def max_event_rows(settings: Settings, retrieval: RetrievalConfig | None = None) -> int:
    """Rows of the largest one-event batch: ``codec.max_candidates`` or, with retrieval on,
    ``retrieval.num_candidates`` if larger (the scorer's options, the ingest workers' slots).

    Args:
        settings: ``codec.max_candidates``, ``retrieval.enabled``.
        retrieval: ``settings.retrieval.config`` as the caller read it; default: read here.

    Example::

        max_event_rows(settings)  # 1000 by default
    """
    rows = settings.codec.max_candidates
    if settings.retrieval.enabled:
        config = retrieval or settings.retrieval.config
        rows = max(rows, config.num_candidates)
    return rows


def _verify_weights(checkpoint: Path, module_version: bool = False) -> None:
    """Read a single-process checkpoint's weights against their digest, or a sharded one's
    index through :func:`model.store.dcp_reader.read_dcp_index` (DCP's own classes only), so
    that a corrupt or foreign file is refused by every rank alone, before any collective; a
    configured module's version against the digest its import recorded."""
    from model.store.version_info import DCP_INDEX_FILE

    if module_version:
        from model.module.store import verify_module_weights

        verify_module_weights(checkpoint)
        return
    if (checkpoint / DCP_INDEX_FILE).is_file():
        from model.store.dcp_reader import read_dcp_index

        read_dcp_index(checkpoint)
        return
    from model.store.checkpoint import load_state_dict

    load_state_dict(checkpoint, verify=True, mmap=True)


def _check_module_version(config: ModuleConfig, checkpoint: Path) -> CheckedVersion:
    """The version, once its metadata says it was imported for ``config``'s module.

    Raises:
        IncompatibleModel: another architecture (the running pipeline needs a restart).
    """
    from model.module.store import CheckedVersion, check_architecture, load_module_meta
    from model.module.types import ModelConfigError

    meta = load_module_meta(checkpoint)
    try:
        check_architecture(config, meta, checkpoint)
    except ModelConfigError as exc:
        raise IncompatibleModel(f"{exc} (a new architecture needs a restart)") from exc
    return CheckedVersion(checkpoint, meta)
