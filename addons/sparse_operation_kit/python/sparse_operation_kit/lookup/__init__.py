"""The fused pooled lookup (sok.lookup_sparse and its gradients) and DeepRec's
group_embedding_lookup_sparse on top of it. Imports parallel and the layers below."""
