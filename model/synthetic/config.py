"""Size, shape and seed of a synthetic world, and the raw ids of its users, items and categories."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "CATEGORY_ID_BASE",
    "ITEM_ID_BASE",
    "ITEM_ID_STRIDE",
    "USER_ID_BASE",
    "USER_ID_STRIDE",
    "WorldConfig",
]

USER_ID_BASE = 10**12
USER_ID_STRIDE = 7919
ITEM_ID_BASE = 5 * 10**12
ITEM_ID_STRIDE = 104_729
CATEGORY_ID_BASE = 1000

_DEFAULT_COUNTRIES = ("US", "GB", "DE", "FR", "IN", "BR", "JP", "CA", "AU", "ES", "IT", "MX")


@dataclass(frozen=True)
class WorldConfig:
    """Size, shape and seed of a :class:`SyntheticWorld`.

    Args:
        num_users: users; raw id of user ``k`` is ``USER_ID_BASE + k * USER_ID_STRIDE``.
        num_items: items; raw id of item ``k`` is ``ITEM_ID_BASE + k * ITEM_ID_STRIDE``.
        num_categories: item categories; raw id of category ``c`` is ``CATEGORY_ID_BASE + c``.
        latent_dim: width of the hidden user/item vectors that drive clicks.
        seed: fixes everything about the world (events use their own generator).
        user_dense_dim: width of the user dense feature.
        item_dense_dim: width of the item dense feature (the last column is log popularity).
        zipf_exponent: item popularity is proportional to ``rank ** -zipf_exponent``.
        min_candidates: fewest candidates per event.
        max_candidates: most candidates per event.
        max_recent: most recent items stored per user (the Redis ``recent`` list).
        max_event_recent: most ``recent_item_ids`` carried by one event.
        num_results_choices: ``num_results`` is drawn uniformly from these.
        devices: device strings of ``UserEvent.context.device``.
        countries: country codes of ``UserEvent.context.country``.
        affinity_scale: weight of the user-item latent affinity in the click logit.
        popularity_scale: weight of standardised log popularity in the click logit.
        base_logit: intercept of the click logit (sets the overall click rate).

    Example::

        world = SyntheticWorld(WorldConfig(num_users=1000, num_items=2000, seed=1))
    """

    num_users: int = 20_000
    num_items: int = 50_000
    num_categories: int = 200
    latent_dim: int = 8
    seed: int = 7
    user_dense_dim: int = 8
    item_dense_dim: int = 8
    zipf_exponent: float = 1.1
    min_candidates: int = 20
    max_candidates: int = 100
    max_recent: int = 10
    max_event_recent: int = 3
    num_results_choices: tuple[int, ...] = (5, 10, 20)
    devices: tuple[str, ...] = ("ios", "android", "web", "tv")
    countries: tuple[str, ...] = _DEFAULT_COUNTRIES
    affinity_scale: float = 2.0
    popularity_scale: float = 0.5
    base_logit: float = -4.0

    def __post_init__(self) -> None:
        if min(self.num_users, self.num_items, self.num_categories, self.latent_dim) < 1:
            raise ValueError("num_users, num_items, num_categories and latent_dim must be >= 1")
        if self.user_dense_dim < 1 or self.item_dense_dim < 1:
            raise ValueError("user_dense_dim and item_dense_dim must be >= 1")
        if not 1 <= self.min_candidates <= self.max_candidates <= self.num_items:
            raise ValueError(
                "need 1 <= min_candidates <= max_candidates <= num_items, got "
                f"{self.min_candidates}, {self.max_candidates}, {self.num_items}"
            )
        if self.max_recent < 0 or self.max_event_recent < 0:
            raise ValueError("max_recent and max_event_recent must be >= 0")
        if 2 * self.max_recent + self.max_event_recent > self.num_items:
            raise ValueError("num_items too small for the recent-item lists")
        if not self.num_results_choices or min(self.num_results_choices) < 1:
            raise ValueError("num_results_choices must be non-empty and positive")
        if not self.devices or not self.countries:
            raise ValueError("devices and countries must be non-empty")
