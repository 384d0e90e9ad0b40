"""The Grid page's snapshot (gridcore.api.dashboard) against the state database, with the
state made by the real engine on the embedded local sites: selections submitted and run,
a pinned claim, a KOALA job waiting in its placement queue, a co-reservation's pilots, a
data-plan run's job and volume, a site's errors. Every figure of the snapshot is checked
against the rows (or the engines' own views: ``gridcore sites``, the KOALA and VJM
records), and the utilization against the jobs' recorded times."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select, update

from gridcore.api.dashboard import (
    REPORT_STALE_AFTER_S,
    Interval,
    TaskIds,
    TaskRef,
    dataplan_stream,
    read_grid,
    read_task,
    task_job_name,
    utilization,
)
from gridcore.config import default_grid
from gridcore.engine import health
from gridcore.engine.coallocation import CoAllocationEngine
from gridcore.engine.coreservation import CoReservationEngine, CoReservationParams
from gridcore.engine.runtime import GridRuntime, JobRecord
from gridcore.model import (
    CoAllocationRequest,
    Component,
    CoReservationRequest,
    HolderKind,
    JobRequest,
    JobSubmission,
    Priority,
    RequestKind,
)
from gridcore.policies.claiming import CoAllocationParams
from gridcore.policies.placement import PlacementPolicy
from gridcore.state import capacity
from gridcore.state.schema import coalloc_jobs, holds, pilots, selections, sites
from gridcore.state.store import open_store
from tests.capacity_checks import assert_capacity_invariant

# No VJ center listens here: pilots cannot register, so no row changes behind the test.
NO_CENTER = "http://127.0.0.1:9"


@pytest.fixture
def runtime(tmp_path: Path) -> Iterator[GridRuntime]:
    rt = GridRuntime(default_grid(tmp_path), open_store(f"sqlite:///{tmp_path}/s.db", upgrade=True))
    yield rt
    rt.store.dispose()


def run_job(rt: GridRuntime, name: str, processors: int, command: str = "true") -> JobRecord:
    record = rt.select(JobRequest(name, processors, 1.0), stream="ensemble")
    rt.submit(record.selection_id, JobSubmission(name, command, processors))
    deadline = time.time() + 20
    while not record.finished and time.time() < deadline:
        record = rt.poll(record.selection_id)
        time.sleep(0.05)
    assert record.state == "completed", record.as_json()
    return record


def as_json(data: Any) -> Any:
    return json.loads(json.dumps(data))


def live_sums(rt: GridRuntime) -> dict[tuple[str, str, str], int]:
    """(site, kind, ledger) -> processors of the live holds, straight from gc_holds."""
    hc = holds.c
    with rt.store.begin() as conn:
        rows = conn.execute(
            select(hc.site, hc.kind, hc.ledger, func.sum(hc.processors))
            .where(hc.ledger.is_not(None))
            .group_by(hc.site, hc.kind, hc.ledger)
        ).all()
    return {(s, k, ledger): int(n) for s, k, ledger, n in rows}


def test_sites_say_what_the_ledger_and_the_health_rows_say(runtime: GridRuntime) -> None:
    rt = runtime
    run_job(rt, "done-0", 2)
    pinned = rt.select(JobRequest("pinned", 3, 60.0), stream="ensemble", site="local-a")
    queued = rt.select(JobRequest("queued", 4, 60.0), stream="ensemble", site="local-b")
    queued_too = rt.select(JobRequest("queued-2", 4, 60.0), stream="ensemble", site="local-b")
    with rt.store.begin() as conn:
        held = capacity.claim(
            conn, HolderKind.VOLUME, capacity.volume_holder("lfn/x", "local-c"), "local-c", 0, 5000
        )
        health.record_failure(conn, "local-c", "sbatch: connection refused")
    assert held is capacity.Ledger.CLAIMED
    assert (pinned.outcome, queued.outcome, queued_too.outcome) == ("fit", "fit", "queue")

    grid = read_grid(rt.store, time.time())
    by_name = {s["name"]: s for s in grid["sites"]}
    assert sorted(by_name) == ["local-a", "local-b", "local-c"]
    sums = live_sums(rt)
    for row in rt.site_rows():  # the view of `gridcore sites`
        site = by_name[row.name]
        assert (site["total"], site["idle"], site["free"]) == (row.total, row.idle, row.free)
        assert (site["claimed"], site["queued"]) == (row.claimed, row.queued)
        assert site["external_pending"] == row.external_pending
        assert (site["storage_used"], site["storage_limit"]) == (
            row.storage_claimed,
            row.storage_total,
        )
        assert site["holds"] == row.holds
        assert (site["usable"], site["consecutive_errors"], site["last_error"]) == (
            row.usable,
            row.consecutive_errors,
            row.last_error,
        )
        for by, ledger in (("claimed_by_kind", "claimed"), ("queued_by_kind", "queued")):
            expected = {k: n for (s, k, led), n in sums.items() if s == row.name and led == ledger}
            assert site[by] == expected
        assert sum(site["claimed_by_kind"].values()) == site["claimed"]
        assert sum(site["queued_by_kind"].values()) == site["queued"]
    assert by_name["local-a"]["claimed_by_kind"] == {"selection": 3}
    assert by_name["local-b"]["claimed_by_kind"] == {"selection": 4}
    assert by_name["local-b"]["queued_by_kind"] == {"selection": 4}
    assert by_name["local-c"]["storage_used"] == 5000
    assert by_name["local-c"]["holds"] == {"volume": {"holds": 1, "processors": 0, "bytes": 5000}}
    assert "1 consecutive errors" in by_name["local-c"]["health"]
    assert "sbatch: connection refused" in by_name["local-c"]["health"]
    assert by_name["local-a"]["health"] == "usable: no error since its last completed job"
    assert_capacity_invariant(rt.store)


def test_an_unusable_site_says_why_and_how_it_comes_back(runtime: GridRuntime) -> None:
    with runtime.store.begin() as conn:
        for n in range(health.UNUSABLE_AFTER_ERRORS):
            health.record_failure(conn, "local-b", f"job failed ({n})")
    site = next(s for s in read_grid(runtime.store, time.time())["sites"] if s["name"] == "local-b")
    assert site["usable"] is False
    assert site["consecutive_errors"] == site["unusable_after"] == health.UNUSABLE_AFTER_ERRORS
    assert site["health"].startswith("unusable: set aside after 3 consecutive errors")
    assert "job failed (2)" in site["health"] and "probe pending" in site["health"]


def test_koala_jobs_wait_in_their_placement_queues_with_the_engines_reasons(
    runtime: GridRuntime,
) -> None:
    rt = runtime
    # 8 + 4 + 4 needs all three sites; 4 processors of local-b are claimed by a selection
    rt.select(JobRequest("blocker", 4, 60.0), stream="ensemble", site="local-b")
    koala = CoAllocationEngine(
        rt, params=CoAllocationParams(scan_interval_s=1.0), center_url=NO_CENTER
    )
    components = (Component(8), Component(4), Component(4))
    spread = CoAllocationRequest("spread", RequestKind.NON_FIXED, components)
    urgent = CoAllocationRequest(
        "urgent", RequestKind.NON_FIXED, components, priority=Priority.HIGH
    )
    low = koala.submit(spread, PlacementPolicy.WF, "true")
    high = koala.submit(urgent, PlacementPolicy.WF, "true")
    koala.scan()  # one queue is scanned: its job cannot fit and waits
    koala.release_lease()

    queues = read_grid(rt.store, time.time())["koala"]
    assert [j["job_id"] for j in queues["placement"]["high"]] == [high]
    assert [j["job_id"] for j in queues["placement"]["low"]] == [low]
    assert queues["staging"] == queues["claiming"] == []
    with rt.store.begin() as conn:
        rows = {r.id: r for r in conn.execute(select(coalloc_jobs)).all()}
    jobs = [*queues["placement"]["high"], *queues["placement"]["low"]]
    assert sorted(j["placement_tries"] for j in jobs) == [0, 1]
    for job in jobs:
        assert job == as_json(job) and job["state"] == rows[job["job_id"]].state == "queued"
        assert job["placement_tries"] == rows[job["job_id"]].placement_tries
        stored = as_json(koala.status(job["job_id"]).as_json())
        assert {k: job[k] for k in stored} == stored
        assert job["requested"]["components"] == [
            {"size": c.size, "site": None} for c in components
        ]
        if job["placement_tries"]:
            assert job["wait_reason"] == rows[job["job_id"]].message
            assert "placement queue" in job["wait_reason"]
        else:
            assert job["wait_reason"] == "submitted: no placement scan has tried it yet"


def test_pilots_and_their_reservation_are_the_engines_records(runtime: GridRuntime) -> None:
    rt = runtime
    engine = CoReservationEngine(rt, NO_CENTER, CoReservationParams(heartbeat_timeout_s=6.0))
    job_id = engine.submit(CoReservationRequest("reserved", "true", 3, vj_size=1, max_clusters=2))
    try:
        grid = read_grid(rt.store, time.time())
        record = as_json(engine.status(job_id).as_json())
        with rt.store.begin() as conn:
            owned = conn.execute(select(pilots).where(pilots.c.job_id == job_id)).mappings().all()
        sums = live_sums(rt)  # nothing moves them meanwhile: no scan, no center
    finally:
        engine.cancel(job_id)
    [reservation] = grid["reservations"]
    assert {k: reservation[k] for k in record} == record
    assert reservation["state"] == "reserving" and len(reservation["pilots"]) == 3
    assert reservation["reasons"]  # the cluster selection's reasons (Eq. 1)
    assert sorted(p["id"] for p in grid["pilots"]) == sorted(p["id"] for p in owned)
    for pilot in grid["pilots"]:
        row = next(p for p in owned if p["id"] == pilot["id"])
        assert (pilot["site"], pilot["processors"], pilot["state"]) == (
            row["site"],
            row["processors"],
            row["state"],
        )
    for site in grid["sites"]:
        for by, ledger in (("claimed_by_kind", "claimed"), ("queued_by_kind", "queued")):
            assert site[by].get("pilot", 0) == sums.get((site["name"], "pilot", ledger), 0)
    decided = [d for d in grid["decisions"] if d["kind"] == "co-reservation"]
    assert [d["ref"] for d in decided] == [job_id]
    assert decided[0]["reasons"] == reservation["reasons"]


def test_a_data_plan_in_progress_is_its_jobs_and_its_volumes(runtime: GridRuntime) -> None:
    rt = runtime
    stream = dataplan_stream("batch_pipeline", "manual__2026-01-01T00:00:00+00:00")
    run_id = stream.removeprefix("dataplan:")
    job = rt.select(JobRequest("p0/d0", 1, 1.0), stream=stream, site="local-a")
    other = rt.select(JobRequest("p1/d0", 1, 1.0), stream="dataplan:other-run", site="local-a")
    rt.cancel(other.selection_id)  # a finished run with no volumes: not in progress
    with rt.store.begin() as conn:
        name = capacity.volume_holder(f"dataplan/{run_id}/p0/v1", "local-a")
        capacity.claim(conn, HolderKind.VOLUME, name, "local-a", 0, 4096)
        batch = capacity.volume_holder("batch/volume-0", "local-a")  # shared: no run's
        capacity.claim(conn, HolderKind.VOLUME, batch, "local-a", 0, 1000)

    [plan] = read_grid(rt.store, time.time())["dataplans"]
    assert (plan["run_id"], plan["stream"], plan["sites"]) == (run_id, stream, ["local-a"])
    assert [s["selection_id"] for s in plan["selections"]] == [job.selection_id]
    assert plan["jobs"] == {"selected": 1}
    assert [v["holder"] for v in plan["volumes"]] == [name]
    assert plan["volume_bytes"] == 4096

    task = read_task(
        rt.store,
        TaskRef("batch_pipeline", "manual__2026-01-01T00:00:00+00:00", "jobs_0", 1),
        TaskIds(),
        time.time(),
    )
    assert task["dataplan"] == plan


def test_recent_decisions_are_the_stored_ones_with_their_reasons_newest_first(
    runtime: GridRuntime,
) -> None:
    rt = runtime
    made = [rt.select(JobRequest(f"m{i}", 1, 5.0), stream="ensemble") for i in range(4)]
    grid = read_grid(rt.store, time.time(), recent=3)
    decided = grid["decisions"]
    assert [d["ref"] for d in decided] == [r.selection_id for r in reversed(made)][:3]
    for d in decided:
        record = rt.record(d["ref"])
        assert (d["kind"], d["subject"], d["sites"], d["outcome"]) == (
            "selection",
            record.name,
            [record.site],
            record.outcome,
        )
        assert d["reasons"] == list(record.reasons) and d["at"] == record.selected_at


def test_utilization_is_the_processors_of_the_jobs_that_ran(runtime: GridRuntime) -> None:
    rt = runtime
    first = run_job(rt, "u0", 2, "sleep 0.3")
    second = run_job(rt, "u1", 3, "sleep 0.3")
    assert first.started_at is not None and second.started_at is not None
    now = time.time()
    util = read_grid(rt.store, now)["utilization"]
    assert util["end"] == now
    runs = sorted([first, second], key=lambda r: r.started_at or 0.0)
    assert util["start"] == runs[0].started_at
    for name, series in util["sites"].items():
        assert series["total"] == rt.grid.site(name).processors
        expected = utilization(
            [
                Interval(r.site, r.processors, r.started_at or 0.0, r.finished_at or 0.0)
                for r in runs
                if r.site == name
            ],
            {name: series["total"]},
            util["start"],
            now,
        )["sites"][name]["points"]
        assert series["points"] == expected
        assert series["points"][-1] == [now, 0]
    busiest = {n: max(b for _t, b in s["points"]) for n, s in util["sites"].items()}
    for r in runs:
        assert busiest[r.site] >= r.processors


@pytest.mark.parametrize(
    ("intervals", "points"),
    [
        ([], [[0.0, 0], [10.0, 0]]),
        ([Interval("a", 2, 1.0, 3.0)], [[0.0, 0], [1.0, 2], [3.0, 0], [10.0, 0]]),
        (
            [Interval("a", 2, 1.0, 5.0), Interval("a", 3, 2.0, 4.0)],
            [[0.0, 0], [1.0, 2], [2.0, 5], [4.0, 2], [5.0, 0], [10.0, 0]],
        ),
        # running before the window and still at its end; one ending as another starts
        (
            [Interval("a", 4, -5.0, 20.0), Interval("a", 1, 2.0, 6.0), Interval("a", 1, 6.0, 8.0)],
            [[0.0, 4], [2.0, 5], [6.0, 5], [8.0, 4], [10.0, 4]],
        ),
        # other sites and jobs wholly outside the window count nowhere
        ([Interval("b", 1, 1.0, 2.0), Interval("a", 1, -3.0, -1.0)], [[0.0, 0], [10.0, 0]]),
    ],
    ids=["idle", "one job", "overlapping", "carried in and out", "not this site or window"],
)
def test_utilization_steps(intervals: list[Interval], points: list[list[float]]) -> None:
    assert utilization(intervals, {"a": 8}, 0.0, 10.0)["sites"]["a"]["points"] == points


def test_a_task_instance_finds_its_records_by_id_or_by_name(runtime: GridRuntime) -> None:
    rt = runtime
    name = task_job_name("ensemble", "member", 2)
    older = rt.select(JobRequest(name, 1, 5.0), stream="ensemble")
    newer = rt.select(JobRequest(name, 1, 5.0), stream="ensemble")
    rt.select(JobRequest(task_job_name("ensemble", "member", 3), 1, 5.0), stream="ensemble")
    ref = TaskRef("ensemble", "manual__1", "member", 2)

    by_name = read_task(rt.store, ref, TaskIds(), time.time())
    assert by_name["matched_by"] == "name"
    assert [s["selection_id"] for s in by_name["selections"]] == [
        newer.selection_id,
        older.selection_id,
    ]
    with rt.store.begin() as conn:
        hold = capacity.hold(conn, HolderKind.SELECTION, str(newer.selection_id))
    assert hold is not None
    shown = by_name["selections"][0]["hold"]
    assert (shown["site"], shown["processors"], shown["ledger"]) == (
        hold.site,
        hold.processors,
        hold.ledger.value if hold.ledger else None,
    )
    assert by_name["coallocations"] == by_name["reservations"] == []
    assert by_name["dataplan"] is None

    by_id = read_task(rt.store, ref, TaskIds(selections=(older.selection_id,)), time.time())
    assert by_id["matched_by"] == "task state store"
    assert [s["selection_id"] for s in by_id["selections"]] == [older.selection_id]
    with rt.store.begin() as conn:
        row = conn.execute(select(selections).where(selections.c.id == older.selection_id)).one()
    assert by_id["selections"][0]["reasons"] == json.loads(row.reasons)


@pytest.mark.parametrize(
    ("dag_id", "task_id", "map_index", "name"),
    [
        ("ensemble", "member", -1, "ensemble.member"),
        ("ensemble", "member", 0, "ensemble.member.0"),
        ("my dag", "t/1", 7, "my_dag.t_1.7"),
        ("d" * 150, "t" * 100, 12, ("d" * 150 + "." + "t" * 100 + ".12")[:200]),
    ],
)
def test_task_job_name(dag_id: str, task_id: str, map_index: int, name: str) -> None:
    assert task_job_name(dag_id, task_id, map_index) == name


@pytest.mark.parametrize(
    ("age_s", "state"),
    [
        (None, "never"),  # a new row: its idle count is the grid file's size
        (0.0, "current"),
        (REPORT_STALE_AFTER_S, "current"),
        (REPORT_STALE_AFTER_S + 1, "stale"),
        (120.0, "stale"),
    ],
)
def test_each_report_says_how_old_it_is(
    runtime: GridRuntime, age_s: float | None, state: str
) -> None:
    now = 1_800_000_000.0
    observed = 0.0 if age_s is None else now - age_s
    with runtime.store.begin() as conn:
        conn.execute(update(sites).where(sites.c.name == "local-b").values(observed_at=observed))
    site = next(s for s in read_grid(runtime.store, now)["sites"] if s["name"] == "local-b")
    assert (site["report_state"], site["report_age_s"]) == (state, age_s)
    assert site["observed_at"] == observed
