"""`from sparse_operation_kit import experiment as sok` (NVIDIA SOK 2.x's import path)."""
from sparse_operation_kit import *  # noqa: F401,F403
from sparse_operation_kit import __all__  # noqa: F401
