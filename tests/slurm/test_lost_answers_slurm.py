"""Lost submit answers on the real Slurm grid (issue 21 items 16 and 17).

Each cluster's slurmrestd sits behind :class:`tests.lossy_slurmrestd.LossySlurmrestd`,
which carries out a submission and then resets the connection, answers after the
client's timeout, or loses the request itself, by a fixed schedule. Ensemble members
run through ``SiteJobOperator`` (waiting in the worker), each retried as Airflow
would (a try that raises a retriable error runs again on the same task state store;
a try that fails for good is not retried). Afterwards, from slurmrestd's own listing
(no gridcore code): one Slurm job per member, every one completed, no job of ours
without a member, no member failed for good, nothing left claimed.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
from airflow.sdk.exceptions import AirflowException, AirflowFailException

from gridcore.engine import health
from gridcore.engine.submission import install_id
from gridcore.sites.keys import install_prefix
from gridcore.state.store import open_store
from gridcore_airflow.operators.site_job import SiteJobOperator
from tests.capacity_checks import assert_capacity_invariant
from tests.fakes import FakeTaskStateStore
from tests.lossy_slurmrestd import LossySlurmrestd
from tests.slurmgrid import SlurmGrid

pytestmark = pytest.mark.slurm

MEMBERS = 6
TRIES = 3  # the task's retries + 1
TIMEOUT_S = 3.0  # the client's; the proxy answers "late" well after it
LATE_S = 6.0
SCHEDULES = {
    "reset-then-late": ["reset", "late", "ok", "reset", "ok", "late", "reset", "late", "ok"],
    "late-then-drop": ["late", "drop", "reset", "ok", "late", "drop", "ok", "reset", "ok"],
}


@pytest.fixture
def lossy_grid(
    slurm_grid: SlurmGrid, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, request: Any
) -> Iterator[tuple[Path, list[LossySlurmrestd]]]:
    """The session grid's file with every cluster's URL behind its own lossy proxy."""
    for name, value in slurm_grid.env.items():
        monkeypatch.setenv(name, value)
    text = slurm_grid.grid_toml.read_text()
    with ExitStack() as stack:
        proxies = []
        for cluster in slurm_grid.clusters:
            proxy = stack.enter_context(
                LossySlurmrestd(cluster.rest_url, SCHEDULES[request.param], LATE_S)
            )
            proxies.append(proxy)
            text = text.replace(
                f'url = "{cluster.rest_url}"',
                f'url = "{proxy.url}"\ntimeout_s = {TIMEOUT_S}',
            )
        assert text.count("timeout_s") == len(slurm_grid.clusters)
        grid_file = tmp_path / "lossy-grid.toml"
        grid_file.write_text(text)
        yield grid_file, proxies


def _run_member(index: int, grid_file: Path, db_url: str) -> list[str]:
    """One member's tries, as Airflow's retries run them; what each try ended with."""
    state = FakeTaskStateStore()
    ended: list[str] = []
    for _ in range(TRIES):
        op = SiteJobOperator(
            task_id=f"member_{index}",
            command="sleep 1",
            processors=2,
            runtime_s=2,
            grid_file=str(grid_file),
            db_url=db_url,
            deferrable=False,
            poll_interval=0.5,
        )
        try:
            result = op.execute(context={"task_state_store": state})
        except AirflowFailException as exc:
            return [*ended, f"failed for good: {exc}"]
        except AirflowException as exc:
            ended.append(f"retriable: {exc}")
            continue
        return [*ended, f"{result['state']} job {result['job_id']} on {result['site']}"]
    return ended


@pytest.mark.parametrize("lossy_grid", sorted(SCHEDULES), indirect=True)
def test_lost_submit_answers_leave_one_job_per_member_and_nothing_claimed(
    slurm_grid: SlurmGrid, lossy_grid: tuple[Path, list[LossySlurmrestd]], tmp_path: Path
) -> None:
    grid_file, proxies = lossy_grid
    db_url = f"sqlite:///{tmp_path / 'state.db'}"
    open_store(db_url, upgrade=True).dispose()

    with ThreadPoolExecutor(MEMBERS) as pool:
        tries = list(pool.map(lambda i: _run_member(i, grid_file, db_url), range(MEMBERS)))

    faults = [f for proxy in proxies for f in proxy.faults]
    assert {"reset", "late"} & set(faults), faults  # the schedule was met, not dodged
    for index, ended in enumerate(tries):
        assert ended and ended[-1].startswith("completed job "), (index, ended, faults)

    store = open_store(db_url)
    try:
        with store.begin() as conn:
            prefix = install_prefix(install_id(conn))
            healths = health.read_health(conn)
    finally:
        store.dispose()
    ours: dict[str, list[tuple[str, str]]] = {}
    for cluster in slurm_grid.clusters:
        jobs = cluster.rest("GET", "jobs", timeout=15).json()["jobs"]
        for job in jobs:
            if str(job.get("comment") or "").startswith(prefix):
                state = job["job_state"]
                state = state[0] if isinstance(state, list) else state
                ours.setdefault(job["name"], []).append((cluster.name, str(state)))
    names = sorted(ours)
    assert len(names) == MEMBERS, ours  # no job of ours without a member
    for name in names:
        assert re.search(r"member_\d$", name), name
        assert ours[name] in ([(c.name, "COMPLETED")] for c in slurm_grid.clusters), (
            name,
            ours[name],
            tries,
        )  # one job per member, run once, to the end
    assert all(h.usable for h in healths.values()), healths  # lost answers are no errors
    assert_capacity_invariant(db_url, no_live_holds=True)
