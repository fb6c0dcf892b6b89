"""The Criteo job's TF1 graph: the DLRM training step (SOK's fused lookup and optimizer wrapper),
the evaluation outputs, the input pipeline, and saving (checkpoint and serving SavedModel)."""

import os

import data as criteo_data
import model as criteo_model
import numpy as np
import tensorflow as tf

import sparse_operation_kit as sok


def _sum_over_ranks(grads_and_vars, loss):
    """The gradients of the global batch's mean loss, and that loss, from this rank's gradients of
    its local-mean loss divided by the world size (equal local batches).

    Dense variables: their sum over ranks, with the loss, in one sok.all_reduce (one NCCL launch
    on GPUs). Embedding Variables: SOK's exchange already sums every rank's per-key gradient on
    the key's owner. Scaling the objective once, instead of each table's gradient, saves a kernel
    per table in every step.
    """
    out = list(grads_and_vars)
    dense = [i for i, (g, v) in enumerate(out)
             if g is not None and not isinstance(v, sok.EmbeddingVariable)]
    reduced = sok.all_reduce([tf.convert_to_tensor(out[i][0]) for i in dense] + [loss], op="sum")
    for i, r in zip(dense, reduced[:-1], strict=True):
        out[i] = (r, out[i][1])
    return out, reduced[-1]


# A training batch as the input pipeline yields it: dense [B, 13], labels [B], then one [B] id
# tensor per field.
_BATCH_SIGNATURE = (
    tf.TensorSpec([None, criteo_data.NUM_DENSE], tf.float32),
    tf.TensorSpec([None], tf.float32),
) + (tf.TensorSpec([None], tf.int64),) * criteo_data.NUM_CAT


_INDEX_SIGNATURE = tf.TensorSpec([None], tf.int64)
_PARALLEL_BATCHES = 8  # batches gathered at once (np.take releases the GIL)


def train_dataset(train, batches, rank, size):
    """This rank's training batches as a tf.data pipeline: the generator yields only row indices;
    the rows are gathered by numpy in parallel tf.data map calls (in order) while earlier steps
    train, and batches are copied to the GPU ahead of use."""

    def indices():
        for idx in batches:
            yield idx[rank::size]

    def gather(idx):
        # The fields' ids as separate arrays (columns made contiguous here, in the parallel map):
        # unstacking [B, 26] int64 in the graph runs on the host even on a GPU (TensorFlow's int64
        # Unpack keeps its tensors in host memory): a synchronous copy to the host and back
        # (~1.5-2 ms at batch 65,536) in every step.
        b = criteo_data.take(train, idx)
        return (b.dense, b.labels, *np.ascontiguousarray(b.ids.T))

    def take(idx):
        out = tf.numpy_function(gather, [idx], [s.dtype for s in _BATCH_SIGNATURE], stateful=False)
        for t, spec in zip(out, _BATCH_SIGNATURE):
            t.set_shape(spec.shape)
        return out[0], tuple(out[2:]), out[1]  # dense, field ids, labels

    ds = tf.data.Dataset.from_generator(indices, output_signature=_INDEX_SIGNATURE)
    ds = ds.map(take, num_parallel_calls=_PARALLEL_BATCHES, deterministic=True).prefetch(2)
    gpus = tf.config.list_logical_devices("GPU")
    if gpus:
        ds = ds.apply(tf.data.experimental.prefetch_to_device(gpus[0].name, buffer_size=2))
    return ds


