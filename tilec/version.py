"""tilec's version (one place: the package, bundles and cache keys read it)."""

__version__ = "0.1.0"
