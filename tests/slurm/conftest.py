"""The real three-cluster Slurm grid, started once per test session.

Each cluster runs another Slurm release (``tests/slurmgrid.py`` ``DEFAULT_LAYOUT``):
alpha 26.05 and gamma 24.11 from Debian chroots built by ``tests/slurm_releases.py``
outside the clone (``make test`` starts that build in the background; starting the grid
waits for it on its lock, or builds a missing chroot itself), beta the host's 22.05.
Until the adapter speaks every REST version, tests that use ``SlurmSite`` against alpha
or gamma fail for that reason; the grid itself is checked with each cluster's own CLI
(``cluster.cli``) and raw REST (``cluster.rest``) in ``test_slurm_releases.py``.

alpha also has Slurm accounting (slurmdbd, a MariaDB database per run;
``SlurmCluster.accounting``), tested in ``test_slurm_accounting.py``.

If the grid cannot start, the tests skip -- except on CI (``CI=true``), where a missing
grid is a broken environment and must fail loudly instead of passing vacuously.

Network layout (``tests/slurmgrid.py``): ``$GRIDCORE_SLURM_NETWORK`` if set, else
``SESSION_NETWORK`` below. On CI an "auto" becomes "netns": namespaces that cannot be
made fail the tier with the reason instead of quietly falling back to loopback.
``test_slurm_grid_network.py`` starts a namespaced grid of its own whenever the session
grid is not namespaced (and fails on CI if it cannot).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from gridcore.errors import GridError
from gridcore.model import CredentialRef, SiteKind, SiteSpec
from gridcore.sites.slurm import SlurmSite
from tests.slurmgrid import NETWORK_ENV, SlurmCluster, SlurmGrid, start_grid, stop_grid

# Each cluster in its own network namespace (CI: must be; elsewhere: if it can be).
# Pilots and co-allocation barriers reach the VJ center and each other over the veths.
SESSION_NETWORK = "auto"


def session_network() -> str:
    wanted = os.environ.get(NETWORK_ENV) or SESSION_NETWORK
    if wanted == "auto" and os.environ.get("CI") == "true":
        return "netns"
    return wanted


@pytest.fixture(scope="session")
def slurm_grid() -> Iterator[SlurmGrid]:
    # Not tmp_path_factory: its 0700 directories keep out slurmrestd, which runs as nobody.
    base = Path(tempfile.mkdtemp(prefix="gridcore-slurm-"))
    try:
        grid = start_grid(base, network=session_network())
    except (GridError, OSError, subprocess.SubprocessError) as exc:
        shutil.rmtree(base, ignore_errors=True)
        reason = f"cannot start the Slurm test grid: {exc}"
        if os.environ.get("CI") == "true":
            pytest.fail(reason)
        pytest.skip(reason)
    try:
        yield grid
    finally:
        stop_grid(grid)
        shutil.rmtree(base, ignore_errors=True)


def site_spec(cluster: SlurmCluster) -> SiteSpec:
    """The SiteSpec the grid TOML describes for ``cluster``."""
    return SiteSpec(
        name=cluster.name,
        kind=SiteKind.SLURM,
        processors=cluster.cpus,
        url=cluster.rest_url,
        partition="debug",
        user="root",
        token=CredentialRef(env=cluster.token_env),
        storage_dir=str(cluster.storage_dir),
        timeout_s=15.0,
    )


@pytest.fixture(scope="session")
def slurm_sites(slurm_grid: SlurmGrid) -> Iterator[dict[str, SlurmSite]]:
    sites = {c.name: SlurmSite(site_spec(c), c.token) for c in slurm_grid.clusters}
    try:
        yield sites
    finally:
        for site in sites.values():
            site.close()
