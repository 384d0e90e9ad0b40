"""gridcore: co-allocation and data-driven scheduling across compute sites."""

__version__ = "0.1.0"
