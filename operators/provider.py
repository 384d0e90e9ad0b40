"""Airflow provider metadata (entry point ``apache_airflow_provider``)."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version
from typing import Any

_INTEGRATION = "gridcore"


def get_provider_info() -> dict[str, Any]:
    return {
        "package-name": "gridcore",
        "name": "gridcore",
        "description": (
            "Grid co-allocation and stateful site selection across local process pools "
            "and Slurm clusters."
        ),
        "versions": [_installed_version()],
        "integrations": [
            {"integration-name": _INTEGRATION, "tags": ["compute"]},
        ],
        "operators": [
            {
                "integration-name": _INTEGRATION,
                "python-modules": [
                    "operators.site_job",
                    "operators.select_sites",
                    "operators.stage_files",
                    "operators.coallocate",
                    "operators.coreserve",
                ],
            }
        ],
        "sensors": [{"integration-name": _INTEGRATION, "python-modules": ["sensors.site_job"]}],
        "triggers": [
            {
                "integration-name": _INTEGRATION,
                "python-modules": [
                    "sensors.triggers",
                    "sensors.coalloc_trigger",
                    "sensors.coreserve_trigger",
                ],
            }
        ],
        "hooks": [{"integration-name": _INTEGRATION, "python-modules": ["operators.hooks"]}],
        "connection-types": [
            {
                "connection-type": "gridcore",
                "hook-class-name": "operators.hooks.GridcoreHook",
                "hook-name": "gridcore grid",
            },
            {
                "connection-type": "gridcore_slurm",
                "hook-class-name": "operators.hooks.GridcoreSlurmHook",
                "hook-name": "gridcore Slurm site",
            },
        ],
    }


def _installed_version() -> str:
    try:
        return version("gridcore")
    except PackageNotFoundError:  # running from a source tree that is not installed
        return "0.0.0"
