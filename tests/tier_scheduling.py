"""Which tests run together on one pytest-xdist worker (``make test`` runs ``-n``).

A tier whose tests share one service started per session, the Slurm grid
(``tests/slurm/conftest.py``) or the deployment (``tests/deployment/conftest.py``), runs
whole on one worker: the service is started once, and never twice side by side (two
grids or two deployments at once would double their start-up and load the two cores
the timeouts were measured on). Every other test is its own unit and may run beside
anything: what it touches is its own (``tmp_path``, a free port, a database, schema or
Redis database with a random name, its worker's Airflow home and metadata DB).

The groups are found by path, in the scheduler, rather than by ``xdist_group`` marks:
xdist 3.8 passes a mark to the controller by rewriting ``item._nodeid``, which pytest
9.2 no longer reads (pytest-xdist issue #1386), so marked tests were spread over every
worker.
"""

from __future__ import annotations

from xdist.scheduler import LoadGroupScheduling

SERIAL_TIERS = ("slurm", "deployment")
"""Folders under tests/ whose tests run on one worker, each tier as one group."""


class TierScheduling(LoadGroupScheduling):
    """``--dist loadgroup`` with each of :data:`SERIAL_TIERS` as one group.

    xdist hands out the largest groups first, so the Slurm tier and the deployment start
    at once on two workers while the other workers take the remaining tests one by one.
    """

    def _split_scope(self, nodeid: str) -> str:
        return serial_tier(nodeid) or super()._split_scope(nodeid)


def serial_tier(nodeid: str) -> str | None:
    """The serial tier of a node id relative to the repository (``tests/slurm/...``)."""
    parts = nodeid.split("::", 1)[0].split("/")
    if len(parts) > 2 and parts[0] == "tests" and parts[1] in SERIAL_TIERS:
        return parts[1]
    return None