class ResidentSplit:
    """The training split in GPU memory, filled once from placeholders: the dense features, the
    labels and the field ids as one [fields, rows] matrix, and the epoch's row order (put there
    by `load_order`). A step takes its rows on the GPU: a step counter modulo the batches of an
    epoch picks this rank's positions of the order, and three gathers take those rows, so a step
    copies nothing from the host and runs no input pipeline (an index generator in tf.data took
    host time beside every step and set the ranks' steps apart). Steps past the last loaded
    epoch wrap around in its order. The ids' columns come apart as float64 (the same bits):
    TensorFlow's int64 Unpack keeps its tensors in host memory, while the float64 one on the GPU
    hands out slices of its input (no copy) when a column's bytes are a multiple of 64. A gather
    per field column cost the step some 1.3 ms of launches and gaps (H200 traces)."""

    def __init__(self, train, schedule, rank, size):
        columns = [train.dense, train.labels, np.ascontiguousarray(train.ids.T)]
        self._placeholders = [tf.compat.v1.placeholder(c.dtype, c.shape) for c in columns]
        self._columns = columns
        self._order_in = tf.compat.v1.placeholder(tf.int64, [schedule.n])
        # This rank's positions in a global batch (its slice rank::size, as in the feed input).
        positions = np.arange(rank, min(schedule.batch_size, schedule.n), size, dtype=np.int64)
        gpus = tf.config.list_logical_devices("GPU")
        with tf.device(gpus[0].name if gpus else None):
            self._vars = [tf.compat.v1.Variable(ph, trainable=False, collections=[], use_resource=True,
                                                name=f"resident_{i}")
                          for i, ph in enumerate(self._placeholders)]
            self._order = tf.compat.v1.Variable(self._order_in, trainable=False, collections=[],
                                                use_resource=True, name="resident_order")
            self._step = tf.compat.v1.Variable(tf.constant(0, tf.int64), trainable=False,
                                               collections=[], use_resource=True,
                                               name="resident_step")
            self._positions = tf.constant(positions)
        self._batch_size, self._batches = schedule.batch_size, schedule.batches_per_epoch
        self.initializer = tf.group(self._step.initializer, *[v.initializer for v in self._vars])

    def feed(self):
        return dict(zip(self._placeholders, self._columns))

    def load_order(self, sess, order):
        """Puts an epoch's row order in place (between steps: the next step takes its first
        batch when the steps so far are a whole number of epochs)."""
        sess.run(self._order.initializer, {self._order_in: order})

    def next_batch(self):
        """-> dense, field ids (a tuple), labels of the next batch's rows of this rank."""
        b = tf.math.floormod(self._step.assign_add(1) - 1, self._batches)
        idx = tf.gather(self._order, b * self._batch_size + self._positions)
        dense, labels, ids = self._vars
        fields = tf.unstack(tf.bitcast(tf.gather(ids, idx, axis=1), tf.float64), axis=0)
        ids = tuple(tf.bitcast(f, tf.int64) for f in fields)
        return tf.gather(dense, idx), ids, tf.gather(labels, idx)


