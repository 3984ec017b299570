"""``[synthetic]``: the synthetic world behind ``seed-features``, ``produce`` and ``init-model``.

A tools' section: ``streamrank run`` keeps it as written and never validates it; the tools that
read it validate it here (an unknown key or a bad value is a one-line error for them alone).
"""

from __future__ import annotations

import pydantic
from pydantic import BaseModel, ConfigDict

from pipeline.settings.loading import ConfigError, Settings

__all__ = ["SyntheticSettings", "synthetic_settings"]


class SyntheticSettings(BaseModel):
    """The synthetic world's size and seed.

    All three tools must use the same values (they share this section) so that the events, the
    Redis features and the training data describe the same users and items.

    Attributes:
        num_users / num_items / num_categories: the world's size.
        seed: the world's random seed.
        min_candidates / max_candidates: candidates per produced event.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    num_users: int = 20_000
    num_items: int = 50_000
    num_categories: int = 200
    seed: int = 7
    min_candidates: int = 20
    max_candidates: int = 100


def synthetic_settings(settings: Settings) -> SyntheticSettings:
    """``settings.synthetic``, validated.

    Raises:
        ConfigError: naming the bad or unknown ``synthetic.*`` keys.

    Example::

        world = SyntheticSettings() if not settings.synthetic else synthetic_settings(settings)
    """
    try:
        return SyntheticSettings.model_validate(settings.synthetic)
    except pydantic.ValidationError as error:
        problems = []
        for problem in error.errors():
            key = ".".join(["synthetic", *(str(part) for part in problem["loc"])])
            if problem["type"] == "extra_forbidden":
                problems.append(f"unknown config key {key}")
            else:
                problems.append(f"bad config value for {key}: {problem['msg']}")
        raise ConfigError("; ".join(problems)) from error
