"""VJM co-reservation live on the embedded local sites (real subprocess pools, SQLite,
the real VJ center on uvicorn, real pilot processes): dispatch, lost pilots and their
substitutes, cancel, and deadlocks built live and resolved (or not) by reorganization."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select, update

from gridcore.api.server import RunningCenter, start_in_thread
from gridcore.config import default_grid
from gridcore.engine import coreservation
from gridcore.engine.coreservation import CoReservationEngine, CoReservationParams
from gridcore.engine.coreservation_records import ReservationRecord
from gridcore.engine.phases import PilotState, ReservationPhase
from gridcore.engine.runtime import GridRuntime
from gridcore.errors import RequestError
from gridcore.model import CoReservationRequest, JobResources, JobSubmission
from gridcore.policies.coreservation import pilot_time_limit
from gridcore.sites.local import TIME_LIMIT_FILE, LocalSite
from gridcore.state.schema import local_jobs, pilots, reservation_shifts, reservations
from gridcore.state.store import open_store
from tests.capacity_checks import assert_capacity_invariant

FAST = CoReservationParams(heartbeat_timeout_s=6.0, lease_s=30.0)


@pytest.fixture
def grid(tmp_path: Path) -> Iterator[tuple[GridRuntime, RunningCenter]]:
    url = f"sqlite:///{tmp_path}/state.db"
    runtime = GridRuntime(default_grid(tmp_path), open_store(url, upgrade=True))
    center = start_in_thread(open_store(url), heartbeat_s=1.0)
    try:
        yield runtime, center
    finally:
        center.stop()
        runtime.store.dispose()


def engine_of(
    grid: tuple[GridRuntime, RunningCenter], params: CoReservationParams = FAST
) -> CoReservationEngine:
    runtime, center = grid
    return CoReservationEngine(runtime, center.url, params)


def scan_until(
    engine: CoReservationEngine, job_id: int, phase: ReservationPhase, timeout: float = 40.0
) -> ReservationRecord:
    deadline = time.time() + timeout
    while time.time() < deadline:
        engine.scan()
        record = engine.status(job_id)
        if record.state == phase:
            return record
        assert not record.finished, record.as_json()
        time.sleep(0.1)
    raise AssertionError(f"job {job_id} not {phase}: {engine.status(job_id).as_json()}")


def ranks_command(out: Path) -> str:
    """Every rank writes what the pilot handed it: its rank, the rank count, its peers
    file and whether its inherited data port is listening."""
    return (
        "python3 -c 'import os,socket,json,sys;"
        's=socket.socket(fileno=int(os.environ["GRIDCORE_LISTEN_FD"]));'
        'peers=json.load(open(os.environ["GRIDCORE_PEERS"]));'
        'open(sys.argv[1]+"/rank-"+os.environ["GRIDCORE_COMPONENT"],"w").write('
        'json.dumps({"n":os.environ["GRIDCORE_COMPONENTS"],"peers":len(peers["components"]),'
        '"port":s.getsockname()[1]}))\' '
        f"{out}"
    )


def test_a_four_pilot_job_runs_every_rank_together_and_gives_everything_back(
    grid: tuple[GridRuntime, RunningCenter], tmp_path: Path
) -> None:
    engine = engine_of(grid)
    out = tmp_path / "out"
    out.mkdir()
    job_id = engine.submit(
        CoReservationRequest("four", ranks_command(out), 4, vj_size=1, max_clusters=3)
    )
    record = scan_until(engine, job_id, ReservationPhase.COMPLETED)
    assert sorted(p.component for p in record.pilots) == [0, 1, 2, 3]
    assert all(p.state is PilotState.COMPLETED and p.exit_code == 0 for p in record.pilots)
    ranks = sorted(out.glob("rank-*"))
    assert len(ranks) == 4
    for rank in ranks:
        assert '"n": "4"' in rank.read_text() and '"peers": 4' in rank.read_text()
    assert record.coallocation_s is not None and record.coallocation_s >= 0
    assert record.dispatch_skew_s is not None and record.dispatch_skew_s < 5.0
    assert len(record.selection["choices"]) == 4  # T_avail per virtual job
    engine.scan()
    assert_capacity_invariant(engine.store, no_live_holds=True)


def test_a_request_no_cluster_set_can_hold_is_refused_before_anything_is_written(
    grid: tuple[GridRuntime, RunningCenter],
) -> None:
    engine = engine_of(grid)
    with pytest.raises(RequestError, match="cannot be held even by the idle grid"):
        engine.submit(CoReservationRequest("huge", "true", 64, vj_size=1, max_clusters=3))
    with pytest.raises(RequestError, match="processors"):
        engine.submit({"name": "odd", "command": "true", "processors": 3, "vj_size": 2})
    with engine.store.begin() as conn:
        assert conn.execute(select(local_jobs.c.id)).first() is None


def test_cancel_releases_every_pilot_and_its_processors(
    grid: tuple[GridRuntime, RunningCenter], tmp_path: Path
) -> None:
    engine = engine_of(grid)
    job_id = engine.submit(CoReservationRequest("long", "sleep 60", 4, max_clusters=3))
    scan_until(engine, job_id, ReservationPhase.DISPATCHED)
    record = engine.cancel(job_id)
    assert record.state is ReservationPhase.CANCELLED
    assert all(p.state is PilotState.RELEASED for p in record.pilots)
    _wait_local_jobs_ended(engine)
    engine.scan()
    assert_capacity_invariant(engine.store, no_live_holds=True)


def test_the_lifetime_is_eq2_capped_at_the_ceiling_and_a_bad_ceiling_is_refused(
    grid: tuple[GridRuntime, RunningCenter],
) -> None:
    with pytest.raises(RequestError, match="lifetime_ceiling_s"):
        CoReservationParams(lifetime_ceiling_s=0.0)
    engine = engine_of(grid, CoReservationParams(heartbeat_timeout_s=6.0, lifetime_ceiling_s=45.0))
    # A grid with no queue history: Eq. 1's cold-start wait (60 s) makes Eq. 2 >= 120 s.
    request = CoReservationRequest("capped", "true", 2, max_clusters=3, lifetime_floor_s=10.0)
    job_id = engine.submit(request)
    record = engine.status(job_id)
    assert record.lifetime_s == 45.0
    assert all(t >= 60.0 for t in (c["t_avail_s"] for c in record.selection["choices"]))
    engine.cancel(job_id)
    _wait_local_jobs_ended(engine)
    engine.scan()
    assert_capacity_invariant(engine.store, no_live_holds=True)


def test_a_pilot_killed_while_holding_is_substituted_and_the_job_completes(
    grid: tuple[GridRuntime, RunningCenter], tmp_path: Path
) -> None:
    runtime, _ = grid
    engine = engine_of(grid)
    # Block local-c so its pilot waits, then kill a HELD pilot elsewhere.
    blocker = runtime.adapter("local-c").submit(JobSubmission("blocker", "sleep 8", 4, key=None))
    job_id = engine.submit(CoReservationRequest("subst", "true", 3, max_clusters=3))
    held = _wait_for(lambda: _held_pilot(engine, job_id), 20.0)
    pid = _pilot_pid(engine, held.site, held.site_job_id)
    os.killpg(pid, signal.SIGKILL)
    record = scan_until(engine, job_id, ReservationPhase.COMPLETED, timeout=60.0)
    assert record.substitutes >= 1
    assert held.id not in {p.id for p in record.pilots if p.state is PilotState.COMPLETED}
    runtime.adapter("local-c").cancel(blocker)
    _wait_local_jobs_ended(engine)
    engine.scan()
    assert_capacity_invariant(engine.store, no_live_holds=True)


class TurnstileSite:
    """The local site with pilot submissions of two jobs forced into a given order per
    site (the I/O edge): how two meta-schedulers' pilots interleave in real queues."""

    def __init__(self, inner: Any, order: list[str]) -> None:
        self.inner = inner
        self.spec = inner.spec
        self.order = order  # job-name prefixes, in the order their submissions go
        self.turn = 0
        self.cond = threading.Condition()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def submit(self, job: JobSubmission) -> str:
        owner = next((o for o in set(self.order) if job.name.startswith(o)), None)
        if owner is None:
            return str(self.inner.submit(job))
        with self.cond:
            ok = self.cond.wait_for(
                lambda: self.turn >= len(self.order) or self.order[self.turn] == owner, 20.0
            )
            assert ok, f"turnstile at {self.spec.name} stuck before {job.name}"
            try:
                return str(self.inner.submit(job))
            finally:
                self.turn += 1
                self.cond.notify_all()


