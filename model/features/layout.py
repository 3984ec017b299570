"""The shape of a model's input, independent of where the features come from.

A batch of ``R`` rows is a dense ``float32[R, dense_dim]`` tensor and a KeyedJaggedTensor with
``keys`` in order. :class:`InputLayout` is what serving needs to know about that input without
knowing the features: padding rows for a collective forward, warm-up batches shaped like real
traffic, the static shapes of CUDA graphs. The built-in model's layout comes from its
:class:`~model.features.spec.FeatureSpec`; a configured model's from its feature map.

Example::

    layout = InputLayout(keys=("user", "item", "recent"), dense_dim=8, ids_per_key=(1, 1, 20))
    layout.ids_per_row  # 22
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["InputLayout"]


@dataclass(frozen=True)
class InputLayout:
    """Keys, dense width, the most ids a row carries per key, and whether ids carry weights.

    Attributes:
        keys: the KJT's keys, in layout order.
        dense_dim: width of the dense input.
        ids_per_key: the most ids one row carries per key (1 for a single-valued feature).
        weighted: the KJT carries a weight per id (a weighted ``EmbeddingBagCollection``
            reads them; 1.0 where a key has none).
    """

    keys: tuple[str, ...]
    dense_dim: int
    ids_per_key: tuple[int, ...]
    weighted: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "keys", tuple(self.keys))
        object.__setattr__(self, "ids_per_key", tuple(int(n) for n in self.ids_per_key))
        if len(self.keys) != len(self.ids_per_key):
            raise ValueError(f"{len(self.keys)} keys but {len(self.ids_per_key)} id counts")

    @property
    def ids_per_row(self) -> int:
        """The most ids one row carries over every key."""
        return sum(self.ids_per_key)
