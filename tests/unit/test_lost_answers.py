"""A lost answer is not a failed request (issue 21 items 16 and 17).

A slurmrestd that takes a submission and answers after the client's timeout, or whose
connection drops before the answer, leaves the submission unknown: the selection keeps
its claim and key, the key is looked up, and the job the site made is adopted, never
submitted a second time. A lost answer is not the site's error, and a site that is
only set aside (unusable until its probe completes) is a reason to wait, not a request
no site can run.

The adapter's translation is checked against real sockets on loopback (a server that
closes without answering, one that never answers, a port nothing listens on); the
runtime's handling on :class:`tests.fakes.FakeSite`, which does not deduplicate keys.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from sqlalchemy import select

from gridcore.engine import coreservation, health
from gridcore.engine.coallocation import CoAllocationEngine
from gridcore.engine.coreservation import CoReservationEngine, CoReservationParams
from gridcore.engine.phases import PilotState
from gridcore.engine.runtime import GridRuntime
from gridcore.errors import AnswerLost, NoUsableSite, RequestError, SiteUnavailable
from gridcore.model import (
    CoAllocationRequest,
    Component,
    CoReservationRequest,
    CredentialRef,
    JobRequest,
    JobState,
    JobSubmission,
    RequestKind,
    SiteKind,
    SiteSpec,
)
from gridcore.policies.claiming import CoAllocationParams
from gridcore.policies.placement import PlacementPolicy
from gridcore.sites.keys import selection_key
from gridcore.sites.slurm import SlurmSite, forget_shared
from gridcore.state import capacity
from gridcore.state.capacity import HolderKind
from gridcore.state.schema import pilots, selections
from tests.fakes import FakeClock, FakeJob, FakeSite, fake_site_runtime

JOB = JobSubmission("member", "true", 2)


# ------------------------------------------------------------------ the adapter, on sockets


class Server:
    """A TCP server on loopback that reads each request and then does ``reply`` with
    the connection (closes it, or holds it open and silent). Counts connections."""

    def __init__(self, reply: Callable[[socket.socket], None]) -> None:
        self.reply = reply
        self.connections = 0
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.held: list[socket.socket] = []
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return  # closed
            self.connections += 1
            conn.recv(65536)  # the request (small enough to come in one read here)
            self.reply(conn)

    def close(self) -> None:
        self.sock.close()
        for conn in self.held:
            conn.close()


def _close(conn: socket.socket) -> None:
    conn.close()  # the request was read: the answer is lost with the connection


@pytest.fixture(autouse=True)
def _fresh_adapter_caches() -> Iterator[None]:
    forget_shared()
    yield
    forget_shared()


def _slurm(port: int) -> SlurmSite:
    spec = SiteSpec(
        "alpha",
        SiteKind.SLURM,
        16,
        url=f"http://127.0.0.1:{port}/",
        token=CredentialRef(env="GRIDCORE_SLURM_TOKEN_ALPHA"),
        storage_dir="/data/alpha",
        api_version="v0.0.40",
        timeout_s=0.5,
    )
    return SlurmSite(spec, "token")


def _send(site: SlurmSite, method: str) -> None:
    site._send(method, f"{site.spec.url}slurm/v0.0.40/job/submit", {} if method == "POST" else None)


def test_a_port_nobody_listens_on_is_unreachable_not_an_answer_lost() -> None:
    with socket.create_server(("127.0.0.1", 0)) as probe:
        port = probe.getsockname()[1]  # closed on exit: nothing listens there then
    site = _slurm(port)
    for method in ("GET", "POST"):
        with pytest.raises(SiteUnavailable) as err:
            _send(site, method)
        assert not isinstance(err.value, AnswerLost), method


def test_a_dropped_connection_loses_a_posts_answer_and_is_asked_again_for_a_get() -> None:
    server = Server(_close)
    try:
        site = _slurm(server.port)
        with pytest.raises(AnswerLost, match="dropped before the answer"):
            _send(site, "POST")
        assert server.connections == 1  # a submission is never sent twice blindly
        with pytest.raises(AnswerLost):
            _send(site, "GET")
        assert server.connections == 3  # a read is idempotent: asked once more
    finally:
        server.close()


def test_a_silent_server_loses_the_answer_and_a_get_is_not_asked_twice() -> None:
    server = Server(lambda conn: server.held.append(conn))
    try:
        site = _slurm(server.port)
        with pytest.raises(AnswerLost, match=r"no answer within 0\.5 s"):
            _send(site, "POST")
        with pytest.raises(AnswerLost):
            _send(site, "GET")
        assert server.connections == 2  # one timeout per call, not two
    finally:
        server.close()


# ------------------------------------------------------------------ the runtime


@pytest.fixture
def runtime(tmp_path: Path) -> Iterator[GridRuntime]:
    runtime = fake_site_runtime(tmp_path, FakeClock())
    yield runtime
    runtime.store.dispose()


def _fake(runtime: GridRuntime, site: str = "local-a") -> FakeSite:
    adapter = runtime.adapter(site)
    assert isinstance(adapter, FakeSite)
    return adapter


def _lose_answers(site: FakeSite, times: int) -> None:
    """The next ``times`` submissions are made by the site and their answers lost."""
    left = [times]

    def lost(job: FakeJob) -> None:
        left[0] -= 1
        if left[0] == 0:
            site.after_accept = None
        raise AnswerLost(site.spec.name, "POST /job/submit: no answer within 1.5 s")

    site.after_accept = lost


def _lose_the_answer_and_go_silent(site: FakeSite) -> Callable[..., str | None]:
    """The next submission is made by the site, its answer lost, and every look-up after
    it fails (the site silent); returns the site's own look-up, to restore it."""
    original_find = site.find

    def unreachable(key: str, since: float | None = None) -> str | None:
        raise SiteUnavailable(site.spec.name, "GET /jobs: no answer")

    def lost_and_silent(job: FakeJob) -> None:
        site.after_accept = None
        site.find = unreachable  # type: ignore[method-assign]
        raise AnswerLost(site.spec.name, "POST /job/submit: no answer within 1.5 s")

    site.after_accept = lost_and_silent
    return original_find