def _deadlock(
    tmp_path: Path, order_b: list[str], order_c: list[str], params: CoReservationParams
) -> tuple[CoReservationEngine, list[int], dict[str, Any]]:
    """Two jobs of 8 pilots each (4 on local-b, 4 on local-c: all of both), both
    blocked behind a job on each site; their pilots queue in ``order_b``/``order_c``."""
    url = f"sqlite:///{tmp_path}/state.db"
    runtime = GridRuntime(default_grid(tmp_path), open_store(url, upgrade=True))
    center = start_in_thread(open_store(url), heartbeat_s=1.0)
    for site, order in (("local-b", order_b), ("local-c", order_c)):
        runtime._adapters[site] = TurnstileSite(runtime.adapter(site), order)  # type: ignore[assignment]
    engine = CoReservationEngine(runtime, center.url, params)
    blockers = {
        site: runtime.adapter(site).submit(JobSubmission("blocker", "sleep 3", 4))
        for site in ("local-b", "local-c")
    }
    ids: list[int] = [0, 0]

    def submit(i: int, name: str) -> None:
        ids[i] = engine.submit(
            CoReservationRequest(
                name, "true", 8, max_clusters=2, lifetime_floor_s=8.0, sites=("local-b", "local-c")
            )
        )

    threads = [threading.Thread(target=submit, args=(i, n)) for i, n in enumerate(("ja", "jb"))]
    for t in threads:
        t.start()
        time.sleep(0.05)
    for t in threads:
        t.join(60)
    return engine, ids, {"center": center, "blockers": blockers}


