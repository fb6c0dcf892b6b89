# DeepRec's "Embedding Variable SparseOperationKit Support" user example, ported to SOK on stock
# TensorFlow with only these changes: `import tensorflow.compat.v1 as tf`,
# tf.get_embedding_variable -> sok.get_embedding_variable, the optimizer wrapped in
# sok.OptimizerWrapper, and the Horovod lines removed. It is TF1 code: run it in graph mode
# (as DeepRec does), e.g. after tf.compat.v1.disable_eager_execution().
import tensorflow.compat.v1 as tf

from sparse_operation_kit import experiment as sok

# 1. init horovod and sok
gpus = tf.config.experimental.list_physical_devices("GPU")
for gpu in gpus:
    tf.config.experimental.set_memory_growth(gpu, True)
sok.init()

var = sok.get_embedding_variable("var_0",
                                 embedding_dim=3,
                                 initializer=tf.ones_initializer(tf.float32),
                                 partitioner=tf.fixed_size_partitioner(num_shards=4))
# 2. set target_gpu for Embedding Variable
var.target_gpu = -1

indices = tf.SparseTensor(
    indices=tf.convert_to_tensor([[0, 0], [0, 1], [1, 0], [1, 1], [1, 2]], dtype=tf.int64),
    values=tf.convert_to_tensor([1, 1, 3, 4, 5], dtype=tf.int64),
    dense_shape=[2, 3])
# 3. Use sok lookup_sparse
emb = sok.lookup_sparse([var], [indices], combiners=['sum'])
fun = tf.multiply(emb, 2.0, name='multiply')
loss = tf.reduce_sum(fun, name='reduce_sum')
opt = sok.OptimizerWrapper(tf.train.AdagradOptimizer(0.1))

g_v = opt.compute_gradients(loss)
train_op = opt.apply_gradients(g_v)

init = tf.global_variables_initializer()

sess_config = tf.ConfigProto(allow_soft_placement=True, log_device_placement=False)
with tf.Session(config=sess_config) as sess:
    sess.run([init])
    print(sess.run([emb, train_op, loss]))
    print(sess.run([emb, train_op, loss]))
    print(sess.run([emb, train_op, loss]))
