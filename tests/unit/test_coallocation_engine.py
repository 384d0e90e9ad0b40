"""The live KOALA engine on the embedded local sites (real subprocess pools, SQLite):
placement, claiming, the start barrier, fault tolerance, the scan lease and resuming."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from types import MappingProxyType

import pytest
from sqlalchemy import func, select

from gridcore.config import default_grid
from gridcore.engine.barrier_command import TOKEN_ENV
from gridcore.engine.coallocation import (
    CoAllocationEngine,
    CoAllocationRecord,
    _preempt,
    _preemptible,
    request_from_json,
    request_to_json,
)
from gridcore.engine.pilot_pool import token_hash
from gridcore.engine.runtime import GridRuntime
from gridcore.errors import RequestError
from gridcore.model import (
    NO_RESOURCES,
    CoAllocationRequest,
    Component,
    FileDelivery,
    FlexibleOptions,
    GridSpec,
    InputFile,
    JobResources,
    JobSubmission,
    MemoryScope,
    Priority,
    RequestKind,
)
from gridcore.policies.claiming import ClaimDecision, ClaimOutcome, CoAllocationParams
from gridcore.policies.placement import PlacementPolicy
from gridcore.staging import ReplicaCatalog, register_source
from gridcore.state.schema import coalloc_components, coalloc_jobs, local_jobs
from gridcore.state.store import open_store
from tests.barrier_checks import assert_released_after_every_registration, running_center
from tests.capacity_checks import assert_capacity_invariant

# 8 + 4 + 4 on local-a (8), local-b (4), local-c (4): only co-allocation over all three fits.
SPREAD = CoAllocationRequest(
    "spread", RequestKind.NON_FIXED, (Component(8), Component(4), Component(4))
)
PARAMS = CoAllocationParams(scan_interval_s=1.0)


def runtime(tmp_path: Path) -> GridRuntime:
    return GridRuntime(
        default_grid(tmp_path), open_store(f"sqlite:///{tmp_path}/state.db", upgrade=True)
    )


@pytest.fixture
def center(tmp_path: Path) -> Iterator[str]:
    """The VJ center the barriers of the test's jobs call, on its state DB."""
    with running_center(f"sqlite:///{tmp_path}/state.db") as url:
        yield url


def engine(tmp_path: Path, center: str, **kwargs: object) -> CoAllocationEngine:
    return CoAllocationEngine(runtime(tmp_path), params=PARAMS, center_url=center, **kwargs)  # type: ignore[arg-type]


def scan_until(
    koala: CoAllocationEngine, job_id: int, state: str, timeout: float = 20.0
) -> CoAllocationRecord:
    deadline = time.time() + timeout
    while time.time() < deadline:
        koala.scan()
        record = koala.status(job_id)
        if record.state == state and (state != "running" or record.started_at is not None):
            return record
        assert not record.finished, record.as_json()
        time.sleep(0.1)
    raise AssertionError(f"job {job_id} not {state}: {koala.status(job_id).as_json()}")


def stdout_of(koala: CoAllocationEngine, site: str, site_job_id: str | None) -> str:
    # A local job's directory is named by its submission key: the row says where.
    with koala.store.begin() as conn:
        workdir = conn.execute(
            select(local_jobs.c.workdir).where(
                local_jobs.c.id == int(site_job_id or 0), local_jobs.c.site == site
            )
        ).scalar_one()
    return (Path(workdir) / "stdout.txt").read_text()