@pytest.mark.parametrize(
    ("order_b", "order_c", "step"),
    [
        # A's 4 pilots before B's on local-b, B's before A's on local-c: A > B on b,
        # A < B on c: the indirect deadlock of Eq. 3.
        (["ja"] * 4 + ["jb"] * 4, ["jb"] * 4 + ["ja"] * 4, "indirect (Eq. 3)"),
        # Alternating on both: each holds 2 of 4 on each site: the direct one (Eq. 4).
        (["ja", "jb"] * 4, ["ja", "jb"] * 4, "direct (Eq. 4)"),
    ],
    ids=["indirect", "direct"],
)
def test_a_live_deadlock_is_resolved_by_reorganization_and_not_without(
    tmp_path: Path, order_b: list[str], order_c: list[str], step: str
) -> None:
    with_it, ids, extra = _deadlock(tmp_path / "with", order_b, order_c, FAST)
    try:
        _wait_for(lambda: _deadlocked(with_it, ids), 30.0)
        # Eq. 2 on a grid with no queue history yet is minutes (cold-start waits): the
        # test makes the lifetimes run out now instead of waiting them out.
        with with_it.store.begin() as conn:
            conn.execute(
                update(reservations)
                .where(reservations.c.id.in_(ids))
                .values(deadline_at=time.time())
            )
        for job_id in ids:
            scan_until(with_it, job_id, ReservationPhase.COMPLETED, timeout=90.0)
        with with_it.store.begin() as conn:
            steps = set(conn.execute(select(reservation_shifts.c.step)).scalars())
            receivers = set(
                conn.execute(
                    select(reservation_shifts.c.to_job).where(
                        reservation_shifts.c.to_job.is_not(None)
                    )
                ).scalars()
            )
        assert step in steps
        # The global order (the default rule): held pilots go only to the older job.
        assert receivers == {ids[0]}
        records = [with_it.status(i) for i in ids]
        assert sum(r.shifts_received for r in records) >= 1
        _wait_local_jobs_ended(with_it)
        with_it.scan()
        assert_capacity_invariant(with_it.store, no_live_holds=True)
    finally:
        extra["center"].stop()

    without, ids, extra = _deadlock(
        tmp_path / "without",
        order_b,
        order_c,
        CoReservationParams(heartbeat_timeout_s=6.0, reorganize=False),
    )
    try:
        _wait_for(lambda: _deadlocked(without, ids), 30.0)
        with without.store.begin() as conn:
            conn.execute(
                update(reservations)
                .where(reservations.c.id.in_(ids))
                .values(deadline_at=time.time())
            )
        horizon = time.time() + 20.0
        while time.time() < horizon:
            without.scan()
            time.sleep(0.2)
        records = [without.status(i) for i in ids]
        assert all(r.state is ReservationPhase.RESERVING for r in records), [
            r.as_json() for r in records
        ]
        for job_id in ids:
            without.cancel(job_id)
        _wait_local_jobs_ended(without)
        without.scan()
        assert_capacity_invariant(without.store, no_live_holds=True)
    finally:
        extra["center"].stop()


