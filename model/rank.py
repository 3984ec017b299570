"""Where this process stands in its job: rank, local rank, world size, local world size.

Read once, from the variables torchrun sets (``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``,
``LOCAL_WORLD_SIZE``), by the entry point that starts the work; everything below it takes a
:class:`RankContext` argument instead of reading the environment again.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["RankContext"]


@dataclass(frozen=True)
class RankContext:
    """This process's place in a (possibly single-process) job.

    Attributes:
        rank: global rank, 0 .. world_size - 1.
        local_rank: rank on this host (picks the host's GPU).
        world_size: ranks in the job.
        local_world_size: ranks on this host.

    Example::

        ctx = RankContext.from_env()   # under torchrun: RANK, LOCAL_RANK, ...
        if ctx.distributed: ...
    """

    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    local_world_size: int = 1

    def __post_init__(self) -> None:
        if not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank {self.rank} is not in 0..{self.world_size - 1}")
        if not 0 <= self.local_rank < self.local_world_size:
            raise ValueError(
                f"local rank {self.local_rank} is not in 0..{self.local_world_size - 1}"
            )

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> RankContext:
        """The context torchrun describes in ``environ`` (default ``os.environ``); a single
        process (0, 0, 1, 1) when it sets nothing."""
        env = os.environ if environ is None else environ
        world = int(env.get("WORLD_SIZE", "1"))
        local_world = int(env.get("LOCAL_WORLD_SIZE", str(world)))
        return cls(
            rank=int(env.get("RANK", "0")),
            local_rank=int(env.get("LOCAL_RANK", "0")),
            world_size=world,
            local_world_size=local_world,
        )

    @property
    def distributed(self) -> bool:
        """Whether the job has several ranks (the model is sharded across them)."""
        return self.world_size > 1
