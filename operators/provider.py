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
                    "gridcore_airflow.operators.site_job",
                    "gridcore_airflow.operators.select_sites",
                    "gridcore_airflow.operators.stage_files",
                    "gridcore_airflow.operators.coallocation",
                    "gridcore_airflow.operators.coreservation",
                ],
            }
        ],
        "sensors": [
            {
                "integration-name": _INTEGRATION,
                "python-modules": ["gridcore_airflow.sensors.site_job"],
            }
        ],
        "triggers": [
            {
                "integration-name": _INTEGRATION,
                "python-modules": ["gridcore_airflow.sensors.triggers"],
            }
        ],
        "hooks": [
            {
                "integration-name": _INTEGRATION,
                "python-modules": ["gridcore_airflow.operators.hooks"],
            }
        ],
        "connection-types": [
            {
                "connection-type": "gridcore",
                "hook-class-name": "gridcore_airflow.operators.hooks.GridcoreHook",
                "hook-name": "gridcore grid",
            },
            {
                "connection-type": "gridcore_slurm",
                "hook-class-name": "gridcore_airflow.operators.hooks.GridcoreSlurmHook",
                "hook-name": "gridcore Slurm site",
            },
        ],
    }


def _installed_version() -> str:
    try:
        return version("gridcore")
    except PackageNotFoundError:  # running from a source tree that is not installed
        return "0.0.0"
