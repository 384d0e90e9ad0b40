"""One silent site costs one timeout per scan, not one per job (issue 21 item 19).

A KOALA scan observes every site once, then claims each due job; claiming looked at
every site again for each job, so a site that does not answer (each look a timeout)
was waited on once per job: 24 two-site jobs took about 79 s to place and claim with
one slurmrestd silent. Here the silent site counts its looks; the jobs do not use it.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from gridcore.config import default_grid
from gridcore.engine.coallocation import CoAllocationEngine, JobPhase
from gridcore.engine.runtime import GridRuntime
from gridcore.errors import SiteUnavailable
from gridcore.model import CoAllocationRequest, Component, RequestKind, SiteObservation
from gridcore.policies.claiming import CoAllocationParams
from gridcore.policies.placement import PlacementPolicy
from gridcore.state.store import open_store
from tests.fakes import FakeSite

JOBS = 3


class SilentSite(FakeSite):
    """A site whose every observation times out; counts them."""

    looks = 0

    def observe(self) -> SiteObservation:
        self.looks += 1
        raise SiteUnavailable(self.spec.name, "GET /jobs: no answer within 1.5 s")


@pytest.fixture
def runtime(tmp_path: Path) -> Iterator[GridRuntime]:
    grid = default_grid(tmp_path)
    fakes = {s.name: (SilentSite(s) if s.name == "local-c" else FakeSite(s)) for s in grid.sites}
    store = open_store(f"sqlite:///{tmp_path}/state.db", upgrade=True)
    yield GridRuntime(grid, store, adapters=fakes)
    store.dispose()


def test_a_silent_site_is_looked_at_once_per_scan_however_many_jobs_claim(
    runtime: GridRuntime,
) -> None:
    engine = CoAllocationEngine(
        runtime,
        params=CoAllocationParams(scan_interval_s=1.0),
        holder="koala",
        center_url="http://127.0.0.1:9",
        renew_lease=False,
    )
    two_sites = CoAllocationRequest(
        "pair", RequestKind.FIXED, (Component(1, "local-a"), Component(1, "local-b"))
    )
    jobs = [
        engine.submit(replace(two_sites, name=f"pair{i}"), PlacementPolicy.WF, "true")
        for i in range(JOBS)
    ]
    silent = runtime.adapter("local-c")
    assert isinstance(silent, SilentSite)

    engine.scan()

    assert [engine.status(j).state for j in jobs] == [JobPhase.RUNNING.value] * JOBS
    assert silent.looks == 1  # not 1 + one per job claimed
