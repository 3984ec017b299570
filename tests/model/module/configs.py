"""Small configured modules the model-contract tests build: TorchRec's own models, unchanged,
a weighted DLRM, the sequence example's own ranker and a managed-collision DeepFM."""

from __future__ import annotations

from model.features.layout import InputLayout
from model.module.types import (
    Activation,
    ManagedCollision,
    ModuleConfig,
    OutputConfig,
    TableConfig,
)
from tests.conftest import REPO_ROOT

DEEPFM_TABLES = (
    TableConfig("t_user", 50, 8, ("user",)),
    TableConfig("t_item", 80, 8, ("item",)),
    TableConfig("t_recent", 80, 8, ("recent",), ids_per_row=4),
)
DEEPFM = ModuleConfig(
    factory="torchrec.models.deepfm:SimpleDeepFMNN",
    kwargs={"num_dense_features": 3, "hidden_layer_size": 16, "deep_fm_dimension": 4},
    tables=DEEPFM_TABLES,
    output=OutputConfig(Activation.PROBABILITIES),
)
DEEPFM_LAYOUT = InputLayout(("user", "item", "recent"), 3, (1, 1, 4))

DCN = ModuleConfig(
    factory="torchrec.models.dlrm:DLRM_DCN",
    kwargs={
        "dense_in_features": 4,
        "dense_arch_layer_sizes": [16, 8],
        "over_arch_layer_sizes": [16, 1],
        "dcn_num_layers": 2,
        "dcn_low_rank_dim": 4,
    },
    tables=(
        TableConfig("t_user", 60, 8, ("user",)),
        TableConfig("t_item", 90, 8, ("item",)),
        TableConfig("t_country", 7, 8, ("country",)),
    ),
    device_argument="dense_device",
)
DCN_LAYOUT = InputLayout(("user", "item", "country"), 4, (1, 1, 1))

WEIGHTED = ModuleConfig(
    factory="torchrec.models.dlrm:DLRM",
    kwargs={
        "dense_in_features": 3,
        "dense_arch_layer_sizes": [8, 8],
        "over_arch_layer_sizes": [8, 1],
    },
    tables=(
        TableConfig("t_user", 50, 8, ("user",)),
        TableConfig("t_tags", 40, 8, ("tags",), ids_per_row=3),
    ),
    device_argument="dense_device",
    weighted=True,
)
WEIGHTED_LAYOUT = InputLayout(("user", "tags"), 3, (1, 3), weighted=True)

SEQUENCE = ModuleConfig(
    factory="history_ranker:HistoryRanker",
    kwargs={
        "dense_in_features": 3,
        "history_length": 4,
        "query_key": "item",
        "history_key": "history",
        "hidden": 8,
    },
    tables=(
        TableConfig("t_user", 50, 8, ("user",)),
        TableConfig("t_item", 80, 8, ("item",)),
        TableConfig("t_history", 80, 8, ("history",), ids_per_row=4, kind="sequence"),
    ),
    code_dir=str(REPO_ROOT / "examples" / "sequence"),
    sequence_collection_argument="embedding_collection",
)
SEQUENCE_LAYOUT = InputLayout(("user", "item", "history"), 3, (1, 1, 4))

MANAGED = ModuleConfig(
    factory="tests.model.module.modules:managed_deepfm",
    kwargs=DEEPFM.kwargs,
    tables=DEEPFM_TABLES,
    output=OutputConfig(Activation.PROBABILITIES),
    managed_collision=ManagedCollision(input_hash_size=1000),
)
MANAGED_LAYOUT = DEEPFM_LAYOUT
