"""Ingest workers as threads of the test process (the real pool logic, no spawned process):
the server tests drive :class:`~pipeline.ingest.server.ScoringServer` with them."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from multiprocessing import Pipe

import numpy as np

from model.features.layout import InputLayout
from model.features.spec import FeatureSpec
from model.module.output import DEFAULT_OUTPUT
from model.module.types import OutputConfig
from model.rank import RankContext
from pipeline.ingest.remote_scorer import RemoteScorer
from pipeline.ingest.transport import (
    SLOTS_PER_WORKER,
    SharedSlot,
    SlotShape,
    WorkerDone,
    WorkerLink,
)
from pipeline.ingest.workers import Channel, IngestWorkers
from pipeline.observability.latency_sketch import LatencySketch
from pipeline.settings.batching import BatchingSettings
from pipeline.settings.loading import Settings
from tests.pipeline.factories import TINY_SPEC

WorkerBody = Callable[[int, RemoteScorer], None]


class ThreadProcess:
    """Stands in for a worker process: a thread, an exit code, a sentinel that becomes readable
    when it ends."""

    def __init__(self, run: Callable[[], None]) -> None:
        self._read, self._write = os.pipe()
        self.exitcode: int | None = None
        self.pid = 0
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._main, args=(run,), daemon=True)

    def _main(self, run: Callable[[], None]) -> None:
        code = 0
        try:
            run()
        except BaseException as exc:
            self.error = exc
            code = 1
        finally:
            self.exitcode = code
            os.close(self._write)

    @property
    def sentinel(self) -> int:
        return self._read

    def start(self) -> None:
        self._thread.start()

    def join(self, timeout: float | None = None) -> None:
        self._thread.join(timeout)


class ThreadWorkers(IngestWorkers):
    """:class:`IngestWorkers` whose workers are threads running ``body(index, scorer)`` with a
    :class:`RemoteScorer` of their own, after the start barrier; then they send a summary.
    The served model is the tiny built-in one unless ``inputs`` (a configured module's layout)
    and ``output`` say otherwise."""

    def __init__(
        self,
        count: int,
        body: WorkerBody,
        max_rows: int = 256,
        inputs: FeatureSpec | InputLayout = TINY_SPEC,
        output: OutputConfig = DEFAULT_OUTPUT,
        version: str = "tiny-1",
    ) -> None:
        settings = Settings(batching=BatchingSettings(ingest_workers=count))
        super().__init__(
            settings, RankContext(), inputs, version, lambda a: None, max_rows, output=output
        )
        self._body = body
        self._shape = SlotShape.for_model(inputs, output, max_rows)

    def start(self) -> None:
        count = self.settings.batching.ingest_workers
        for index in range(count):
            slots = [SharedSlot.allocate(self._shape) for _ in range(SLOTS_PER_WORKER)]
            ours, theirs = Pipe(duplex=True)
            process = ThreadProcess(self._runner(index, theirs, slots))
            self.channels.append(Channel(index, process, ours, slots))
        for channel in self.channels:
            channel.process.start()

    def _runner(self, index: int, conn, slots: list[SharedSlot]) -> Callable[[], None]:  # type: ignore[no-untyped-def]
        def run() -> None:
            link = WorkerLink(conn)
            try:
                link.wait_for_start()
                remote = RemoteScorer(link, slots, self.inputs, self.model_version, self.output)
                self._body(index, remote)
                link.send(
                    WorkerDone(
                        summary={
                            "events_in": index + 1,
                            "events_out": index + 1,
                            "dead_lettered": 0,
                            "rows_scored": 10 * (index + 1),
                            "batches": 1,
                        },
                        latencies=_latencies(np.full(index + 1, 0.01 * (index + 1))),
                        first_input_at=100.0 + index,
                        last_output_at=110.0 + index,
                        metrics=[],
                    )
                )
            finally:
                link.close()

        return run


def _latencies(values: np.ndarray) -> LatencySketch:
    sketch = LatencySketch()
    sketch.add(values)
    return sketch
