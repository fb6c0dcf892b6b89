"""sparse_operation_kit: Embedding Variables, fused sparse lookups and sparse optimizers for
TensorFlow (`import sparse_operation_kit as sok`)."""
import tensorflow as tf

from sparse_operation_kit.adapters import feature_column
from sparse_operation_kit.adapters.get_variable import get_embedding_variable
from sparse_operation_kit.adapters.variables import (
    DistributedVariable,
    DynamicVariable,
    LocalizedVariable,
    Variable,
    assign,
    export,
)

# registers the meta graph protos of Embedding Variables
from sparse_operation_kit.checkpoint import meta_graph as _meta_graph  # noqa: F401
from sparse_operation_kit.checkpoint.dump import dump, load
from sparse_operation_kit.checkpoint.incremental import (
    incremental_model_dump,
    incremental_model_load,
    update_step,
)
from sparse_operation_kit.keras import layers
from sparse_operation_kit.keras.layers import Embedding, SparseEmbedding
from sparse_operation_kit.lookup import tf_api as _tf_api  # noqa: F401  TF's lookups on EVs
from sparse_operation_kit.lookup.group_embedding import group_embedding_lookup_sparse
from sparse_operation_kit.lookup.lookup import (
    all2all_dense_embedding,
    lookup_sparse,
)  # also registers gradients
from sparse_operation_kit.optimizers.loss_scale import LossScaleOptimizer
from sparse_operation_kit.optimizers.optimizers import SGD, OptimizerWrapper, filter_variables
from sparse_operation_kit.parallel.communication import set_comm_tool
from sparse_operation_kit.parallel.partitioned import PartitionedEmbeddingVariable
from sparse_operation_kit.runtime.collectives import all_gather, all_reduce
from sparse_operation_kit.runtime.context import init, num_ranks, rank
from sparse_operation_kit.runtime.devices import gpu_kernels_built, kernel_run_counts
from sparse_operation_kit.runtime.version import __version__, parse_tf_version
from sparse_operation_kit.serving.serving import save_stock_saved_model
from sparse_operation_kit.tables.embedding_variable import (
    CacheStrategy,
    CBFFilter,
    CounterFilter,
    EmbeddingVariable,
    EmbeddingVariableOption,
    EvictOption,
    GlobalStepEvict,
    InitializerOption,
    L2WeightEvict,
    StorageOption,
    StorageType,
)
from sparse_operation_kit.tables.eviction import sparse_read_and_evict
from sparse_operation_kit.tables.tables import StaticTable

tf_version = parse_tf_version(tf.__version__)  # [major, minor, patch] as in SOK 2.x

__all__ = [
    "init",
    "rank",
    "num_ranks",
    "all_gather",
    "all_reduce",
    "get_embedding_variable",
    "EmbeddingVariable",
    "EmbeddingVariableOption",
    "InitializerOption",
    "CounterFilter",
    "CBFFilter",
    "EvictOption",
    "GlobalStepEvict",
    "L2WeightEvict",
    "StorageOption",
    "StorageType",
    "CacheStrategy",
    "PartitionedEmbeddingVariable",
    "lookup_sparse",
    "group_embedding_lookup_sparse",
    "feature_column",
    "OptimizerWrapper",
    "LossScaleOptimizer",
    "SGD",
    "filter_variables",
    "Variable",
    "DynamicVariable",
    "DistributedVariable",
    "LocalizedVariable",
    "set_comm_tool",
    "StaticTable",
    "export",
    "assign",
    "tf_version",
    "all2all_dense_embedding",
    "dump",
    "load",
    "incremental_model_dump",
    "incremental_model_load",
    "update_step",
    "sparse_read_and_evict",
    "layers",
    "Embedding",
    "SparseEmbedding",
    "save_stock_saved_model",
    "kernel_run_counts",
    "gpu_kernels_built",
    "__version__",
]
