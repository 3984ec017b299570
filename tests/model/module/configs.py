"""Small configured modules the model-contract tests build: TorchRec's own models, unchanged."""

from __future__ import annotations

from model.features.layout import InputLayout
from model.module.types import Activation, ModuleConfig, OutputConfig, TableConfig

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
