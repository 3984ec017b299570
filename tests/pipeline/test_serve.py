"""What ``run``'s start-up checks resolve of the built-in model (its output contract) is what
:func:`pipeline.serve.build_pipeline` hands the loop: resolved once, not again by the loop."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from model.rank import RankContext
from model.ranker import build_ranker
from model.store.checkpoint import save_checkpoint
from pipeline.cli.checks import require_builtin_model
from pipeline.cli.errors import UserError
from pipeline.connectors.kafka.clients import KafkaClients
from pipeline.models.output import OutputContract
from pipeline.observability.metrics import Metrics
from pipeline.serve import build_pipeline
from pipeline.settings.events import EventSettings
from pipeline.settings.loading import Settings
from pipeline.settings.metrics import MetricsSettings
from pipeline.settings.model import ModelSettings
from pipeline.settings.output import OutputSettings
from pipeline.settings.retrieval import RetrievalSettings
from tests.pipeline.factories import TINY_SPEC, DefaultsEnricher
from tests.pipeline.fakes import FakeConsumer, FakeProducer
from tests.pipeline.runtime.test_loop_output import SCHEMA


def test_the_builtin_models_checks_return_its_output_contract(tmp_path: Path) -> None:
    assert require_builtin_model(Settings()) == OutputContract()  # the built-in Recommendation
    schema_file = tmp_path / "answer.avsc"
    schema_file.write_text(json.dumps(SCHEMA))
    output = OutputSettings(
        schema_file=schema_file, event_id="id", user_id="user", items="items", scores="scores",
        model_version="version", scored_at="at", event_time="requested_at",
        fallback_features="degraded",
    )  # fmt: skip
    contract = require_builtin_model(Settings(output=output))
    assert contract.schema_file == schema_file and contract.program is not None
    with pytest.raises(UserError, match=r"output\.items = 'nowhere'"):
        require_builtin_model(Settings(output=output.model_copy(update={"items": "nowhere"})))
    with pytest.raises(UserError, match=r"\[events\] and \[features\] map the input"):
        require_builtin_model(Settings(events=EventSettings(schema_file=schema_file)))


def test_build_pipeline_hands_the_loop_the_checks_output_contract(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    checkpoint = tmp_path / "tiny"
    save_checkpoint(build_ranker(TINY_SPEC, seed=0), TINY_SPEC, checkpoint, model_version="t")
    settings = Settings(
        model=ModelSettings(checkpoint=checkpoint, device="cpu"),
        retrieval=RetrievalSettings(enabled=False),
        metrics=MetricsSettings(enabled=False),
    )
    checked = require_builtin_model(settings)

    def resolved_again(*args: object) -> OutputContract:
        raise AssertionError("the output contract was resolved again")

    monkeypatch.setattr("pipeline.runtime.loop.resolve_output", resolved_again)
    pipeline = build_pipeline(
        settings,
        RankContext(),
        Metrics(),
        enricher=DefaultsEnricher(TINY_SPEC),
        clients=lambda kafka, topics, stats_cb: KafkaClients.of(FakeConsumer(), FakeProducer()),
        output=checked,
    )
    assert pipeline.output is checked