# -- helpers ---------------------------------------------------------------------------------


def _wait_for(probe: Any, timeout: float) -> Any:
    deadline = time.time() + timeout
    while time.time() < deadline:
        found = probe()
        if found:
            return found
        time.sleep(0.05)
    raise AssertionError("timed out")


def _deadlocked(engine: CoReservationEngine, ids: list[int]) -> bool:
    """Both jobs hold 4 pilots, and neither all 8: the blockers are gone, nothing moves."""
    engine.scan()
    records = [engine.status(i) for i in ids]
    held = [sum(p.state is PilotState.HELD for p in r.pilots) for r in records]
    return held == [4, 4] and all(r.state is ReservationPhase.RESERVING for r in records)


def _held_pilot(engine: CoReservationEngine, job_id: int) -> Any:
    engine.scan()
    record = engine.status(job_id)
    held = [
        p
        for p in record.pilots
        if p.state is PilotState.HELD and p.site != "local-c" and p.site_job_id is not None
    ]
    return held[0] if held else None


def _pilot_pid(engine: CoReservationEngine, site: str, site_job_id: str | None) -> int:
    with engine.store.begin() as conn:
        pgid = conn.execute(
            select(local_jobs.c.pgid).where(local_jobs.c.id == int(str(site_job_id)))
        ).scalar_one()
    assert pgid is not None
    return int(pgid)


def _wait_local_jobs_ended(engine: CoReservationEngine, timeout: float = 30.0) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        engine.runtime.refresh()
        for site in engine.grid.site_names:
            engine.runtime.adapter(site).observe()
        with engine.store.begin() as conn:
            live = conn.execute(
                select(local_jobs.c.id).where(local_jobs.c.state.in_(("pending", "running")))
            ).all()
        if not live:
            return
        time.sleep(0.2)
    raise AssertionError(f"local jobs still live: {live}")


def test_a_static_machine_file_pins_the_pilots_where_it_says(
    grid: tuple[GridRuntime, RunningCenter],
) -> None:
    engine = engine_of(grid)
    with pytest.raises(RequestError, match="machine_file: virtual jobs sum to 3"):
        engine.submit(
            {
                "name": "bad",
                "command": "true",
                "processors": 4,
                "machine_file": {"local-a": 2, "local-b": 1},
            }
        )
    with pytest.raises(RequestError, match=r"machine_file\.local-z: unknown site"):
        engine.submit(
            {"name": "bad", "command": "true", "processors": 1, "machine_file": {"local-z": 1}}
        )
    with pytest.raises(RequestError, match="local-b: holds at most 4"):
        engine.submit(
            {"name": "big", "command": "true", "processors": 5, "machine_file": {"local-b": 5}}
        )
    job_id = engine.submit(
        CoReservationRequest("pinned", "true", 4, machine_file=(("local-b", 1), ("local-c", 3)))
    )
    record = scan_until(engine, job_id, ReservationPhase.COMPLETED)
    assert record.clusters == {"local-b": 1, "local-c": 3}
    assert record.selection["reasons"] == ["static machine file: local-b x1, local-c x3"]


