"""The package version: a leaf module (no imports), so that any layer may read it (the compiled mappings cache keys
on it) without importing the package face."""
__version__ = "0.1.0"
