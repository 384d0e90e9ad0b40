"""The KOALA scan lease on PostgreSQL: many engines in many processes, exactly one
holds it at any instant (issue 3 item 5: "exactly one scans at a time"), and scans
slowed past the lease never commit out of turn (issue 7 item 2: the fencing token).
And what the components' barriers get on a database with a password: their own token
and the VJ center's URL, never the database's URL or password (DESIGN.md)."""

from __future__ import annotations

import itertools
import multiprocessing
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from sqlalchemy import Connection, select, text
from sqlalchemy.engine import make_url

from gridcore.config import default_grid
from gridcore.engine.coallocation import CoAllocationEngine
from gridcore.engine.runtime import GridRuntime
from gridcore.model import CoAllocationRequest, Component, RequestKind
from gridcore.policies.claiming import CoAllocationParams
from gridcore.policies.placement import PlacementPolicy
from gridcore.state.schema import local_jobs
from gridcore.state.store import open_store
from tests.barrier_checks import running_center
from tests.capacity_checks import assert_capacity_invariant
from tests.fakes import FaultySite
from tests.lease_checks import assert_a_retaken_lease_fences_the_old_grant

pytestmark = pytest.mark.postgres


def _contend(url: str, center: str, index: int, rounds: int, out: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    home = Path(tempfile.mkdtemp(prefix="gc-lease-"))
    runtime = GridRuntime(default_grid(home), open_store(url))
    engine = CoAllocationEngine(
        runtime,
        params=CoAllocationParams(scan_interval_s=1.0),
        holder=f"p{index}",
        center_url=center,
        lease_s=30.0,
    )
    held: list[tuple[float, float]] = []
    for _ in range(rounds):
        if engine.scanner.lease.take(time.time()) is not None:
            start = time.time()
            time.sleep(0.005)  # "scanning"
            end = time.time()
            engine.release_lease()
            held.append((start, end))
        time.sleep(0.001)
    out.put((index, held))
    runtime.store.dispose()


def test_exactly_one_engine_holds_the_scan_lease_at_a_time(pg_url: str) -> None:
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    with running_center(pg_url) as center:  # the engines only take the lease: never called
        procs = [ctx.Process(target=_contend, args=(pg_url, center, i, 60, out)) for i in range(4)]
        for p in procs:
            p.start()
        results = dict(out.get(timeout=120) for _ in procs)
        for p in procs:
            p.join(30)
            assert p.exitcode == 0
    intervals = sorted(
        (start, end, index) for index, held in results.items() for start, end in held
    )
    assert len({index for _, _, index in intervals}) >= 2, "the lease changed hands"
    assert len(intervals) >= 20
    for (_, e1, i1), (s2, _, i2) in itertools.pairwise(intervals):
        assert s2 >= e1, f"p{i1} held the lease until {e1} but p{i2} took it at {s2}"
    assert_capacity_invariant(pg_url, no_live_holds=True)


# -- fenced transitions: two engine processes, scans slowed past the lease -------------

# Every take of the lease that changes its token, and every transition a scan commits,
# as one log in commit order: takes are logged by a trigger inside the take's UPDATE,
# transitions by the engine below inside the transition's transaction, both after the
# statement that locks the lease row, so the log's order is the order of the commits.
LOG_DDL = (
    "CREATE TABLE lease_log (seq bigserial PRIMARY KEY, kind text NOT NULL,"
    " holder text NOT NULL, token integer NOT NULL)",
    """CREATE FUNCTION lease_log_take() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
      IF TG_OP = 'INSERT' THEN
        INSERT INTO lease_log (kind, holder, token) VALUES ('take', NEW.holder, NEW.token);
      ELSIF NEW.token <> OLD.token THEN
        INSERT INTO lease_log (kind, holder, token) VALUES ('take', NEW.holder, NEW.token);
      END IF;
      RETURN NEW;
    END $$""",
    "CREATE TRIGGER lease_log_take AFTER INSERT OR UPDATE ON gc_leases"
    " FOR EACH ROW EXECUTE FUNCTION lease_log_take()",
)
JOBS = [
    CoAllocationRequest(f"job{i}", RequestKind.FIXED, (Component(1, site),))
    for i, site in enumerate(("local-a", "local-b", "local-c", "local-a"))
]


def _log_commits(engine: CoAllocationEngine) -> None:
    """Log each transition the engine commits under its lease, in the same transaction."""
    scanner = engine.scanner
    tx = scanner.tx

    @contextmanager
    def logging_tx() -> Iterator[Connection]:
        grant = scanner.grant
        with tx() as conn:
            yield conn
            if grant is not None:
                conn.execute(
                    text("INSERT INTO lease_log (kind, holder, token) VALUES ('commit', :h, :t)"),
                    {"h": grant.holder, "t": grant.token},
                )

    scanner.tx = logging_tx  # type: ignore[method-assign]


def _scan_slowly(
    url: str,
    center: str,
    home: str,
    holder: str,
    lease_s: float,
    delay_s: float,
    renew: bool,
    seconds: float,
    out: multiprocessing.Queue,  # type: ignore[type-arg]
) -> None:
    store = open_store(url)
    grid = default_grid(Path(home))
    base = GridRuntime(grid, store)
    slow = {s: FaultySite(base.adapter(s), delay_s=delay_s) for s in grid.site_names}
    engine = CoAllocationEngine(
        GridRuntime(grid, store, adapters=slow),
        params=CoAllocationParams(scan_interval_s=1.0),
        holder=holder,
        center_url=center,
        lease_s=lease_s,
        renew_lease=renew,
    )
    _log_commits(engine)
    lost = scans = 0
    end = time.time() + seconds
    while time.time() < end:
        report = engine.scan()
        scans += not report.skipped
        lost += report.lease_lost
        time.sleep(0.05)
    out.put((holder, scans, lost))
    store.dispose()


def test_the_same_holder_retaking_its_expired_lease_fences_its_old_grant(pg_url: str) -> None:
    store = open_store(pg_url, upgrade=True)
    try:
        assert_a_retaken_lease_fences_the_old_grant(store)
    finally:
        store.dispose()


@pytest.mark.parametrize(
    ("renew", "lease_s", "delay_s"),
    [(False, 1.0, 1.5), (True, 1.0, 1.5)],
    ids=["stalled-renewals", "live-renewals"],
)
def test_scans_slowed_past_the_lease_never_commit_out_of_turn(
    pg_url: str, renew: bool, lease_s: float, delay_s: float
) -> None:
    store = open_store(pg_url, upgrade=True)
    with store.begin() as conn:
        for ddl in LOG_DDL:
            conn.execute(text(ddl))
    home = tempfile.mkdtemp(prefix="gc-fence-")
    with running_center(store) as center:
        # Every submission takes delay_s > lease_s: a slow site.
        koala = CoAllocationEngine(GridRuntime(default_grid(Path(home)), store), center_url=center)
        job_ids = [koala.submit(job, PlacementPolicy.CM, "true") for job in JOBS]
        ctx = multiprocessing.get_context("spawn")
        out = ctx.Queue()
        seconds = 20.0
        procs = [
            ctx.Process(
                target=_scan_slowly,
                args=(pg_url, center, home, f"p{i}", lease_s, delay_s, renew, seconds, out),
            )
            for i in range(2)
        ]
        for p in procs:
            p.start()
        results = {
            holder: (scans, lost) for holder, scans, lost in (out.get(timeout=120) for _ in procs)
        }
        for p in procs:
            p.join(30)
            assert p.exitcode == 0
    with store.begin() as conn:
        log = conn.execute(text("SELECT kind, holder, token FROM lease_log ORDER BY seq")).all()
    try:
        states = [koala.status(job_id).state for job_id in job_ids]
        for job_id in job_ids:
            koala.cancel(job_id)  # stop what is left (barriers waiting on a re-placed job)
    finally:
        store.dispose()

    takes = [(holder, token) for kind, holder, token in log if kind == "take"]
    commits = [row for row in log if row.kind == "commit"]
    assert len(commits) > 10, log
    assert [t for _, t in takes] == sorted({t for _, t in takes}), "tokens only grow"
    current: tuple[str, int] | None = None
    for kind, holder, token in log:
        if kind == "take":
            current = (holder, token)
        else:  # a transition commits only under the lease's current holder and token
            assert (holder, token) == current, (
                f"{holder} committed with token {token} after {current} took the lease"
            )
    if renew:
        # Scans slower than the lease but alive keep it and get the work done.
        assert states == ["completed"] * len(JOBS), (states, results)
    else:
        # Stalled scanners lose their lease mid-scan: it changed hands, and the scans
        # that outlived it were fenced out.
        assert len({holder for holder, _ in takes}) == 2, takes
        assert sum(lost for _, lost in results.values()) >= 1, results
    # Every job completed or was cancelled above: nothing may still hold capacity.
    assert_capacity_invariant(pg_url, no_live_holds=True)


# -- what a component on a cluster is given: its own token, never the database -----------

SECRET = "gc-S3cret-never-shown"


def test_no_component_is_given_the_state_database_url_or_password(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A URL with a password (the server trusts local connections, so any password works);
    # local sites pass this process's environment on, so no database URL is left in it.
    url = make_url(pg_url).set(password=SECRET).render_as_string(hide_password=False)
    monkeypatch.delenv("GRIDCORE_DB_URL", raising=False)
    store = open_store(url, upgrade=True)
    home = Path(tempfile.mkdtemp(prefix="gc-secret-"))
    # Each component shows its environment and its barrier's argv and environment.
    show = (
        "env; echo; tr '\\0' ' ' < /proc/$PPID/cmdline; echo; tr '\\0' '\\n' < /proc/$PPID/environ"
    )
    request = CoAllocationRequest(
        "secret", RequestKind.FIXED, (Component(2, "local-a"), Component(2, "local-b"))
    )
    try:
        with running_center(store) as center:
            koala = CoAllocationEngine(GridRuntime(default_grid(home), store), center_url=center)
            job_id = koala.submit(request, PlacementPolicy.CM, show)
            deadline = time.time() + 90
            while not koala.status(job_id).finished:
                assert time.time() < deadline, koala.status(job_id).as_json()
                koala.scan()
                time.sleep(0.1)
            record = koala.status(job_id)
            assert record.state == "completed", record.as_json()
            with store.begin() as conn:
                workdirs = conn.execute(select(local_jobs.c.workdir)).scalars().all()
        assert len(workdirs) == 2
        for workdir in map(Path, workdirs):
            seen = {f.name: f.read_text() for f in workdir.iterdir() if f.is_file()}
            assert {"job.sh", "env.json", "stdout.txt"} <= set(seen), seen
            assert f"--center {center}" in seen["stdout.txt"], seen["stdout.txt"]
            for name, text in seen.items():
                assert SECRET not in text, f"{workdir / name} holds the database password"
                assert "postgresql" not in text, f"{workdir / name} names the database"
                assert "GRIDCORE_DB_URL" not in text and "--db" not in text, workdir / name
    finally:
        store.dispose()
    assert_capacity_invariant(pg_url, no_live_holds=True)
