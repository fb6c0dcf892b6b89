"""Keras layers over SOK tables (sok.layers, sok.Embedding, sok.SparseEmbedding). Imports
optimizers (gradient carriers), lookup and the layers below."""