def _selected(runtime: GridRuntime) -> int:
    return runtime.select(JobRequest(JOB.name, JOB.processors, 1.0), site="local-a").selection_id


def _errors(runtime: GridRuntime, site: str = "local-a") -> int:
    with runtime.store.begin() as conn:
        return health.read_health(conn)[site].consecutive_errors


def _held(runtime: GridRuntime, selection_id: int) -> bool:
    with runtime.store.begin() as conn:
        hold = capacity.hold(conn, HolderKind.SELECTION, str(selection_id))
    return hold is not None and hold.ledger is not None


def test_a_lost_answer_is_looked_up_and_the_job_the_site_made_adopted(
    runtime: GridRuntime,
) -> None:
    site = _fake(runtime)
    sid = _selected(runtime)
    _lose_answers(site, 1)

    record = runtime.submit(sid, JOB)

    (only,) = site.keyed(selection_key(runtime.install_id, sid))
    assert record.job_id == only.job_id and record.state == JobState.PENDING.value
    assert len(site.jobs) == 1
    assert _errors(runtime) == 0  # the site answered the look-up: nothing against it


def test_an_unknown_submission_keeps_its_claim_and_its_retry_adopts_the_one_job(
    runtime: GridRuntime,
) -> None:
    site = _fake(runtime)
    sid = _selected(runtime)
    original_find = _lose_the_answer_and_go_silent(site)
    with pytest.raises(AnswerLost, match=r"looking key .* up failed too"):
        runtime.submit(sid, JOB)
    record = runtime.record(sid)
    assert (record.state, record.job_id) == (JobState.SELECTED.value, None)  # not failed
    assert _held(runtime, sid)  # the claim is kept, not released for a fresh selection
    assert _errors(runtime) == 0

    site.find = original_find  # type: ignore[method-assign]
    retried = runtime.submit(sid, JOB)  # the task's retry, or the operator asking again

    (only,) = site.keyed(selection_key(runtime.install_id, sid))
    assert retried.job_id == only.job_id and len(site.jobs) == 1


def test_a_submission_lost_before_the_site_made_it_is_sent_once_more_and_once_only(
    runtime: GridRuntime,
) -> None:
    site = _fake(runtime)
    sid = _selected(runtime)

    def lost_on_the_way(job: FakeJob) -> None:
        site.after_accept = None
        del site.jobs[job.job_id]  # the request never reached the controller
        raise AnswerLost(site.spec.name, "POST /job/submit: the connection dropped")

    site.after_accept = lost_on_the_way
    with pytest.raises(AnswerLost, match="not at the site yet"):
        runtime.submit(sid, JOB)
    assert runtime.record(sid).state == JobState.SELECTED.value and _held(runtime, sid)

    retried = runtime.submit(sid, JOB)

    assert retried.state == JobState.PENDING.value
    assert [j.job_id for j in site.jobs.values()] == [retried.job_id]