def test_three_components_co_allocated_meet_at_the_barrier_and_complete(
    tmp_path: Path, center: str
) -> None:
    koala = engine(tmp_path, center)
    # Each component prints its peers file, its index and the port of the listening
    # socket it inherited from the barrier.
    probe = (
        "import os, socket; s = socket.socket(fileno=int(os.environ['GRIDCORE_LISTEN_FD']));"
        " print('listen', s.getsockname()[1], os.environ['GRIDCORE_PORT'])"
    )
    command = (
        'cat "$GRIDCORE_PEERS"; echo; echo "component $GRIDCORE_COMPONENT of $GRIDCORE_COMPONENTS";'
        f' {sys.executable} -c "{probe}"; sleep 0.5'
    )
    job_id = koala.submit(SPREAD, PlacementPolicy.WF, command)
    assert koala.status(job_id).state == "queued"
    done = scan_until(koala, job_id, "completed")

    assert [(c.index, c.size, c.site) for c in done.components] == [
        (0, 8, "local-a"),
        (1, 4, "local-b"),
        (2, 4, "local-c"),
    ]
    assert all(c.state == "completed" and c.exit_code == 0 for c in done.components)
    assert_released_after_every_registration(koala.store, job_id)
    assert done.retries == 0 and done.placement_tries == 1 and done.claim_tries == 1
    assert done.jpt is not None and done.jst == done.jpt  # no input file: FTT = 0
    addresses = {(c.index, c.host, c.port) for c in done.components}
    assert len({port for _, _, port in addresses}) == 3
    for c in done.components:
        lines = stdout_of(koala, c.site, c.site_job_id).splitlines()
        peers = json.loads(lines[0])["components"]
        assert {(p["index"], p["host"], p["port"]) for p in peers} == addresses
        assert lines[1] == f"component {c.index} of 3"
        assert lines[2] == f"listen {c.port} {c.port}"
    payload = done.as_json()
    assert json.loads(json.dumps(payload)) == payload
    assert payload["placement"]["clusters_combined"] == 3
    with koala.store.begin() as conn:
        running = conn.execute(
            select(func.count()).select_from(local_jobs).where(local_jobs.c.state == "running")
        ).scalar_one()
    assert running == 0


def component_tokens(koala: CoAllocationEngine) -> dict[str, str]:
    """The barrier token every local component job was given, by its site job id."""
    with koala.store.begin() as conn:
        rows = conn.execute(select(local_jobs.c.id, local_jobs.c.workdir)).all()
    return {
        str(r.id): json.loads((Path(r.workdir) / "env.json").read_text())[TOKEN_ENV] for r in rows
    }


