"""The package version: read by __init__.py and tools/pip_package/setup.py (one place)."""
__version__ = "0.1.0"