def test_lost_answers_do_not_make_the_site_unusable(runtime: GridRuntime) -> None:
    site = _fake(runtime)
    for _ in range(health.UNUSABLE_AFTER_ERRORS + 1):
        _lose_answers(site, 1)
        runtime.submit(_selected(runtime), JOB)
    with runtime.store.begin() as conn:
        assert health.read_health(conn)["local-a"].usable
    assert _errors(runtime) == 0
    assert len(site.jobs) == health.UNUSABLE_AFTER_ERRORS + 1  # one job per selection


def test_a_set_aside_site_is_a_reason_to_wait_not_an_impossible_request(
    runtime: GridRuntime,
) -> None:
    with runtime.store.begin() as conn:
        for name in runtime.grid.site_names:
            for _ in range(health.UNUSABLE_AFTER_ERRORS):
                health.record_failure(conn, name, "connection refused")
    with pytest.raises(NoUsableSite, match="marked unusable") as err:
        runtime.select(JobRequest("m", 1, 1.0))
    assert not isinstance(err.value, RequestError)  # operators retry it, never fail it
    with runtime.store.begin() as conn:
        assert conn.execute(select(selections.c.id)).first() is None  # nothing written

    too_big = max(s.processors for s in runtime.grid.sites) + 1
    with pytest.raises(RequestError, match="no site can run"):
        runtime.select(JobRequest("m", too_big, 1.0))


# ------------------------------------------------------------------ the scanning engines

PAIR = CoAllocationRequest(
    "pair", RequestKind.FIXED, (Component(2, "local-a"), Component(2, "local-b"))
)


def _koala(runtime: GridRuntime) -> CoAllocationEngine:
    return CoAllocationEngine(
        runtime,
        params=CoAllocationParams(scan_interval_s=1.0),
        holder="koala",
        center_url="http://127.0.0.1:9",  # nothing runs on the fake sites
        renew_lease=False,
    )


def _jobs_of(runtime: GridRuntime) -> int:
    return sum(len(_fake(runtime, s).jobs) for s in runtime.grid.site_names)


def test_a_koala_component_whose_answer_was_lost_is_adopted_not_re_placed(
    runtime: GridRuntime,
) -> None:
    koala = _koala(runtime)
    job_id = koala.submit(PAIR, PlacementPolicy.WF, "true")
    site = _fake(runtime, "local-b")
    original_find = site.find
    finds = [0]

    def silent_once(key: str, since: float | None = None) -> str | None:
        finds[0] += 1
        if finds[0] == 2:  # the look-up right after the lost answer
            raise SiteUnavailable(site.spec.name, "GET /jobs: no answer")
        return original_find(key, since)

    site.find = silent_once  # type: ignore[method-assign]
    _lose_answers(site, 1)

    koala.scan()  # submits, loses local-b's answer, adopts it in the follow step

    record = koala.status(job_id)
    assert record.epoch == 0 and record.retries == 0  # not re-placed
    assert [p.state for p in record.components] == ["submitted", "submitted"]
    assert _jobs_of(runtime) == 2  # one site job per component
    assert _errors(runtime, "local-b") == 0


def test_a_vjm_pilot_whose_answer_was_lost_stays_submitting_and_is_adopted_later(
    runtime: GridRuntime, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = CoReservationEngine(runtime, "http://127.0.0.1:9", CoReservationParams(lease_s=5.0))
    site = _fake(runtime, "local-b")
    original_find = _lose_the_answer_and_go_silent(site)
    engine.submit(CoReservationRequest("lost", "true", 1, sites=("local-b",)))
    with engine.store.begin() as conn:
        (state, job) = conn.execute(select(pilots.c.state, pilots.c.site_job_id)).one()
    assert (state, job) == (PilotState.SUBMITTING.value, None)  # unknown, not lost
    assert _errors(runtime, "local-b") == 0

    site.find = original_find  # type: ignore[method-assign]
    monkeypatch.setattr(coreservation, "SUBMIT_DEADLINE_S", 0.0)
    clock = runtime.clock
    assert isinstance(clock, FakeClock)
    clock.now += 1.0
    engine.scan()

    (only,) = site.jobs.values()
    with engine.store.begin() as conn:
        assert conn.execute(select(pilots.c.site_job_id)).scalar_one() == only.job_id
