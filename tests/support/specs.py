"""Small feature specs for tests: the six tables of a :class:`model.features.spec.FeatureSpec`
by their row counts."""

from __future__ import annotations

from model.features.spec import SparseFeature, TableSpec


def feature_tables(
    users: int, items: int, categories: int, devices: int, countries: int, recent_items: int
) -> tuple[TableSpec, ...]:
    """One table per sparse feature, in the spec's order, with these numbers of rows."""
    return (
        TableSpec(SparseFeature.USER_ID, users),
        TableSpec(SparseFeature.ITEM_ID, items),
        TableSpec(SparseFeature.ITEM_CATEGORY, categories),
        TableSpec(SparseFeature.DEVICE, devices),
        TableSpec(SparseFeature.COUNTRY, countries),
        TableSpec(SparseFeature.RECENT_ITEMS, recent_items),
    )
