"""``bench retrieval`` on tiny tables (the figures themselves belong to BENCHMARKS.md), and
the benches serving a versions directory's current version."""

from __future__ import annotations

from pathlib import Path

from model.ranker import build_ranker
from model.retrieval.index import RetrievalConfig
from model.store.versions import ModelVersions
from pipeline.settings.loading import Settings
from pipeline.settings.model import ModelSettings
from pipeline.tools.bench.common import load_or_build_scorer
from pipeline.tools.bench.retrieval import bench_retrieval


def _settings(checkpoint: Path) -> Settings:
    model = ModelSettings(
        checkpoint=checkpoint,
        device="cpu",
        embedding_dim=16,
        dense_arch=[32, 16],
        over_arch=[32, 1],
        num_embeddings={"user_id": 1000, "item_id": 2000, "recent_items": 1000},
    )
    return Settings(model=model)


def test_ivfpq_against_exact_on_an_untrained_table(tmp_path: Path) -> None:
    settings = _settings(tmp_path / "none")
    config = RetrievalConfig(nlist=16, pq_m=4)
    result = bench_retrieval(settings, config, queries=40, batch=16, k=20, nprobes=(1, 16))
    assert (result["items"], result["item_rows"], result["vectors"]) == (2000, 2000, "untrained")
    assert result["auto_chooses"] == "flat"
    assert result["exact"]["ms_per_event"] > 0 and result["ivfpq"]["build_s"] > 0
    rows = result["ivfpq"]["by_nprobe"]
    assert [r["nprobe"] for r in rows] == [1, 16]
    assert rows[0]["recall_at_k"] < rows[1]["recall_at_k"]
    assert rows[1]["recall_at_k"] >= 0.9  # every cell scanned, then re-ranked exactly


def test_a_bigger_catalogue_gets_a_bigger_untrained_table(tmp_path: Path) -> None:
    result = bench_retrieval(
        _settings(tmp_path / "none"),
        RetrievalConfig(nlist=8, pq_m=4),
        items=3000,
        queries=8,
        batch=8,
        k=10,
    )
    assert result["items"] == result["item_rows"] == 3000
    assert "resized to 3000 rows" in result["vectors"]
    assert [r["nprobe"] for r in result["ivfpq"]["by_nprobe"]] == [8]  # nprobe <= nlist


def test_the_current_version_of_a_versions_directory_is_benchmarked(tmp_path: Path) -> None:
    settings = _settings(tmp_path / "models")
    spec = settings.model.feature_spec()
    versions = ModelVersions.create(tmp_path / "models")
    versions.write(build_ranker(spec, seed=1), spec, version="v1", promote=True)
    versions.write(build_ranker(spec, seed=2), spec, version="v2")
    assert load_or_build_scorer(settings).model_version == "v1"
    versions.promote("v2")
    assert load_or_build_scorer(settings).model_version == "v2"
    result = bench_retrieval(settings, RetrievalConfig(nlist=8, pq_m=4), queries=8, batch=8, k=5)
    assert result["vectors"].startswith("checkpoint v2")
