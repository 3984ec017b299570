"""Redis: ``feature_store`` holds the key layout of the feature store (``<prefix>:u:<id>``,
``<prefix>:i:<id>``; docs/schemas.md), the batch's MGET request built in one compiled pass, the
values' binary encoding, and the writer that fills the store; ``layout`` the configured record
layouts; ``connection`` the enrichers' own connection (packed commands out, replies in, redis's
errors as ours) and the model loader's client, so that no stage, nor ``pipeline/models/``,
imports ``redis``; ``keys`` the ids of a key template's keys (SCAN: the retrieval catalogue);
``vectors`` one vector field of many records (a configured model's item vectors).
"""
