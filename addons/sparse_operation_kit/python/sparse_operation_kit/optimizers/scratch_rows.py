"""The step both scratch paths share (generic_optimizer for Embedding Variables, static_staging
for static tables): a sparse gradient's distinct rows, their gradients summed (as tf.compat.v1
optimizers sum repeated ids), checked against the scratch's capacity."""
import tensorflow as tf


class TouchedRows:
    """unique: the distinct rows; n: how many; summed: [n, dim] gradients; padding: what pads
    n rows to the scratch's `capacity` (tf.pad); check: the capacity assertion, which the
    gradient and paddings depend on."""

    def __init__(self, rows, values, dim, capacity, table_name, scratch_of):
        self.unique, position = tf.unique(tf.reshape(rows, [-1]))
        self.n = tf.size(self.unique)
        self.check = tf.debugging.assert_less_equal(
            self.n, capacity,
            message=f"sok.OptimizerWrapper: a step touches more rows of table '{table_name}' than "
            f"the {scratch_of} holds (max_touched_rows={capacity}); pass a larger "
            "max_touched_rows")
        with tf.control_dependencies([self.check]):
            self.summed = tf.math.unsorted_segment_sum(
                tf.reshape(tf.cast(values, tf.float32), [-1, dim]), position, self.n)
            self.padding = [[0, capacity - self.n], [0, 0]]
