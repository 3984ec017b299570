"""Values derived from settings, each computed in one place: the warm-up batch sizes
(``[batching]``) and each rank's metrics port (``[metrics]``)."""

from __future__ import annotations

from pipeline.settings.batching import BatchingSettings
from pipeline.settings.metrics import MetricsSettings


def test_warm_up_rows_are_the_largest_batch_and_half_of_it() -> None:
    assert BatchingSettings(max_batch_rows=512).warm_up_rows == (512, 256)
    assert BatchingSettings(max_batch_rows=1).warm_up_rows == (1, 1)


def test_each_rank_serves_its_metrics_on_the_next_port_and_port_zero_stays_free() -> None:
    assert [MetricsSettings(port=9464).port_for(r) for r in range(3)] == [9464, 9465, 9466]
    assert MetricsSettings(port=0).port_for(2) == 0
