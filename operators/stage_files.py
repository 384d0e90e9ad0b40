"""Stage logical files to a grid site before the jobs that read them.

The operator is thin: validate the site and every file name against the grid and the
replica catalog, then :func:`gridcore.staging.stage_measured` each file; the result is
plain JSON for XCom.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from airflow.sdk import Context
from airflow.sdk.exceptions import AirflowException, AirflowFailException

from gridcore.engine.runtime import GridRuntime
from gridcore.errors import ConfigError, GridError, RequestError
from gridcore.staging import ReplicaCatalog, StagedFile, stage_measured
from gridcore_airflow.operators.base import GridcoreOperator


class StageFilesOperator(GridcoreOperator):
    """Make ``logical_names`` available at grid site ``site``.

    Each file is copied from its replica with the smallest estimated transfer time
    (measured rates, else the grid's bandwidth matrix), published atomically and
    checksum-verified, and registered as a replica at ``site``; files already registered
    there are skipped.

    :param logical_names: logical file names (templated); each must have a registered
        replica (``gridcore.staging.register_source``).
    :param site: the destination grid site (templated).
    :param storage_options: fsspec arguments by protocol for remote storage, e.g.
        ``{"sftp": {"key_filename": "/keys/id_ed25519"}}``.

    ``grid_file``, ``db_url`` and ``gridcore_conn_id`` say where gridcore is
    (:class:`~operators.base.GridcoreOperator`).

    Returns (XCom) ``{"site", "replicas": [{"logical_name", "url", "size_bytes",
    "checksum", "seconds", "mbps", "source", "skipped"}]}``; ``source`` is the site the
    file came from (null and ``skipped`` true when it was already there, ``mbps`` null).

    A bad site or file name fails the task (no retry) before any transfer; a failed
    transfer registers nothing and fails the try (retried). Files staged by an earlier
    try stay registered, so a retry skips them.
    """

    template_fields: Sequence[str] = ("logical_names", "site")
    ui_color = "#fce5cd"

    def __init__(
        self,
        *,
        logical_names: list[str],
        site: str,
        storage_options: Mapping[str, Mapping[str, Any]] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.logical_names = logical_names
        self.site = site
        self.storage_options = storage_options

    def execute(self, context: Context) -> dict[str, Any]:
        names = _names(self.logical_names)
        try:
            with self.hook().catalog() as (runtime, catalog):
                runtime.grid.site(str(self.site))
                for name in names:
                    catalog.require(name)
                staged = [self._stage(catalog, runtime, name) for name in names]
        except GridError as exc:
            raise _airflow_error(exc) from exc
        return {"site": self.site, "replicas": [_result(s) for s in staged]}

    def _stage(self, catalog: ReplicaCatalog, runtime: GridRuntime, name: str) -> StagedFile:
        staged = stage_measured(
            catalog, runtime.grid, name, str(self.site), storage_options=self.storage_options
        )
        if staged.skipped:
            self.log.info("%s: already at site %s (%s)", name, self.site, staged.replica.url)
        else:
            self.log.info(
                "%s: staged from site %s to %s, %d bytes in %.2f s (%.1f MB/s; estimated %.2f s)",
                name,
                staged.source.site if staged.source else "?",
                staged.replica.url,
                staged.replica.size_bytes,
                staged.seconds,
                staged.mbps or 0.0,
                staged.estimated_s,
            )
        return staged


def _names(value: Any) -> list[str]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, Sequence) or not value:
        raise AirflowFailException(f"logical_names: must be a non-empty list, got {value!r}")
    names = [str(v) for v in value]
    if len(set(names)) != len(names):
        raise AirflowFailException(f"logical_names: listed more than once in {names}")
    return names


def _airflow_error(exc: GridError) -> AirflowException:
    """Bad input (unknown site or file, malformed grid) fails without retries; anything
    else (a transfer, the state DB) may be retried."""
    if isinstance(exc, ConfigError | RequestError):
        return AirflowFailException(str(exc))
    return AirflowException(str(exc))


def _result(staged: StagedFile) -> dict[str, Any]:
    replica = staged.replica
    return {
        "logical_name": replica.logical_name,
        "url": replica.url,
        "size_bytes": replica.size_bytes,
        "checksum": replica.checksum,
        "seconds": staged.seconds,
        "mbps": staged.mbps,
        "source": None if staged.source is None else staged.source.site,
        "skipped": staged.skipped,
    }
