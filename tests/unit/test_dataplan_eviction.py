"""Eviction deletes only inside the site's storage (issue 21 item 14): whatever the
replica catalog says a volume's file is, a data plan's runner deletes nothing outside
the storage of its site, symbolic links resolved; it logs the refusal and still forgets
the replica and gives its bytes back. No job runs here: volumes are staged and evicted
on a real local site's storage, through a real SQLite state database."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from gridcore.engine.dataplan import DataPlanRunner, PipelineRun, runtime_factory
from gridcore.model import ORIGIN
from gridcore.policies.dataplan import Strategy
from gridcore.staging import register_source
from gridcore.state import capacity
from tests.dataplan_live import SITE, LiveSetup, setup

BATCH = "live/batch0"
SECRET = b"not the plan's to delete\n"


@pytest.fixture
def live(tmp_path: Path) -> Iterator[LiveSetup]:
    found = setup(tmp_path, W=1, D=1)
    try:
        yield found
    finally:
        found.store.dispose()


def _runner(live: LiveSetup) -> DataPlanRunner:
    run = PipelineRun("r1", live.spec, SITE, Strategy.ALL, (), str(live.base / "home"))
    return DataPlanRunner(live.grid, runtime_factory(live.grid, live.store), run)


def _outside(live: LiveSetup) -> Path:
    """A file beside the site's storage, as /etc/shadow is beside a real one."""
    secret = live.base / "elsewhere" / BATCH
    secret.parent.mkdir(parents=True, exist_ok=True)
    secret.write_bytes(SECRET)
    return secret


def _registered_outside(live: LiveSetup, runner: DataPlanRunner) -> Path:
    # a replica at the site whose file is not in the site's storage at all
    secret = _outside(live)
    register_source(live.catalog, BATCH, SITE, str(secret))
    return secret


def _link_in_storage(live: LiveSetup, runner: DataPlanRunner) -> Path:
    # the staged file replaced by a link leading out of the storage
    runner.fetch_batch(0)
    staged = Path(_staged_url(live))
    secret = _outside(live)
    staged.unlink()
    staged.symlink_to(secret)
    return secret


def _linked_directory(live: LiveSetup, runner: DataPlanRunner) -> Path:
    # the storage's replicas directory is a link to another directory: the file's path
    # is inside the storage as written, its directory entry is not
    secret = _outside(live)
    replicas = runner.root / "replicas"
    replicas.parent.mkdir(parents=True, exist_ok=True)
    replicas.symlink_to(live.base / "elsewhere")
    register_source(live.catalog, BATCH, SITE, str(replicas / BATCH))
    return secret


def _staged_url(live: LiveSetup) -> str:
    replica = live.catalog.replica(BATCH, SITE)
    assert replica is not None
    return replica.url


@pytest.mark.parametrize(
    "plant",
    [_registered_outside, _link_in_storage, _linked_directory],
    ids=["replica registered outside", "link leading out", "directory linked out"],
)
def test_eviction_deletes_nothing_outside_the_sites_storage(
    live: LiveSetup,
    caplog: pytest.LogCaptureFixture,
    plant: Callable[[LiveSetup, DataPlanRunner], Path],
) -> None:
    runner = _runner(live)
    secret = plant(live, runner)
    with caplog.at_level(logging.ERROR, logger="gridcore.engine.dataplan"):
        runner.evict_batch(0)
    assert secret.read_bytes() == SECRET
    refusals = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(refusals) == 1 and refusals[0].startswith("not deleting "), refusals
    assert f"outside the storage of site {SITE} ({runner.root})" in refusals[0]
    # the replica is forgotten and its bytes given back all the same
    assert live.catalog.replica(BATCH, SITE) is None
    with live.store.begin() as conn:
        assert capacity.usage(conn)[SITE].storage_claimed == 0
        assert capacity.check_invariant(conn) == []


def test_eviction_deletes_the_staged_file_inside_the_storage(
    live: LiveSetup, caplog: pytest.LogCaptureFixture
) -> None:
    # the check refuses only what is outside: a staged volume is deleted as before
    runner = _runner(live)
    runner.fetch_batch(0)
    staged = Path(_staged_url(live))
    assert staged.is_file() and staged.is_relative_to(runner.root)
    with caplog.at_level(logging.ERROR, logger="gridcore.engine.dataplan"):
        runner.evict_batch(0)
    assert not staged.exists() and caplog.records == []
    assert live.catalog.replica(BATCH, SITE) is None
    # the origin's file, which the volume was staged from, is never touched
    origin = live.catalog.replica(BATCH, ORIGIN)
    assert origin is not None and os.path.isfile(origin.url)
