"""sparse_operation_kit: Embedding Variables, fused sparse lookups and sparse optimizers for
TensorFlow (`import sparse_operation_kit as sok`)."""
import tensorflow as tf

from sparse_operation_kit import feature_column, layers
from sparse_operation_kit import meta_graph as _meta_graph  # noqa: F401  registers EV meta graph protos
from sparse_operation_kit.collectives import all_reduce
from sparse_operation_kit.communication import set_comm_tool
from sparse_operation_kit.context import init, num_ranks, rank
from sparse_operation_kit.devices import gpu_kernels_built, kernel_run_counts
from sparse_operation_kit.dump import dump, load
from sparse_operation_kit.embedding_variable import (
    CBFFilter,
    CounterFilter,
    EmbeddingVariable,
    EmbeddingVariableOption,
    EvictOption,
    GlobalStepEvict,
    InitializerOption,
    L2WeightEvict,
    StorageOption,
)
from sparse_operation_kit.eviction import sparse_read_and_evict
from sparse_operation_kit.get_variable import get_embedding_variable
from sparse_operation_kit.group_embedding import group_embedding_lookup_sparse
from sparse_operation_kit.incremental import (
    incremental_model_dump,
    incremental_model_load,
    update_step,
)
from sparse_operation_kit.layers import Embedding, SparseEmbedding
from sparse_operation_kit.lookup import (
    all2all_dense_embedding,
    lookup_sparse,
)  # also registers gradients
from sparse_operation_kit.optimizers import SGD, OptimizerWrapper, filter_variables
from sparse_operation_kit.partitioned import PartitionedEmbeddingVariable
from sparse_operation_kit.serving import save_stock_saved_model
from sparse_operation_kit.tables import StaticTable
from sparse_operation_kit.variables import (
    DistributedVariable,
    DynamicVariable,
    LocalizedVariable,
    Variable,
    assign,
    export,
)
from sparse_operation_kit.version import __version__, parse_tf_version

tf_version = parse_tf_version(tf.__version__)  # [major, minor, patch] as in SOK 2.x

__all__ = [
    "init",
    "rank",
    "num_ranks",
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
    "PartitionedEmbeddingVariable",
    "lookup_sparse",
    "group_embedding_lookup_sparse",
    "feature_column",
    "OptimizerWrapper",
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
