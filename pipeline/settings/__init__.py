"""Settings: every config section, one file per section, and how they are loaded.

``loading`` holds :class:`~pipeline.settings.loading.Settings` and ``load_settings`` (one TOML
file plus ``STREAMRANK_<SECTION>__<KEY>`` overrides); ``kafka``, ``topics``, ``codec``,
``redis``, ``batching``, ``model``, ``metrics``, ``delivery`` (also ``[shutdown]``) and
``retrieval`` (also ``[model_swap]``) are the sections; ``section`` their shared base (unknown
keys are errors); ``secrets`` which names hold secrets and how they are masked. Imports nothing
of the pipeline. Every key: docs/configuration.md.
"""
