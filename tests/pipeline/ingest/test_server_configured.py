"""A configured model behind the scoring server, its workers as threads (no Kafka, no spawned
process): every batch comes back as the module's own forward scores it, with every task column
its output publishes; the top-K a worker takes of them is the one-process path's; a version
promoted mid-run is swapped in between two forwards, and each reply names the version that
scored it."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import torch

from model.serving.options import ServingOptions
from model.store.versions import ModelVersions
from pipeline.ingest.remote_scorer import RemoteScorer
from pipeline.ingest.server import ScoringServer
from pipeline.models.loader import PendingModel, ServedModel
from pipeline.models.watch import ModelWatcher
from pipeline.runtime.model_swap import ModelSwap
from pipeline.runtime.stepping import StepAgreement
from tests.pipeline.ingest.configured import LAYOUT, TWO_TASKS, dcn_scorer, random_input
from tests.pipeline.ingest.threads import ThreadWorkers


def test_every_batch_comes_back_as_the_modules_own_forward_with_its_task_columns() -> None:
    scorer = dcn_scorer()
    inputs = {w: [random_input(5 + 3 * b + w, seed=10 * w + b) for b in range(4)] for w in (0, 1)}
    got: dict[int, list[tuple[torch.Tensor, str]]] = {0: [], 1: []}
    tops: dict[int, list[object]] = {0: [], 1: []}

    def body(index: int, remote: RemoteScorer) -> None:
        for inp in inputs[index]:
            probs = remote.forward(remote.stage_input(inp).ready_input())
            got[index].append((probs, remote.model_version))
            counts = np.array([2, inp.num_rows - 2], dtype=np.int64)
            tops[index].append(remote.top_k(probs, counts, np.array([1, 3], dtype=np.int64)))

    workers = ThreadWorkers(2, body, inputs=LAYOUT, output=TWO_TASKS, version="dcn-1")
    workers.start()
    server = ScoringServer(scorer, StepAgreement())
    server.run(workers)
    workers.close()

    assert server.scored == 8
    for w in (0, 1):
        for inp, (probs, version), top in zip(inputs[w], got[w], tops[w], strict=True):
            alone = scorer.forward(inp)
            assert probs.shape == (inp.num_rows, 3)  # the ranking score, click, purchase
            assert torch.equal(probs, alone) and version == "dcn-1"
            one_process = scorer.top_k(alone, np.array([2, inp.num_rows - 2]), np.array([1, 3]))
            assert np.array_equal(top.row_index, one_process.row_index)  # type: ignore[attr-defined]
            assert np.array_equal(top.tasks, one_process.tasks)  # type: ignore[attr-defined]


def _version(versions: ModelVersions, name: str) -> None:
    path = versions.root / name
    path.mkdir()
    (path / "meta.json").write_text(json.dumps({"model_version": name}))
    (path / "model.pt").write_text("weights")  # the loader below builds its own


class _Loader:
    """Each version is the module with weights of its own seed (v1: 0, v2: 1)."""

    def load_local(self, path: Path) -> PendingModel:
        seed = int(path.name.removeprefix("v")) - 1
        return PendingModel(path, path.name, None, dcn_scorer(seed, path.name))

    def complete(self, pending: PendingModel) -> ServedModel:
        assert pending.scorer is not None
        return ServedModel(pending.scorer, None, ServingOptions(checkpoint=pending.path))


def test_a_version_promoted_mid_run_scores_every_batch_after_its_swap(tmp_path: Path) -> None:
    versions = ModelVersions.create(tmp_path / "versions")
    for name in ("v1", "v2"):
        _version(versions, name)
    versions.promote("v1")
    loader = _Loader()
    watcher: ModelWatcher[PendingModel] = ModelWatcher(versions.root, loader.load_local, "v1")
    models = ModelSwap(watcher, loader)  # type: ignore[arg-type]
    before, after = random_input(7, seed=1), random_input(9, seed=2)
    got: list[tuple[torch.Tensor, str]] = []
    server: list[ScoringServer] = []

    def body(index: int, remote: RemoteScorer) -> None:
        got.append((remote.forward(remote.stage_input(before).ready_input()), remote.model_version))
        versions.promote("v2")
        watcher.check_once()  # loads v2 (the watcher's thread would, in a run)
        deadline = time.monotonic() + 30
        while server[0].model_version != "v2":  # swapped between two of the server's steps
            assert time.monotonic() < deadline, "v2 was never swapped in"
            time.sleep(0.01)
        got.append((remote.forward(remote.stage_input(after).ready_input()), remote.model_version))

    workers = ThreadWorkers(1, body, inputs=LAYOUT, output=TWO_TASKS, version="v1")
    server.append(ScoringServer(dcn_scorer(0, "v1"), StepAgreement(), models=models))
    workers.start()
    server[0].run(workers)
    workers.close()

    (first, v_first), (second, v_second) = got
    assert (v_first, v_second) == ("v1", "v2")
    assert torch.equal(first, dcn_scorer(0).forward(before))
    assert torch.equal(second, dcn_scorer(1).forward(after))
    assert not torch.equal(second, dcn_scorer(0).forward(after))  # the weights did change
