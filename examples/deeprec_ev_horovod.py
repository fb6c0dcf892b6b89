# DeepRec's "Embedding Variable SparseOperationKit Support" user example, Horovod lines kept, on
# stock TensorFlow: tf.get_embedding_variable -> sok.get_embedding_variable, the optimizer wrapped
# in sok.OptimizerWrapper, TF1 graph mode switched on, the Session's ConfigProto given the rank's
# GPU (a ConfigProto overrides tf.config's visible devices). Run it on N GPUs or CPUs with
#     horovodrun -np N -H localhost:N python examples/deeprec_ev_horovod.py
import horovod.tensorflow as hvd
import tensorflow.compat.v1 as tf

from sparse_operation_kit import experiment as sok

tf.disable_eager_execution()

# 1. init horovod and sok
hvd.init()
gpus = tf.config.experimental.list_physical_devices("GPU")
for gpu in gpus:
    tf.config.experimental.set_memory_growth(gpu, True)
if gpus:
    tf.config.experimental.set_visible_devices(gpus[hvd.local_rank()], "GPU")
sok.init()

var = sok.get_embedding_variable("var_0",
                                 embedding_dim=3,
                                 initializer=tf.ones_initializer(tf.float32))
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
loss = hvd.allreduce(loss, op=hvd.Sum)

init = tf.global_variables_initializer()

sess_config = tf.ConfigProto(allow_soft_placement=True, log_device_placement=False)
# A Session given its own ConfigProto does not see tf.config's visible devices: the same GPU here.
sess_config.gpu_options.visible_device_list = ",".join(
    d.name.rsplit(":", 1)[1] for d in tf.config.experimental.get_visible_devices("GPU"))
with tf.Session(config=sess_config) as sess:
    sess.run([init])
    print(sess.run([emb, train_op, loss]))
    print(sess.run([emb, train_op, loss]))
    print(sess.run([emb, train_op, loss]))
