"""The package's version (pyproject.toml's), importable without anything else."""

__version__ = "0.1.0"