def test_a_pilot_that_reported_its_result_is_left_to_exit_before_it_counts_as_orphan(
    grid: tuple[GridRuntime, RunningCenter],
) -> None:
    """Cancelling a pilot's site job in the instant between its result and its exit
    shows a finished job as CANCELLED at the site (seen on Slurm under load)."""
    from gridcore.engine.submission import PILOT_EXIT_GRACE_S, Verdict, judge_pilot_job

    engine = engine_of(grid)
    job_id = engine.submit(CoReservationRequest("one", "true", 1, max_clusters=3))
    record = scan_until(engine, job_id, ReservationPhase.COMPLETED)
    (pilot,) = record.pilots
    assert pilot.state is PilotState.COMPLETED and pilot.site_job_id is not None
    with engine.store.begin() as conn:
        finished = conn.execute(
            select(pilots.c.finished_at).where(pilots.c.id == pilot.id)
        ).scalar_one()

        def verdict(now: float, job: str = pilot.site_job_id or "") -> Verdict:
            return judge_pilot_job(conn, pilot.id, pilot.site, job, now)

        assert verdict(finished + 1.0) is Verdict.KEEP
        assert verdict(finished + PILOT_EXIT_GRACE_S) is Verdict.ORPHAN
        assert verdict(finished + 1.0, job="another") is Verdict.ORPHAN
    _wait_local_jobs_ended(engine)
    engine.scan()
    assert_capacity_invariant(engine.store, no_live_holds=True)


class _Died(BaseException):
    """The submitter dies here (nothing catches a BaseException on the way out)."""


def test_a_pilot_resubmitted_after_its_submitter_died_asks_what_it_was_first_sent(
    grid: tuple[GridRuntime, RunningCenter], monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = engine_of(grid)
    request = CoReservationRequest(
        "again", "true", 1, sites=("local-b",), lifetime_floor_s=30.0,
        resources=JobResources(time_limit_s=600, account="proj"),
    )  # fmt: skip

    def dies(adapter: Any, job: JobSubmission) -> tuple[str, bool]:
        raise _Died

    with monkeypatch.context() as patched:
        patched.setattr(coreservation.submission, "submit_once", dies)
        with pytest.raises(_Died):
            engine.submit(request)
    with engine.store.begin() as conn:
        job_id = conn.execute(select(reservations.c.id)).scalar_one()
    record = engine.status(job_id)
    (pilot,) = record.pilots
    assert pilot.state is PilotState.SUBMITTING and record.lifetime_s is not None
    # Eq. 2's lifetime + the command's 600 s + the margin, kept with the pilot
    limit = pilot_time_limit(record.lifetime_s, 600)
    assert pilot.resources == {"time_limit_s": limit, "account": "proj"}

    monkeypatch.setattr(coreservation, "SUBMIT_DEADLINE_S", -1.0)  # stale at once
    record = scan_until(engine, job_id, ReservationPhase.COMPLETED)
    (pilot,) = record.pilots
    assert pilot.resources == {"time_limit_s": limit, "account": "proj"}
    site = engine.runtime.adapter("local-b")
    assert isinstance(site, LocalSite) and pilot.site_job_id is not None
    assert (site.workdir(pilot.site_job_id) / TIME_LIMIT_FILE).read_text().strip() == str(limit)
    _wait_local_jobs_ended(engine)
    engine.scan()
    assert_capacity_invariant(engine.store, no_live_holds=True)


def test_a_request_for_gpus_on_local_sites_only_is_refused_before_anything_is_written(
    grid: tuple[GridRuntime, RunningCenter],
) -> None:
    engine = engine_of(grid)
    gpus = JobResources(gpus=1)
    with pytest.raises(RequestError, match=r"resources\.gpus: .* local-a, local-b, local-c"):
        engine.submit(CoReservationRequest("cuda", "true", 2, resources=gpus))
    with pytest.raises(RequestError, match=r"resources\.gpus: .* site\(s\) local-c are local"):
        engine.submit(
            CoReservationRequest("cuda", "true", 2, machine_file=(("local-c", 2),), resources=gpus)
        )
    with engine.store.begin() as conn:
        assert conn.execute(select(reservations.c.id)).first() is None
