"""Sparse updates of SOK tables: sok.OptimizerWrapper and sok.SGD (fused kernels), the
generic path for any other optimizer, optimizer slots, static-table staging on the CPU, and the
Keras glue (gradient carriers, the Keras optimizer classes). Imports lookup and the layers
below (in practice runtime and tables)."""
