"""The APIs of NVIDIA SOK 2.x and DeepRec mapped onto the layers below: sok.Variable /
sok.DynamicVariable, tf.get_embedding_variable, DeepRec's feature columns. The top layer; only
the package root (__init__, experiment) imports it."""
