"""The synthetic world: users, items, their features, the click model and event sampling."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from model.features.segments import Int64Array
from model.features.spec import string_to_id
from model.synthetic.config import (
    CATEGORY_ID_BASE,
    ITEM_ID_BASE,
    ITEM_ID_STRIDE,
    USER_ID_BASE,
    USER_ID_STRIDE,
    WorldConfig,
)
from model.synthetic.events import SampledEvents

__all__ = ["SyntheticWorld"]

Float32Array = npt.NDArray[np.float32]
Float64Array = npt.NDArray[np.float64]


class SyntheticWorld:
    """Users, items, their features and the click model, all fixed by a :class:`WorldConfig`.

    Args:
        config: sizes and seed.

    Attributes:
        user_ids: int64[U] raw user ids.
        item_ids: int64[I] raw item ids.
        user_latent: float32[U, latent_dim].
        item_latent: float32[I, latent_dim].
        item_category_index: int64[I] category index in ``[0, num_categories)``.
        item_category: int64[I] raw category id (``CATEGORY_ID_BASE + index``).
        item_popularity: float64[I] sampling probability of each item (sums to 1, Zipf).
        item_log_popularity_z: float64[I] standardised log popularity.
        user_dense: float32[U, user_dense_dim].
        item_dense: float32[I, item_dense_dim].
        user_recent: int64[U, max_recent] stored recent item indices, ``-1`` padded.
        user_recent_counts: int64[U] valid entries of ``user_recent`` (0..max_recent).
        user_liked: int64[U, 2 * max_recent + max_event_recent] popular items each user likes,
            best first; events draw their own ``recent_item_ids`` from the part after
            ``max_recent``.
        user_device: int64[U] each user's usual device.
        user_country: int64[U] each user's home country.
        device_ids: int64[D] ``string_to_id`` of each device string.
        country_ids: int64[C] ``string_to_id`` of each country string.

    Example::

        world = SyntheticWorld(WorldConfig(seed=7))
        events = world.sample_events(1000, np.random.default_rng(0))
        cols = feature_columns(events, world)
        labels = sample_labels(events, world, np.random.default_rng(1))
    """

    def __init__(self, config: WorldConfig | None = None) -> None:
        cfg = config if config is not None else WorldConfig()
        self.config = cfg
        rng = np.random.default_rng(cfg.seed)
        num_u, num_i, num_k, dim = cfg.num_users, cfg.num_items, cfg.num_categories, cfg.latent_dim

        self.user_ids: Int64Array = USER_ID_BASE + np.arange(num_u, dtype=np.int64) * USER_ID_STRIDE
        self.item_ids: Int64Array = ITEM_ID_BASE + np.arange(num_i, dtype=np.int64) * ITEM_ID_STRIDE

        # Popularity: Zipf over a random ranking of the items.
        rank = rng.permutation(num_i).astype(np.float64) + 1.0
        weights = rank ** (-cfg.zipf_exponent)
        self.item_popularity: Float64Array = weights / weights.sum()
        log_pop = np.log(self.item_popularity)
        self.item_log_popularity_z: Float64Array = (log_pop - log_pop.mean()) / max(
            float(log_pop.std()), 1e-12
        )
        self._popularity_cdf: Float64Array = np.cumsum(self.item_popularity)
        self._popularity_cdf[-1] = 1.0

        # Latents: items cluster around their category.
        category_latent = rng.standard_normal((num_k, dim))
        self.item_category_index: Int64Array = rng.integers(0, num_k, size=num_i, dtype=np.int64)
        self.item_category: Int64Array = CATEGORY_ID_BASE + self.item_category_index
        item_latent = 0.75 * category_latent[self.item_category_index] + 0.66 * (
            rng.standard_normal((num_i, dim))
        )
        self.item_latent: Float32Array = item_latent.astype(np.float32)
        self.user_latent: Float32Array = rng.standard_normal((num_u, dim)).astype(np.float32)

        # Dense features: noisy linear images of the latents.
        user_proj = rng.standard_normal((dim, cfg.user_dense_dim)) / np.sqrt(dim)
        user_dense = self.user_latent @ user_proj + 0.2 * rng.standard_normal(
            (num_u, cfg.user_dense_dim)
        )
        self.user_dense: Float32Array = user_dense.astype(np.float32)
        item_dense = np.empty((num_i, cfg.item_dense_dim), dtype=np.float64)
        if cfg.item_dense_dim > 1:
            item_proj = rng.standard_normal((dim, cfg.item_dense_dim - 1)) / np.sqrt(dim)
            item_dense[:, :-1] = item_latent @ item_proj + 0.2 * rng.standard_normal(
                (num_i, cfg.item_dense_dim - 1)
            )
        item_dense[:, -1] = self.item_log_popularity_z
        self.item_dense: Float32Array = item_dense.astype(np.float32)

        # Biases of the click model.
        num_d, num_c = len(cfg.devices), len(cfg.countries)
        self.category_bias: Float64Array = 0.5 * rng.standard_normal(num_k)
        self.device_bias: Float64Array = 0.3 * rng.standard_normal(num_d)
        self.device_category_bias: Float64Array = 0.4 * rng.standard_normal((num_d, num_k))
        self.country_bias: Float64Array = 0.2 * rng.standard_normal(num_c)

        # Context affinity: a usual device and a home country per user.
        device_weights = rng.dirichlet(np.full(num_d, 2.0))
        self.user_device: Int64Array = rng.choice(num_d, size=num_u, p=device_weights).astype(
            np.int64
        )
        country_weights = 1.0 / np.arange(1, num_c + 1, dtype=np.float64)
        self.user_country: Int64Array = rng.choice(
            num_c, size=num_u, p=country_weights / country_weights.sum()
        ).astype(np.int64)
        self.device_ids: Int64Array = np.array(
            [string_to_id(d) for d in cfg.devices], dtype=np.int64
        )
        self.country_ids: Int64Array = np.array(
            [string_to_id(c) for c in cfg.countries], dtype=np.int64
        )

        # Liked items: the highest-affinity items among a popularity sample, best first.
        num_liked = 2 * cfg.max_recent + cfg.max_event_recent
        pool_size = min(num_i, max(4 * num_liked, num_liked))
        pool = self._sample_distinct(np.full(num_u, pool_size, dtype=np.int64), rng)
        pool = pool.reshape(num_u, pool_size)
        affinity = np.einsum("ud,upd->up", self.user_latent, self.item_latent[pool])
        best = np.argsort(-affinity, axis=1, kind="stable")[:, :num_liked]
        self.user_liked: Int64Array = np.take_along_axis(pool, best, axis=1)
        self.user_recent_counts: Int64Array = rng.integers(
            0, cfg.max_recent + 1, size=num_u, dtype=np.int64
        )
        recent = self.user_liked[:, : cfg.max_recent].copy()
        recent[np.arange(cfg.max_recent)[None, :] >= self.user_recent_counts[:, None]] = -1
        self.user_recent: Int64Array = recent

    # ------------------------------------------------------------------ lookups

    @property
    def num_users(self) -> int:
        return self.config.num_users

    @property
    def num_items(self) -> int:
        return self.config.num_items

    def user_index_of(self, raw_user_ids: npt.ArrayLike) -> Int64Array:
        """Map raw user ids back to user indices (vectorised).

        Raises:
            KeyError: if an id is not one of this world's users.
        """
        return _index_of(raw_user_ids, USER_ID_BASE, USER_ID_STRIDE, self.num_users, "user")

    def item_index_of(self, raw_item_ids: npt.ArrayLike) -> Int64Array:
        """Map raw item ids back to item indices (vectorised).

        Raises:
            KeyError: if an id is not one of this world's items.
        """
        return _index_of(raw_item_ids, ITEM_ID_BASE, ITEM_ID_STRIDE, self.num_items, "item")

    def stored_recent_item_ids(self, user_index: int) -> Int64Array:
        """Raw ids of the user's stored recent items (the Redis ``recent`` list), in order."""
        count = int(self.user_recent_counts[user_index])
        return self.item_ids[self.user_recent[user_index, :count]]

    # ------------------------------------------------------------------ click model

    def click_logit(
        self,
        user_index: npt.ArrayLike,
        item_index: npt.ArrayLike,
        device_index: npt.ArrayLike,
        country_index: npt.ArrayLike,
    ) -> Float64Array:
        """The true click logit (see the module docstring), broadcasting over the inputs."""
        cfg = self.config
        u = np.asarray(user_index, dtype=np.int64)
        i = np.asarray(item_index, dtype=np.int64)
        d = np.asarray(device_index, dtype=np.int64)
        c = np.asarray(country_index, dtype=np.int64)
        u, i, d, c = np.broadcast_arrays(u, i, d, c)
        dot = np.einsum(
            "...k,...k->...",
            self.user_latent[u].astype(np.float64),
            self.item_latent[i].astype(np.float64),
        ) / np.sqrt(cfg.latent_dim)
        cat = self.item_category_index[i]
        return (
            cfg.affinity_scale * dot
            + cfg.popularity_scale * self.item_log_popularity_z[i]
            + self.category_bias[cat]
            + self.device_category_bias[d, cat]
            + self.device_bias[d]
            + self.country_bias[c]
            + cfg.base_logit
        )

    def click_probability(
        self,
        user_index: npt.ArrayLike,
        item_index: npt.ArrayLike,
        device_index: npt.ArrayLike,
        country_index: npt.ArrayLike,
    ) -> Float64Array:
        """True click probability ``sigmoid(click_logit(...))``, vectorised.

        Args:
            user_index: user indices.
            item_index: item indices.
            device_index: indices into ``config.devices``.
            country_index: indices into ``config.countries``.

        Returns:
            float64 probabilities, the broadcast shape of the inputs.

        Example::

            p = world.click_probability(np.zeros(3), np.arange(3), 0, 0)
        """
        logit = self.click_logit(user_index, item_index, device_index, country_index)
        return 1.0 / (1.0 + np.exp(-logit))

    # ------------------------------------------------------------------ sampling

    def sample_events(
        self, n: int, rng: np.random.Generator, start_time_ms: int = 1_700_000_000_000
    ) -> SampledEvents:
        """Draw ``n`` events (vectorised; deterministic given ``rng``'s state).

        Users are uniform; the device is the user's usual one with probability 0.7 (else
        uniform); the country is the user's home country with probability 0.95 (else uniform).
        Candidates: ``C_e`` uniform in ``[min_candidates, max_candidates]``, drawn by
        popularity without replacement. Three quarters of the events carry
        ``recent_item_ids`` (0..max_event_recent items the user likes, not in the stored list);
        the rest carry ``None``.

        Args:
            n: number of events.
            rng: the generator to draw from.
            start_time_ms: time of the first event; the rest follow ~5 ms apart.

        Returns:
            The events.
        """
        cfg = self.config
        num_d, num_c = len(cfg.devices), len(cfg.countries)
        user = rng.integers(0, cfg.num_users, size=n, dtype=np.int64)
        device = np.where(
            rng.random(n) < 0.7,
            self.user_device[user],
            rng.integers(0, num_d, size=n, dtype=np.int64),
        )
        country = np.where(
            rng.random(n) < 0.95,
            self.user_country[user],
            rng.integers(0, num_c, size=n, dtype=np.int64),
        )
        counts = rng.integers(cfg.min_candidates, cfg.max_candidates + 1, size=n, dtype=np.int64)
        candidates = self._sample_distinct(counts, rng)

        has_recent = rng.random(n) < 0.75
        recent_counts = np.where(
            has_recent, rng.integers(0, cfg.max_event_recent + 1, size=n, dtype=np.int64), 0
        ).astype(np.int64)
        # Each event picks distinct slots from the user's liked items after the stored ones.
        spare = self.user_liked.shape[1] - cfg.max_recent
        if spare > 0 and n > 0:
            slot_order = np.argsort(rng.random((n, spare)), axis=1)
            take = np.arange(spare)[None, :] < recent_counts[:, None]
            slots = cfg.max_recent + slot_order[take]
            recent_items = self.user_liked[np.repeat(user, recent_counts), slots]
        else:
            recent_counts[:] = 0
            recent_items = np.zeros(0, dtype=np.int64)

        num_results = np.asarray(cfg.num_results_choices, dtype=np.int64)[
            rng.integers(0, len(cfg.num_results_choices), size=n)
        ]
        gaps = rng.exponential(5.0, size=n)
        times = start_time_ms + np.floor(np.cumsum(gaps) - gaps[:1]).astype(np.int64)
        id_bits = rng.integers(
            0, np.iinfo(np.uint64).max, size=(n, 2), dtype=np.uint64, endpoint=True
        )
        return SampledEvents(
            user_index=user,
            device_index=device.astype(np.int64),
            country_index=country.astype(np.int64),
            candidate_counts=counts,
            candidate_items=candidates,
            has_recent=has_recent,
            recent_counts=recent_counts,
            recent_items=recent_items.astype(np.int64),
            num_results=num_results,
            event_time_ms=times,
            event_id_bits=id_bits,
        )

    def _sample_distinct(self, counts: Int64Array, rng: np.random.Generator) -> Int64Array:
        """Per row, ``counts[r]`` distinct items drawn by popularity without replacement.

        Sequential sampling without replacement equals drawing with replacement and keeping the
        first occurrence of each item; rows that see too few distinct items are redrawn with
        twice as many draws. Returns the rows' items concatenated (row-major).
        """
        num_rows = counts.shape[0]
        max_count = int(counts.max()) if num_rows else 0
        out = np.full((num_rows, max_count), -1, dtype=np.int64)
        pending = np.arange(num_rows, dtype=np.int64)
        draws_per_row = max(2 * max_count, max_count + 16)
        while pending.size:
            want = counts[pending]
            draws = np.searchsorted(
                self._popularity_cdf, rng.random((pending.size, draws_per_row)), side="right"
            )
            draws = np.minimum(draws, self.num_items - 1).astype(np.int64)
            order = np.argsort(draws, axis=1, kind="stable")
            sorted_draws = np.take_along_axis(draws, order, axis=1)
            first_sorted = np.ones_like(sorted_draws, dtype=bool)
            first_sorted[:, 1:] = sorted_draws[:, 1:] != sorted_draws[:, :-1]
            first = np.empty_like(first_sorted)
            np.put_along_axis(first, order, first_sorted, axis=1)
            rank = np.cumsum(first, axis=1)
            done = rank[:, -1] >= want
            keep = first & (rank <= want[:, None]) & done[:, None]
            rows_done = np.nonzero(keep)[0]
            out[pending[rows_done], rank[keep] - 1] = draws[keep]
            pending = pending[~done]
            draws_per_row *= 2
        flat_mask = np.arange(max_count)[None, :] < counts[:, None]
        return out[flat_mask]


def _index_of(raw: npt.ArrayLike, base: int, stride: int, size: int, what: str) -> Int64Array:
    ids = np.asarray(raw, dtype=np.int64)
    offset = ids - base
    index = offset // stride
    bad = (offset % stride != 0) | (index < 0) | (index >= size)
    if bad.any():
        raise KeyError(f"unknown {what} id(s): {ids[bad][:5].tolist()}")
    return index
