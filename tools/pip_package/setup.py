"""Wheel of sparse_operation_kit: the Python package plus the compiled ops library."""
import os
import runpy

from setuptools import find_packages, setup
from setuptools.dist import Distribution

# The one version constant, read without importing the package (that would import TensorFlow).
_HERE = os.path.dirname(os.path.abspath(__file__))
VERSION = runpy.run_path(os.path.join(_HERE, "sparse_operation_kit", "runtime", "version.py"))[
    "__version__"
]


class BinaryDistribution(Distribution):
    """The wheel carries a compiled library, so it is platform-specific."""

    def has_ext_modules(self):
        return True


setup(
    name="sparse_operation_kit",
    version=VERSION,
    description="Embedding Variables, fused sparse lookups and sparse optimizers for TensorFlow",
    # The package and its subpackages (runtime, tables, lookup, ...); the ops library sits at the
    # package root, where runtime/_ops.py looks for it.
    packages=find_packages(include=["sparse_operation_kit", "sparse_operation_kit.*"]),
    package_data={"sparse_operation_kit": ["_sparse_operation_kit_ops.so"]},
    # TensorFlow is not pinned here (tensorflow and tensorflow-cpu both satisfy it); the package
    # checks at import that it runs on the TensorFlow release it was built against.
    python_requires=">=3.11",
    distclass=BinaryDistribution,
    zip_safe=False,
)
