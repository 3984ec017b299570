"""The fault suite runs on the integration tests' fixtures (real Kafka and Redis)."""

from tests.integration.conftest import (  # noqa: F401  (fixtures, registered by import)
    background_pipeline,
    cli,
    pipeline_settings,
    send_events,
    spec,
    trained_checkpoint,
    world,
)
