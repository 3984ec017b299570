"""A deterministic synthetic world: users, items, features, events and clicks.

One :class:`SyntheticWorld` (fixed by :class:`WorldConfig`, including its seed) is shared by the
Redis feature seeding, the event producer and training, so that the features the pipeline looks
up are the ones the ranker was trained on and scores carry signal.

Clicks follow a logistic model (see :meth:`SyntheticWorld.click_logit`)::

    logit = affinity_scale * <user_latent, item_latent> / sqrt(latent_dim)
          + popularity_scale * z(log popularity)
          + category_bias[category] + device_category_bias[device, category]
          + device_bias[device] + country_bias[country] + base_logit

Item latents cluster around their category's latent, user dense vectors are a noisy linear
image of the user latent, item dense vectors a noisy image of the item latent plus standardised
log popularity, and users' stored recent items are popular items they have high affinity for.

Modules: ``config`` (size, shape, seed and raw ids of a world), ``world`` (the world, its click
model and event sampling), ``events`` (a batch of sampled events as columns), ``columns`` (what
the pipeline and the trainer see of them), ``train`` (training the ranker on the world),
``evaluation`` (AUC and log loss).
"""

from model.synthetic.columns import (
    feature_columns,
    row_click_probability,
    sample_labels,
    to_event_dicts,
)
from model.synthetic.config import (
    CATEGORY_ID_BASE,
    ITEM_ID_BASE,
    ITEM_ID_STRIDE,
    USER_ID_BASE,
    USER_ID_STRIDE,
    WorldConfig,
)
from model.synthetic.events import SampledEvents
from model.synthetic.world import SyntheticWorld

__all__ = [
    "CATEGORY_ID_BASE",
    "ITEM_ID_BASE",
    "ITEM_ID_STRIDE",
    "USER_ID_BASE",
    "USER_ID_STRIDE",
    "SampledEvents",
    "SyntheticWorld",
    "WorldConfig",
    "feature_columns",
    "row_click_probability",
    "sample_labels",
    "to_event_dicts",
]
