"""Tests for model.ranker."""

from __future__ import annotations

import dataclasses

import numpy as np
import torch
from torchrec.modules.embedding_configs import PoolingType

from model.features.build import FeatureColumns, build_model_input
from model.features.model_input import pad_model_input
from model.features.spec import FeatureSpec
from model.ranker import Ranker, build_ranker, embedding_bag_configs


def test_embedding_configs_follow_spec(spec: FeatureSpec) -> None:
    configs = embedding_bag_configs(spec)
    assert [c.name for c in configs] == [t.name for t in spec.tables]
    assert [c.feature_names for c in configs] == [[name] for name in spec.feature_names]
    assert all(c.embedding_dim == spec.embedding_dim for c in configs)
    assert [c.num_embeddings for c in configs] == [t.num_embeddings for t in spec.tables]
    assert all(c.pooling == PoolingType.SUM for c in configs)


def test_forward_and_score(cols: FeatureColumns, spec: FeatureSpec) -> None:
    ranker = build_ranker(spec, seed=0)
    inp = build_model_input(cols, spec)
    logits = ranker(inp.dense, inp.sparse)
    assert logits.shape == (cols.num_rows,)
    assert logits.dtype == torch.float32
    assert logits.requires_grad
    probs = ranker.score(inp)
    assert not probs.requires_grad
    assert ((probs >= 0) & (probs <= 1)).all()
    torch.testing.assert_close(probs, torch.sigmoid(logits.detach()))


def test_single_row_keeps_shape(cols: FeatureColumns, spec: FeatureSpec) -> None:
    first = cols.slice_events(0, 1)
    one = dataclasses.replace(
        first,
        candidate_counts=np.array([1], dtype=np.int64),
        candidate_ids=first.candidate_ids[:1],
        item_category=first.item_category[:1],
        item_dense=first.item_dense[:1],
    )
    assert build_ranker(spec, seed=0).score(build_model_input(one, spec)).shape == (1,)


def test_seed_is_deterministic_and_leaves_global_rng(spec: FeatureSpec) -> None:
    torch.manual_seed(123)
    before = torch.rand(1)
    torch.manual_seed(123)
    a = build_ranker(spec, seed=5)
    after = torch.rand(1)
    b = build_ranker(spec, seed=5)
    c = build_ranker(spec, seed=6)
    assert torch.equal(before, after)
    sa, sb, sc = a.state_dict(), b.state_dict(), c.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert not all(torch.equal(sa[k], sc[k]) for k in sa)


def test_meta_embedding_device(spec: FeatureSpec) -> None:
    ranker = build_ranker(spec, embedding_device="meta")
    assert isinstance(ranker, Ranker)
    for name, param in ranker.named_parameters():
        is_table = "embedding_bags" in name
        assert param.is_meta == is_table, name
    assert ranker.embedding_bag_collection.device.type == "meta"


def test_padding_rows_do_not_change_real_scores(cols: FeatureColumns, spec: FeatureSpec) -> None:
    ranker = build_ranker(spec, seed=1)
    inp = build_model_input(cols, spec)
    padded = pad_model_input(inp, inp.num_rows + 13)
    scores = ranker.score(inp)
    padded_scores = ranker.score(padded)
    assert padded_scores.shape == (inp.num_rows + 13,)
    torch.testing.assert_close(padded_scores[: inp.num_rows], scores)
