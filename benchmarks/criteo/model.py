"""A DLRM-style CTR model on SOK Embedding Variables, in a TF1 (tf.compat.v1) graph.

    dense [B, 13] --bottom MLP--> x [B, d]
    ids   [B, 26] --ONE fused sok.lookup_sparse over all tables--> e_1..e_26 [B, d]
    T = [x, e_1, .., e_26] [B, 27, d];  Z = T T^T;  z = strictly lower triangle of Z [B, 351]
    [x, z] --top MLP--> logit [B]

Fields map onto `num_tables` Embedding Variables (field f -> table f % num_tables). With fewer
tables than fields, fields share a table and their ids are offset by field (f << 33) so they stay
distinct; each field still gets its own embedding vector per sample.
"""
import numpy as np
import tensorflow as tf

import sparse_operation_kit as sok

NUM_DENSE = 13
NUM_CAT = 26
FIELD_SHIFT = 33  # hex ids are < 2**32 (and -1 for empty): field f's ids live near f << 33


def _dense_layer(x, units, name, seed, activation):
    fan_in = int(x.shape[-1])
    with tf.compat.v1.variable_scope(name, reuse=tf.compat.v1.AUTO_REUSE):
        w = tf.compat.v1.get_variable(
            "kernel",
            [fan_in, units],
            tf.float32,
            initializer=tf.initializers.GlorotUniform(seed=seed),
        )
        b = tf.compat.v1.get_variable(
            "bias", [units], tf.float32, initializer=tf.initializers.Zeros()
        )
    y = tf.matmul(x, w) + b
    return tf.nn.relu(y) if activation else y


def mlp(x, sizes, name, seed, last_activation=True):
    for i, units in enumerate(sizes):
        last = i == len(sizes) - 1
        x = _dense_layer(
            x, units, f"{name}/layer{i}", seed + i, activation=last_activation or not last
        )
    return x


class DLRM:
    def __init__(
        self,
        embedding_dim=16,
        num_tables=NUM_CAT,
        bottom_mlp=(64, 32),
        top_mlp=(256, 128),
        seed=0,
        name="dlrm",
        embedding_init=None,
    ):
        if not 1 <= num_tables <= NUM_CAT:
            raise ValueError(f"num_tables must be in [1, {NUM_CAT}], got {num_tables}")
        self.dim = int(embedding_dim)
        self.num_tables = int(num_tables)
        self.bottom_sizes = list(bottom_mlp) + [
            self.dim
        ]  # the bottom MLP ends in the embedding size
        self.top_sizes = list(top_mlp) + [1]
        self.seed = int(seed)
        self.name = name
        self.table_of_field = [f % self.num_tables for f in range(NUM_CAT)]
        self.shared = self.num_tables < NUM_CAT
        # New rows start uniform in [-bound, bound] (default 1/sqrt(dim)).
        bound = 1.0 / np.sqrt(self.dim) if embedding_init is None else float(embedding_init)
        self.tables = [
            sok.get_embedding_variable(
                f"{name}_emb_{t}" if self.shared else f"{name}_emb_C{t + 1}",
                self.dim,
                key_dtype=tf.int64,
                initializer=tf.random_uniform_initializer(-bound, bound, seed=self.seed + t),
            )
            for t in range(self.num_tables)
        ]
        n = NUM_CAT + 1
        li, lj = np.tril_indices(n, -1)
        self._tril = (li * n + lj).astype(np.int32)

    @property
    def num_interactions(self):
        return len(self._tril)

    def _field_ids(self, ids):
        """[B, 26] int64, or a list of 26 [B] int64 (the training input's), -> one [B] id tensor
        per field (one id per sample; offset by field for shared tables). A matrix takes one
        transpose, then rows of [26, B]: tf.unstack(axis=1) of int64 on the GPU took ~7 ms at
        batch 65,536 (H200) and 26 column slices launch 26 copies; int64 Unpack itself
        runs on the host (fine for fed evaluation batches, which come from the host)."""
        if isinstance(ids, (list, tuple)):
            if len(ids) != NUM_CAT:
                raise ValueError(f"DLRM: {len(ids)} id tensors for {NUM_CAT} fields")
            if not self.shared:
                return list(ids)
            return [i + (f << FIELD_SHIFT) for f, i in enumerate(ids)]
        if self.shared:
            ids = ids + tf.constant(np.arange(NUM_CAT, dtype=np.int64) << FIELD_SHIFT)
        return tf.unstack(tf.transpose(ids), num=NUM_CAT, axis=0)

    def __call__(self, dense, ids, training):
        """Logits [B] of dense [B, 13] float32 and ids [B, 26] int64 (or 26 [B] int64)."""
        with tf.compat.v1.variable_scope(self.name, reuse=tf.compat.v1.AUTO_REUSE):
            x = mlp(dense, self.bottom_sizes, "bottom_mlp", self.seed + 100)
            embs = sok.lookup_sparse(
                [self.tables[t] for t in self.table_of_field],
                self._field_ids(ids),
                combiners=["sum"] * NUM_CAT,
                training=training,
            )
            self.embeddings = embs
            t = tf.stack([x] + embs, axis=1)  # [B, 27, d]
            z = tf.matmul(t, t, transpose_b=True)  # [B, 27, 27]
            n = NUM_CAT + 1
            z = tf.gather(tf.reshape(z, [-1, n * n]), self._tril, axis=1)  # [B, 351]
            top = tf.concat([x, z], axis=1)
            logits = mlp(top, self.top_sizes, "top_mlp", self.seed + 200, last_activation=False)
        return tf.squeeze(logits, axis=1)


def auc(labels, scores):
    """Exact ROC AUC (Mann-Whitney U with average ranks for tied scores)."""
    labels = np.asarray(labels).astype(np.float64).ravel()
    scores = np.asarray(scores).astype(np.float64).ravel()
    pos = labels.sum()
    neg = labels.size - pos
    if pos == 0 or neg == 0:
        return float("nan")
    order = np.argsort(scores, kind="mergesort")
    _, inverse, counts = np.unique(scores[order], return_inverse=True, return_counts=True)
    ends = np.cumsum(counts)
    avg_rank = (ends - counts + 1 + ends) / 2.0  # 1-based average rank of each distinct score
    ranks = avg_rank[inverse]
    return float((ranks[labels[order] > 0.5].sum() - pos * (pos + 1) / 2.0) / (pos * neg))


def log_loss(labels, probs, eps=1e-7):
    labels = np.asarray(labels, np.float64)
    p = np.clip(np.asarray(probs, np.float64), eps, 1 - eps)
    return float(-np.mean(labels * np.log(p) + (1 - labels) * np.log(1 - p)))