class Graph:
    def __init__(self, args, hvd, dataset=None, resident=None):
        self.graph = tf.Graph()
        with self.graph.as_default():
            tf.compat.v1.set_random_seed(args.seed)
            self.dense = tf.compat.v1.placeholder(
                tf.float32, [None, criteo_data.NUM_DENSE], "dense"
            )
            self.ids = tf.compat.v1.placeholder(tf.int64, [None, criteo_data.NUM_CAT], "ids")
            self.labels = tf.compat.v1.placeholder(tf.float32, [None], "labels")
            self.model = criteo_model.DLRM(
                args.embedding_dim,
                args.num_tables,
                args.bottom_mlp,
                args.top_mlp,
                seed=args.seed,
                embedding_init=args.embedding_init,
            )
            self.input_init = None
            self.resident = None
            if resident is not None:
                self.resident = resident()
                dense, ids, labels = self.resident.next_batch()
            elif dataset is None:
                dense, ids, labels = self.dense, self.ids, self.labels
            else:
                # The iterator of a dataset prefetched to the GPU must live there too: on the CPU
                # (a TF1 graph's default) get_next hands the batch to the host and every step
                # copies it to the GPU again (a CPU transpose of the ids, synchronous copies).
                ds = dataset()
                gpus = tf.config.list_logical_devices("GPU")
                with tf.device(gpus[0].name if gpus else None):
                    it = tf.compat.v1.data.make_initializable_iterator(ds)
                self.input_init = it.initializer
                dense, ids, labels = it.get_next()  # ids: one tensor per field
            logits = self.model(dense, ids, training=True)
            self.loss = tf.reduce_mean(
                tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logits)
            )
            objective = self.loss
            if args.embedding_l2 > 0:
                penalty = tf.add_n(
                    [tf.reduce_sum(tf.square(e), axis=1) for e in self.model.embeddings]
                )
                objective = objective + args.embedding_l2 * tf.reduce_mean(penalty)
            if args.optimizer == "adagrad":
                base = tf.compat.v1.train.AdagradOptimizer(
                    args.learning_rate, args.adagrad_initial_accumulator
                )
            else:
                base = tf.compat.v1.train.AdamOptimizer(args.learning_rate)
            opt = sok.OptimizerWrapper(base)
            # Reported loss: the global batch's mean (equal local batches) under Horovod.
            self.report_loss = self.loss
            if hvd is not None and hvd.size() > 1:
                size = float(hvd.size())
                grads_and_vars = opt.compute_gradients(objective / size)
                grads_and_vars, self.report_loss = _sum_over_ranks(grads_and_vars,
                                                                   self.loss / size)
            else:
                grads_and_vars = opt.compute_gradients(objective)
            self.global_step = tf.compat.v1.train.get_or_create_global_step()
            self.train_op = opt.apply_gradients(grads_and_vars, global_step=self.global_step)
            self.eval_logits = self.model(self.dense, self.ids, training=False)
            self.probability = tf.sigmoid(self.eval_logits, name="probability")
            self.eval_out = [self.eval_logits, self.labels]
            if hvd is not None:
                # SOK's gathers, chained after the eval lookups: Horovod's gather of the labels,
                # free to run before SOK's exchange on one rank and after it on the other, hung
                # both ranks on 2 GPUs (each collective waited for the peer held up by the other).
                self.eval_out = sok.all_gather([self.eval_logits, self.labels], training=False)
            self.init_op = tf.compat.v1.group(
                tf.compat.v1.global_variables_initializer(),
                tf.compat.v1.local_variables_initializer(),
            )
            self.broadcast_op = None
            if hvd is not None:
                _, dense_vars = sok.filter_variables(tf.compat.v1.global_variables())
                self.broadcast_op = hvd.broadcast_variables(dense_vars, root_rank=0)
            self.saver = tf.compat.v1.train.Saver(max_to_keep=1)
            self.table_size = tf.add_n([tf.cast(t.size(), tf.int64) for t in self.model.tables])
            self.num_dense_params = int(
                sum(
                    np.prod(v.shape.as_list())
                    for v in tf.compat.v1.trainable_variables()
                    if not isinstance(v, sok.EmbeddingVariable)
                )
            )

    def feed(self, batch):
        return {self.dense: batch.dense, self.ids: batch.ids, self.labels: batch.labels}

    def save(self, sess, out_dir, rank, size):
        """A Saver checkpoint of every variable (Embedding Variables with their slots included) and,
        in one process, a serving SavedModel (dense [B, 13] float32, ids [B, 26] int64 ->
        probability [B]; its lookups are read-only). Under Horovod each rank writes its own shard
        of the tables (rank{r}-of-{n}); a serving model then needs every shard in one process,
        so none is written and the returned note says so."""
        ckpt_dir = os.path.join(out_dir, "checkpoint")
        if size > 1:
            ckpt_dir = os.path.join(ckpt_dir, f"rank{rank}-of-{size}")
        with self.graph.as_default():
            ckpt = self.saver.save(sess, os.path.join(ckpt_dir, "model.ckpt"))
        if size > 1:
            return ckpt, None, "serving export skipped: the tables are sharded over ranks"
        serving_dir = os.path.join(out_dir, "serving")
        if tf.io.gfile.exists(serving_dir):
            tf.io.gfile.rmtree(serving_dir)
        with self.graph.as_default():
            sig = tf.compat.v1.saved_model.predict_signature_def(
                inputs={"dense": self.dense, "ids": self.ids},
                outputs={"probability": self.probability},
            )
            builder = tf.compat.v1.saved_model.Builder(serving_dir)
            builder.add_meta_graph_and_variables(
                sess,
                [tf.compat.v1.saved_model.tag_constants.SERVING],
                signature_def_map={"serving_default": sig},
                strip_default_attrs=True,
            )
            builder.save()
        return ckpt, serving_dir, None
