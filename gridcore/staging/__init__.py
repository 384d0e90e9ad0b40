"""Replica catalog and staging transfers (fsspec): atomic, checksummed, measured.

- :class:`ReplicaCatalog` maps a logical file name to its registered replicas and keeps
  the measured transfer rates that refine the grid's bandwidth matrix.
- :func:`stage` copies a file to a site from its fastest source replica and registers
  the copy only once it is complete, verified and published under its final name.
"""

from __future__ import annotations

from gridcore.staging.catalog import (
    RATE_EWMA_WEIGHT,
    ReplicaCatalog,
    check_logical_name,
)
from gridcore.staging.transfer import (
    StagedFile,
    StorageOptions,
    Throttle,
    default_replica_url,
    register_source,
    site_storage_root,
    stage,
    stage_measured,
    sweep_partials,
)

__all__ = [
    "RATE_EWMA_WEIGHT",
    "ReplicaCatalog",
    "StagedFile",
    "StorageOptions",
    "Throttle",
    "check_logical_name",
    "default_replica_url",
    "register_source",
    "site_storage_root",
    "stage",
    "stage_measured",
    "sweep_partials",
]