def test_components_get_their_own_token_and_never_the_database(
    tmp_path: Path, center: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Local sites pass this process's environment on: keep a database URL out of it, so
    # what is checked is what the engine hands the component.
    monkeypatch.delenv("GRIDCORE_DB_URL", raising=False)
    koala = engine(tmp_path, center)
    show = "env; echo; tr '\\0' ' ' < /proc/$PPID/cmdline"  # the barrier's argv
    job_id = koala.submit(SPREAD, PlacementPolicy.WF, show)
    done = scan_until(koala, job_id, "completed")

    tokens = component_tokens(koala)
    with koala.store.begin() as conn:
        hashes = dict(
            conn.execute(
                select(coalloc_components.c.site_job_id, coalloc_components.c.token_hash).where(
                    coalloc_components.c.job_id == job_id
                )
            ).all()
        )
    assert {k: token_hash(t) for k, t in tokens.items()} == hashes
    assert len(set(tokens.values())) == 3
    database = str(tmp_path / "state.db")
    for c in done.components:
        seen = stdout_of(koala, c.site, c.site_job_id)  # its environment, the barrier's argv
        assert f"--center {center}" in seen and "gridcore.barrier" in seen
        assert database not in seen and "--db" not in seen and "GRIDCORE_DB_URL" not in seen
        assert TOKEN_ENV not in seen  # taken out of the command's environment
        assert tokens[str(c.site_job_id)] not in seen


def test_bad_requests_are_refused_before_any_row_exists(tmp_path: Path, center: str) -> None:
    store = open_store(f"sqlite:///{tmp_path}/state.db", upgrade=True)
    rt = GridRuntime(default_grid(tmp_path), store)
    koala = CoAllocationEngine(rt, ReplicaCatalog(store), PARAMS, center_url=center)
    bad = {
        "unknown site": CoAllocationRequest(
            "x", RequestKind.FIXED, (Component(2, "local-a"), Component(2, "nowhere"))
        ),
        "size": CoAllocationRequest("x", RequestKind.NON_FIXED, (Component(0),)),
        "no replica": CoAllocationRequest(
            "x", RequestKind.NON_FIXED, (Component(1),), input_file=InputFile("in/missing.dat")
        ),
        "even on the idle grid": CoAllocationRequest("x", RequestKind.NON_FIXED, (Component(9),)),
        r"request\.resources\.time_limit: must be from 1 second": CoAllocationRequest(
            "x", RequestKind.NON_FIXED, (Component(1),), resources=JobResources(time_limit_s=0)
        ),
        r"request\.resources\.gpus: .* local-a, local-b, local-c are local": CoAllocationRequest(
            "x", RequestKind.NON_FIXED, (Component(1),), resources=JobResources(gpus=1)
        ),
        r"request\.resources\.gpus: .* site\(s\) local-b are local": CoAllocationRequest(
            "x", RequestKind.FIXED, (Component(1, "local-b"),), resources=JobResources(gpus=1)
        ),
    }
    for expected, request in bad.items():
        with pytest.raises(RequestError, match=expected):
            koala.submit(request, PlacementPolicy.CM, "true")
    with pytest.raises(RequestError, match="command"):
        koala.submit(SPREAD, PlacementPolicy.CM, "  ")
    with pytest.raises(RequestError, match="quota"):
        koala.submit(SPREAD, PlacementPolicy.CM, "true", quota=1.5)
    with store.begin() as conn:
        assert conn.execute(select(func.count()).select_from(coalloc_jobs)).scalar_one() == 0


def test_request_json_round_trip() -> None:
    request = CoAllocationRequest(
        "flex",
        RequestKind.FLEXIBLE,
        total=12,
        input_file=InputFile("in/a.dat", FileDelivery.CHUNKED),
        priority=Priority.HIGH,
        flexible=FlexibleOptions(2, 3, ((8, 4), (4, 4, 4))),
    )
    assert request_from_json(request_to_json(request)) == request
    assert request_from_json(request_to_json(SPREAD)) == SPREAD
    asked = JobResources(600, "proj", memory_mib=512, memory_per=MemoryScope.CPU, gpus=1)
    with_resources = replace(SPREAD, resources=asked)
    stored = request_to_json(with_resources)
    assert json.loads(stored)["resources"] == asked.as_json()
    assert request_from_json(stored) == with_resources
    # a job stored before requests carried resources asks for none
    old = json.loads(request_to_json(SPREAD))
    del old["resources"]
    assert request_from_json(json.dumps(old)).resources == NO_RESOURCES


def test_input_file_is_staged_to_every_execution_site_before_claiming(
    tmp_path: Path, center: str
) -> None:
    store = open_store(f"sqlite:///{tmp_path}/state.db", upgrade=True)
    catalog = ReplicaCatalog(store)
    source = tmp_path / "mesh.dat"
    source.write_bytes(b"x" * 4096)
    register_source(catalog, "in/mesh.dat", "origin", str(source))
    koala = CoAllocationEngine(
        GridRuntime(default_grid(tmp_path), store), catalog, PARAMS, center_url=center
    )
    request = CoAllocationRequest(
        "with-file",
        RequestKind.NON_FIXED,
        (Component(8), Component(4), Component(4)),
        input_file=InputFile("in/mesh.dat"),
    )
    job_id = koala.submit(request, PlacementPolicy.CF, "true")
    done = scan_until(koala, job_id, "completed")
    assert {c.file_site for c in done.components} == {"origin"}
    assert done.ftt is not None and done.ftt > 0 and done.jst == done.jpt + done.ftt
    assert {r.site for r in catalog.replicas("in/mesh.dat")} == {
        "origin",
        "local-a",
        "local-b",
        "local-c",
    }


def slow_link_koala(tmp_path: Path, center: str) -> tuple[CoAllocationEngine, int]:
    """A job whose 4 kB input crosses a 1 kB/s link (as estimated): FTT ~ 4.1 s, so the
    first claiming try comes at JPT + 0.75 FTT, before the JST."""
    base = default_grid(tmp_path)
    grid = GridSpec(base.sites, MappingProxyType({}), 0.001, "slow links")
    store = open_store(f"sqlite:///{tmp_path}/state.db", upgrade=True)
    catalog = ReplicaCatalog(store)
    source = tmp_path / "mesh.dat"
    source.write_bytes(b"x" * 4096)
    register_source(catalog, "in/mesh.dat", "origin", str(source))
    koala = CoAllocationEngine(GridRuntime(grid, store), catalog, PARAMS, center_url=center)
    request = CoAllocationRequest(
        "icp", RequestKind.NON_FIXED, SPREAD.components, input_file=InputFile("in/mesh.dat")
    )
    return koala, koala.submit(request, PlacementPolicy.CF, "true")


def test_icp_starts_what_fits_and_the_rest_joins_at_the_barrier_later(
    tmp_path: Path, center: str
) -> None:
    koala, job_id = slow_link_koala(tmp_path, center)
    koala.scan()
    placed = koala.status(job_id)
    assert placed.state == "claiming" and placed.jpt is not None and placed.jct is not None
    assert placed.jpt < placed.jct < (placed.jst or 0)
    # Someone else takes local-a before the first claiming try.
    blocker = koala.runtime.adapter("local-a").submit(JobSubmission("other", "sleep 30", 8))
    while time.time() < placed.jct:
        time.sleep(0.05)
    koala.scan()
    partial = koala.status(job_id)
    assert partial.state == "claiming" and partial.claim_tries == 1
    assert [c.state for c in partial.components] == ["placed", "submitted", "submitted"]
    assert partial.jct == partial.jst  # JCT_1 is within claim_resolution_s of the JST
    koala.runtime.adapter("local-a").cancel(blocker)
    done = scan_until(koala, job_id, "completed")
    assert done.claim_tries == 2 and done.retries == 0
    first, *later = (c.claimed_at or 0 for c in done.components)
    assert all(t < first for t in later)
    assert_released_after_every_registration(koala.store, job_id)
    assert_capacity_invariant(koala.store, no_live_holds=True)


def test_icp_aborts_at_the_jst_lowers_l_and_replaces_the_job(tmp_path: Path, center: str) -> None:
    koala, job_id = slow_link_koala(tmp_path, center)
    koala.scan()
    placed = koala.status(job_id)
    blocker = koala.runtime.adapter("local-a").submit(JobSubmission("other", "sleep 30", 8))
    for due in (placed.jct or 0, placed.jst or 0):  # a partial claim, then the JST
        while time.time() < due:
            time.sleep(0.05)
        report = koala.scan()
    assert job_id in report["requeued"]
    aborted = koala.status(job_id)
    assert aborted.state == "queued" and aborted.L == 0.625 and aborted.epoch == 1
    assert aborted.components == ()
    with koala.store.begin() as conn:
        states = conn.execute(
            select(local_jobs.c.state).where(local_jobs.c.name != "other")
        ).scalars()
        assert sorted(states) == ["cancelled", "cancelled"]
    koala.runtime.adapter("local-a").cancel(blocker)
    done = scan_until(koala, job_id, "completed", timeout=30.0)
    assert done.L == 0.625 and done.claim_tries >= 2
    assert_capacity_invariant(koala.store, no_live_holds=True)


def test_only_the_lease_holder_scans(tmp_path: Path, center: str) -> None:
    first = engine(tmp_path, center, holder="first", lease_s=5.0)
    second = engine(tmp_path, center, holder="second", lease_s=5.0)
    now = time.time()
    assert not first.scan(now).skipped
    assert second.scan(now + 1).skipped
    assert not first.scan(now + 2).skipped  # the holder renews
    assert second.scan(now + 6).skipped  # renewed at now + 2: held until now + 7
    assert not second.scan(now + 7.5).skipped  # expired: taken over
    assert first.scan(now + 8).skipped
    second.release_lease()
    assert not first.scan(now + 8.5).skipped
    assert_capacity_invariant(first.store, no_live_holds=True)


def test_a_killed_component_requeues_the_whole_job_which_still_finishes(
    tmp_path: Path, center: str
) -> None:
    koala = engine(tmp_path, center)
    job_id = koala.submit(SPREAD, PlacementPolicy.CM, "sleep 1.5; echo ok")
    running = scan_until(koala, job_id, "running")
    victim = running.components[1]
    with koala.store.begin() as conn:
        pgid = conn.execute(
            select(local_jobs.c.pgid).where(local_jobs.c.id == int(victim.site_job_id or 0))
        ).scalar_one()
    os.killpg(pgid, signal.SIGKILL)
    done = scan_until(koala, job_id, "completed")
    assert done.retries >= 1 and done.epoch >= 1
    # The re-placement's components were given new tokens; the first ones open nothing.
    tokens = component_tokens(koala)
    first = {tokens[str(c.site_job_id)] for c in running.components}
    final = {tokens[str(c.site_job_id)] for c in done.components}
    assert len(first | final) == 6
    assert all(c.state == "completed" for c in done.components)
    assert_released_after_every_registration(koala.store, job_id)
    # The first attempt's other components were cancelled, not left running.
    with koala.store.begin() as conn:
        states = dict(
            conn.execute(
                select(local_jobs.c.state, func.count()).group_by(local_jobs.c.state)
            ).all()
        )
    assert states.get("running", 0) == 0
    assert states["failed"] == 1 and states["cancelled"] == 2 and states["completed"] == 3
    assert_capacity_invariant(koala.store, no_live_holds=True)


def test_a_new_engine_resumes_a_job_from_the_rows(tmp_path: Path, center: str) -> None:
    first = engine(tmp_path, center, holder="dead", lease_s=0.5)
    job_id = first.submit(SPREAD, PlacementPolicy.CM, "sleep 0.3")
    report = first.scan()
    assert report["placed"] == (job_id,) and report["claimed"] == (job_id,)
    del first  # killed: its lease runs out, its rows stay
    second = engine(tmp_path, center, holder="new", lease_s=0.5)
    done = scan_until(second, job_id, "completed")
    assert done.retries == 0 and done.barrier_skew_s is not None
    assert_capacity_invariant(second.store, no_live_holds=True)


def test_cancel_stops_every_component(tmp_path: Path, center: str) -> None:
    koala = engine(tmp_path, center)
    job_id = koala.submit(SPREAD, PlacementPolicy.CM, "sleep 30")
    scan_until(koala, job_id, "running")
    record = koala.cancel(job_id)
    assert record.state == "cancelled" and record.finished_at is not None
    assert all(c.state == "aborted" for c in record.components)
    koala.scan()
    assert koala.status(job_id).state == "cancelled"
    with koala.store.begin() as conn:
        states = conn.execute(select(local_jobs.c.state)).scalars().all()
    assert sorted(states) == ["cancelled"] * 3
    assert koala.cancel(job_id).state == "cancelled"  # idempotent
    assert_capacity_invariant(koala.store, no_live_holds=True)


def test_a_preempting_decision_sends_the_running_low_job_back_to_its_queue(
    tmp_path: Path,
    center: str,
) -> None:
    # Placement never hands a high-priority job processors a started low-priority job
    # holds (placed components are subtracted), so the conflict of Sec. 3.3 arises only
    # from monitoring lag at a real site; here the engine's application of a preempting
    # claim decision is checked on a really running low-priority job.
    koala = engine(tmp_path, center)
    low = CoAllocationRequest(
        "bulk", RequestKind.FIXED, (Component(8, "local-a"),), priority=Priority.LOW
    )
    low_id = koala.submit(low, PlacementPolicy.CM, "sleep 30")
    running = scan_until(koala, low_id, "running")
    with koala.store.begin() as conn:
        candidates = _preemptible(conn)
        assert [(c.name, c.usage) for c in candidates] == [(str(low_id), (("local-a", 8),))]
        decision = ClaimDecision(
            "urgent", ClaimOutcome.COMPLETE, (), (), (str(low_id),), 1.0, None, 0.75, 1, ()
        )
        cancels = _preempt(conn, decision, by=99)
    assert cancels == [("local-a", running.components[0].site_job_id)]
    requeued = koala.status(low_id)
    assert requeued.state == "queued" and requeued.epoch == running.epoch + 1
    assert "preempted by high-priority job 99" in requeued.message
    assert_capacity_invariant(koala.store)
    koala.runtime.adapter("local-a").cancel(str(cancels[0][1]))
    assert koala.cancel(low_id).state == "cancelled"
    assert_capacity_invariant(koala.store, no_live_holds=True)
