"""The live engines' wait models (issue 22 item 5, gridcore.engine.wait_models) on SQLite:
migration 0014, what an observation stores (the queue, the history's new columns), a
site's model trained on its history and rebuilt only when a newer observation is stored,
the selection engine's single and burst decisions taking its forecasts (our in-flight
members queued ahead), the fall-back to Eq. W with the reason saying why, and VJM's
cluster selection taking them as T_avail."""

from __future__ import annotations

import json
import random
from importlib import resources
from pathlib import Path
from types import MappingProxyType

import pytest
from alembic import command
from alembic.config import Config
from sqlalchemy import inspect, select, text

from gridcore.engine import coreservation as coreservation_engine
from gridcore.engine import queue_stats, wait_models
from gridcore.engine import selection as selection_engine
from gridcore.engine.coreservation import CoReservationEngine
from gridcore.engine.runtime import GridRuntime
from gridcore.errors import StateError
from gridcore.model import (
    CoReservationRequest,
    GridSpec,
    JobRequest,
    JobResources,
    JobState,
    ObservedJob,
    Outcome,
    SiteKind,
    SiteObservation,
    SiteSnapshot,
    SiteSpec,
)
from gridcore.policies.coreservation import pilot_time_limit
from gridcore.policies.selection import (
    InsufficientMode,
    SelectionProtocol,
    estimated_queue_delay,
)
from gridcore.policies.wait_prediction import (
    PredictedBackfillModel,
    QueuedJob,
    QueueView,
    RunningJob,
)
from gridcore.state import capacity
from gridcore.state.capacity import HolderKind, Ledger
from gridcore.state.schema import queue_waits, sites
from gridcore.state.store import Store, open_store

GRID = GridSpec(
    (SiteSpec("a", SiteKind.SLURM, 8), SiteSpec("b", SiteKind.SLURM, 8)),
    MappingProxyType({}),
)
NOW = 1_000_000.0
R, P = JobState.RUNNING, JobState.PENDING


def make_store(tmp_path: Path) -> Store:
    store = open_store(f"sqlite:///{tmp_path}/state.db", upgrade=True)
    with store.begin() as conn:
        capacity.register_sites(conn, GRID)
    return store


def job(
    job_id: str,
    processors: int,
    state: JobState,
    *,
    submitted: float = NOW - 1000,
    started: float | None = None,
    limit: float | None = 1000.0,
    user: str | None = "alice",
    ended: float | None = None,
    estimate: float | None = None,
    key: str | None = None,
) -> ObservedJob:
    return ObservedJob(
        job_id, processors, state, key, submitted, started, user, limit, ended, estimate
    )


def observe(store: Store, site: str, at: float, *jobs: ObservedJob) -> None:
    busy = sum(j.processors for j in jobs if j.state is R)
    obs = SiteObservation(site, 8, 8 - busy, tuple(jobs), at)
    with store.begin() as conn:
        selection_engine.store_observation(conn, obs)
        queue_stats.record_observation(conn, obs)


def decide(
    store: Store,
    reader: selection_engine.SnapshotReader,
    procs: int,
    runtime: float = 600.0,
    name: str = "m",
) -> selection_engine.Recorded:
    return selection_engine.select_and_record(
        store, reader, JobRequest(name, procs, runtime), SelectionProtocol.EARLIEST_COMPLETION,
        InsufficientMode.BEST, "t", NOW, random.Random(1),
    )  # fmt: skip


# -- migration 0014 --------------------------------------------------------------------------


def migrate(store: Store, revision: str, *, down: bool = False) -> None:
    ini = resources.files("gridcore.state.migrations").joinpath("alembic.ini")
    cfg = Config(str(ini))
    cfg.set_main_option("script_location", str(Path(str(ini)).parent))
    with store.engine.begin() as conn:
        cfg.attributes["connection"] = conn
        (command.downgrade if down else command.upgrade)(cfg, revision)


def test_0014_adds_the_queue_and_history_columns_and_downgrades(tmp_path: Path) -> None:
    check_0014_round_trip(open_store(f"sqlite:///{tmp_path}/state.db"))


def check_0014_round_trip(store: Store) -> None:
    """Also run on PostgreSQL (tests/postgres/test_wait_models_pg.py)."""
    migrate(store, "0013")
    with store.engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO gc_queue_waits (site, site_job_id, external, submitted_at,"
                " started_at, seen_at) VALUES ('a', '1', true, 10.0, 20.0, 30.0)"
            )
        )
    migrate(store, "0014")
    names = {c["name"] for c in inspect(store.engine).get_columns("gc_queue_waits")}
    assert {"processors", "owner", "time_limit_s", "ended_at"} <= names
    assert "queue" in {c["name"] for c in inspect(store.engine).get_columns("gc_sites")}
    with store.engine.begin() as conn:
        row = conn.execute(
            text("SELECT submitted_at, started_at, owner, ended_at FROM gc_queue_waits")
        ).one()
    assert (row.submitted_at, row.started_at, row.owner, row.ended_at) == (10.0, 20.0, None, None)
    migrate(store, "0013", down=True)
    names = {c["name"] for c in inspect(store.engine).get_columns("gc_queue_waits")}
    assert "ended_at" not in names and "owner" not in names
    assert "queue" not in {c["name"] for c in inspect(store.engine).get_columns("gc_sites")}
    with store.engine.begin() as conn:
        assert conn.execute(text("SELECT started_at FROM gc_queue_waits")).scalar() == 20.0
    migrate(store, "head")
    store.dispose()


def test_0015_adds_the_forecast_columns_and_downgrades(tmp_path: Path) -> None:
    check_0015_round_trip(open_store(f"sqlite:///{tmp_path}/state.db"))


def check_0015_round_trip(store: Store) -> None:
    """Also run on PostgreSQL (tests/postgres/test_wait_models_pg.py)."""
    forecast = {"forecast_s", "forecast_at", "forecast_by"}
    migrate(store, "0014")
    with store.engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO gc_queue_waits (site, site_job_id, external, submitted_at,"
                " seen_at, owner) VALUES ('a', '1', true, 10.0, 30.0, 'carol')"
            )
        )
    migrate(store, "0015")
    assert forecast <= {c["name"] for c in inspect(store.engine).get_columns("gc_queue_waits")}
    with store.engine.begin() as conn:
        row = conn.execute(select(queue_waits)).one()
        assert (row.owner, row.forecast_s, row.forecast_by) == ("carol", None, None)
        conn.execute(queue_waits.update().values(forecast_s=5.0, forecast_at=30.0))
    migrate(store, "0014", down=True)
    names = {c["name"] for c in inspect(store.engine).get_columns("gc_queue_waits")}
    assert not forecast & names and "owner" in names
    with store.engine.begin() as conn:
        assert conn.execute(text("SELECT owner FROM gc_queue_waits")).scalar() == "carol"
    migrate(store, "head")
    store.dispose()


def test_a_database_one_revision_behind_is_refused_naming_the_columns_and_the_fix(
    tmp_path: Path,
) -> None:
    """Every table is there at 0014, but not 0015's columns: an engine opened without
    upgrading refuses it at once, instead of failing at its first forecast."""
    url = f"sqlite:///{tmp_path}/state.db"
    store = open_store(url, upgrade=True)
    migrate(store, "0014", down=True)
    store.dispose()
    behind = open_store(url)
    with pytest.raises(StateError, match=r"gc_queue_waits\.forecast_s.*run `gridcore db upgrade`"):
        behind.check_migrated()
    migrate(behind, "head")
    behind.check_migrated()
    behind.dispose()


# -- what an observation stores --------------------------------------------------------------


def test_an_observation_stores_its_queue_and_the_jobs_history(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    observe(
        store, "a", NOW - 10,
        job("1", 4, R, started=NOW - 500, user="alice"),
        job("2", 2, P, estimate=NOW + 300, user="bob", limit=600.0),
        job("3", 2, P, key="gc-ours"),  # ours: in flight, not others' queue
    )  # fmt: skip
    observe(store, "a", NOW, job("1", 4, JobState.COMPLETED, started=NOW - 500, ended=NOW - 5))
    with store.begin() as conn:
        stored = conn.execute(select(sites.c.queue).where(sites.c.name == "a")).scalar_one()
        rows = {
            r.site_job_id: r
            for r in conn.execute(select(queue_waits).where(queue_waits.c.site == "a"))
        }
    assert json.loads(stored)["jobs"] == []  # the newest observation: nothing live
    assert set(rows) == {"1"}  # the pending ones were not seen again: dropped
    one = rows["1"]
    assert (one.processors, one.owner, one.time_limit_s) == (4, "alice", 1000.0)
    assert (one.started_at, one.ended_at) == (NOW - 500, NOW - 5)


def test_the_stored_queue_drops_our_pending_jobs_and_serves_others_first_come() -> None:
    obs = SiteObservation(
        "a", 8, 4,
        (
            job("9", 4, R, started=NOW - 100),
            job("8", 2, P, submitted=NOW - 50, estimate=NOW + 900),
            job("7", 2, P, submitted=NOW - 60),
            job("6", 1, P, key="gc-k"),
            job("5", 16, P),  # larger than the site: never starts
        ),
        NOW,
    )  # fmt: skip
    queue = wait_models.decode_queue("a", NOW, wait_models.encode_queue(obs, set()))
    assert queue.unusable_because == ""
    assert [r.job_id for r in queue.running] == ["9"]
    assert [q.job_id for q in queue.queued] == ["7", "8"]
    assert queue.estimates == (NOW + 900,)
    assert "by +900 s" in queue.slurm_note(NOW)


def test_a_job_without_a_time_limit_makes_the_queue_unplannable() -> None:
    obs = SiteObservation("a", 8, 4, (job("9", 4, R, started=NOW, limit=None),), NOW)
    queue = wait_models.decode_queue("a", NOW, wait_models.encode_queue(obs, set()))
    assert (
        queue.unusable_because == "1 of its jobs have no time limit (the queue cannot be planned)"
    )
    never = wait_models.decode_queue("a", 0.0, None)
    assert never.unusable_because == "no observation stored yet"


def test_a_queue_too_long_to_plan_on_every_decision_falls_back_and_says_why() -> None:
    # a plan costs about the square of the queue (2.3 s for 10,000 jobs), inside the
    # decision's transaction: beyond MAX_QUEUED the site decides by Eq. W
    many = wait_models.MAX_QUEUED
    jobs = [job("r", 1, R, started=NOW - 10)] + [
        job(str(i), 1, P, submitted=NOW - 5) for i in range(many)
    ]
    queue = wait_models.decode_queue("a", NOW, wait_models.encode_queue(
        SiteObservation("a", 8, 0, tuple(jobs), NOW), set()
    ))  # fmt: skip
    assert queue.unusable_because == (
        f"1 running and {many} queued jobs > {many} (too long a queue to plan on every decision)"
    )
    fits = wait_models.decode_queue("a", NOW, wait_models.encode_queue(
        SiteObservation("a", 8, 0, tuple(jobs[:-1]), NOW), set()
    ))  # fmt: skip
    assert fits.unusable_because == ""


# -- the model: trained on the history, reused until a newer observation ---------------------


def alice_history(store: Store) -> None:
    """Two of alice's jobs ran 100 s each (limit 1000 s); one of hers runs since NOW - 50."""
    done = JobState.COMPLETED
    observe(store, "a", NOW - 400, job("1", 8, R, started=NOW - 400))
    first = job("1", 8, done, started=NOW - 400, ended=NOW - 300)
    observe(store, "a", NOW - 290, first, job("2", 8, R, started=NOW - 290))
    second = job("2", 8, done, started=NOW - 290, ended=NOW - 190)
    observe(store, "a", NOW - 1, second, job("3", 8, R, started=NOW - 50))


def test_decisions_take_the_models_forecast_trained_on_the_sites_history(tmp_path: Path) -> None:
    """Site a runs alice's 8-processor job since NOW - 50 (limit 1000 s); her last two ran
    100 s: Tsafrir predicts it ends at +50 s, where Slurm's limits say +950 s. Site b was
    never observed: Eq. W there, and the reasons say so."""
    store = make_store(tmp_path)
    alice_history(store)
    reader = selection_engine.SnapshotReader(GRID)
    recorded = decide(store, reader, 4)
    estimate = recorded.decision.estimate_for("a")
    assert estimate is not None and estimate.queue_delay_s == pytest.approx(50.0)
    expected = PredictedBackfillModel()
    expected.runtimes.add("alice", 100.0)
    expected.runtimes.add("alice", 100.0)
    running = (RunningJob("3", 8, NOW - 50, 1000.0, "alice"),)
    answer = expected.forecast(QueuedJob("x", 4, NOW, 600.0), QueueView(NOW, 8, running))
    assert answer.wait_s == pytest.approx(50.0)
    # b is idle by its report, so Eq. W waits 0 there: b wins, and its reason says how
    assert recorded.decision.site == "b"
    assert (
        recorded.decision.reasons[-1] == "queue delay at site b by Eq. W: no observation stored yet"
    )
    b = recorded.decision.estimate_for("b")
    snap_b = SiteSnapshot("b", 8, 8, in_flight_processors=0)
    assert b is not None and b.queue_delay_s == estimated_queue_delay(
        JobRequest("m", 4, 600.0), snap_b, 8
    )
    assert reader.waits is not None and reader.waits.builds == 1


def test_the_chosen_sites_reason_cites_the_model_and_slurms_estimate(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    alice_history(store)
    # b: full for 2,000 s by its limits; a pending 4-processor job Slurm plans at +2,000 s
    observe(
        store, "b", NOW - 1,
        job("20", 8, R, started=NOW - 100, limit=2100.0, user="carol"),
        job("21", 4, P, estimate=NOW + 2000, user="carol"),
    )  # fmt: skip
    reader = selection_engine.SnapshotReader(GRID)
    recorded = decide(store, reader, 8)
    assert recorded.decision.site == "a"
    note = recorded.decision.reasons[-1]
    assert note.startswith("queue delay at site a: 50 s by wait model predicted_backfill")
    assert "backfill with predicted run times: 0 queued ahead, +50 s" in note
    b = recorded.decision.estimate_for("b")
    assert b is not None and b.queue_delay_s == pytest.approx(3000.0)  # +2000, then 1000 s
    # b's line (had it been chosen) names Slurm's own plan beside the model's forecast
    with store.begin() as conn:
        _, observed = reader.read_observed(conn)
        waits = reader.decision_waits(conn, observed, NOW)
    assert waits is not None
    site_b = waits.site_wait(JobRequest("m", 8, 600.0), SiteSnapshot("b", 8, 0))
    assert (
        "Slurm's backfill plan starts the 1 pending jobs ahead that it has planned by +2000 s"
        in (site_b.note())
    )


def test_the_model_is_rebuilt_only_when_a_newer_observation_is_stored(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    alice_history(store)
    reader = selection_engine.SnapshotReader(GRID)
    decide(store, reader, 1, name="m1")
    decide(store, reader, 1, name="m2")
    assert reader.waits is not None and reader.waits.builds == 1
    observe(store, "a", NOW, job("3", 8, R, started=NOW - 50))
    decide(store, reader, 1, name="m3")
    assert reader.waits.builds == 2


def site_wait(
    store: Store, reader: selection_engine.SnapshotReader, site: str, processors: int = 8
) -> wait_models.SiteWait:
    """The forecast a decision at NOW takes for ``processors`` at ``site``."""
    with store.begin() as conn:
        _, observed = reader.read_observed(conn)
        waits = reader.decision_waits(conn, observed, NOW)
    assert waits is not None
    return waits.site_wait(JobRequest("m", processors, 600.0), SiteSnapshot(site, 8, 0))


def stored_forecasts(store: Store) -> dict[str, tuple[float, float, str]]:
    with store.begin() as conn:
        rows = conn.execute(
            select(queue_waits.c.site_job_id, queue_waits.c.forecast_s,
                   queue_waits.c.forecast_at, queue_waits.c.forecast_by)
            .where(queue_waits.c.forecast_s.is_not(None))
        ).all()  # fmt: skip
    return {r.site_job_id: (r.forecast_s, r.forecast_at, r.forecast_by) for r in rows}


def test_the_bound_learns_from_the_sites_jobs_seen_queued_then_started(tmp_path: Path) -> None:
    """Live, the conformal bound's residuals are the site's own jobs: carol's c2, seen
    pending behind her c1 (limit 300 s) at NOW - 400, is forecast by the decision that
    rebuilds the model from that observation to start 300 s after it, and the forecast is
    stored in c2's history row after the decision; c2 started 50 s later than that. A
    model rebuilt at the next observation, in this process or another one (an Airflow
    task's), learns the residual from the history (measured from the observation, not
    from c2's submission at NOW - 450), so a decision's forecast there has a bound 50 s
    above its wait. Forecasts stored by another model are not this one's residuals."""
    store = make_store(tmp_path)
    reader = selection_engine.SnapshotReader(GRID)
    assert reader.waits is not None
    book = reader.waits
    c1 = job("c1", 8, R, submitted=NOW - 450, started=NOW - 400, limit=300.0, user="carol")
    c2 = job("c2", 8, P, submitted=NOW - 450, limit=300.0, user="carol")
    observe(store, "a", NOW - 400, c1, c2)
    assert "no residual yet in its bin" in site_wait(store, reader, "a").note()
    assert stored_forecasts(store) == {}  # a decision writes nothing in its transaction
    wait_models.store_forecasts(store, book)
    assert stored_forecasts(store) == {"c2": (300.0, NOW - 400, "predicted_backfill")}
    observe(store, "a", NOW - 300, c1, c2)  # seen again: recalled, not forecast again
    site_wait(store, reader, "a")
    assert book.take_forecasts() == {}
    done = job("c1", 8, JobState.COMPLETED, submitted=NOW - 450, started=NOW - 400,
               limit=300.0, user="carol", ended=NOW - 50)  # fmt: skip
    running = job("c2", 8, R, submitted=NOW - 450, started=NOW - 50, limit=300.0, user="carol")
    observe(store, "a", NOW - 1, done, running)
    for decider in (reader, selection_engine.SnapshotReader(GRID)):  # the other: a new process
        found = site_wait(store, decider, "a")
        assert found.forecast is not None
        assert found.forecast.wait_s == pytest.approx(250.0)  # c2's limit from NOW - 50
        assert found.forecast.bound_s == pytest.approx(300.0)
        assert "bound 300 s at 0.95" in found.note()
        assert "1 residuals in its bin, too few residuals: the largest +50 s" in found.note()
    assert book.builds == 3  # once per newer observation, never per decision
    with store.begin() as conn:
        conn.execute(queue_waits.update().values(forecast_by="eq1"))
    other = site_wait(store, selection_engine.SnapshotReader(GRID), "a")
    assert other.forecast is not None and other.forecast.bound_s is None


def test_a_forecast_is_stored_once_and_never_for_an_earlier_run(tmp_path: Path) -> None:
    """Two processes forecast dave's d1, d2 and requeued d3 from observations at NOW - 400
    and NOW - 300. d1 and d2 keep the first stored forecast, d2 although it has been
    seen started since (after its forecast: its residual is still to learn); d3 gets
    none, since its recorded start (NOW - 700, its first run's: the history keeps the
    first start) came before the forecast."""
    store = make_store(tmp_path)
    big = job("r", 8, R, submitted=NOW - 900, started=NOW - 900, limit=1000.0, user="eve")
    d1 = job("d1", 4, P, submitted=NOW - 500, limit=60.0, user="dave")
    d2 = job("d2", 4, P, submitted=NOW - 450, limit=60.0, user="dave")
    d3 = job("d3", 4, P, submitted=NOW - 800, limit=60.0, user="dave")
    observe(store, "a", NOW - 700, big, job("d3", 4, R, submitted=NOW - 800, started=NOW - 700))
    first, second = selection_engine.SnapshotReader(GRID), selection_engine.SnapshotReader(GRID)
    assert first.waits is not None and second.waits is not None
    observe(store, "a", NOW - 400, big, d3, d1, d2)
    site_wait(store, first, "a")  # d3 and d1 at NOW + 100 (r's limit), d2 behind, +160
    observe(store, "a", NOW - 300, big, d3, d1, d2)
    site_wait(store, second, "a")
    started = job("d2", 4, R, submitted=NOW - 450, started=NOW - 20)
    observe(store, "a", NOW - 10, big, d3, d1, started)
    wait_models.store_forecasts(store, first.waits)
    wait_models.store_forecasts(store, second.waits)
    assert stored_forecasts(store) == {
        "d1": (500.0, NOW - 400, "predicted_backfill"),
        "d2": (560.0, NOW - 400, "predicted_backfill"),
    }


def test_a_site_with_an_unlimited_job_falls_back_to_eq_w_and_says_why(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    observe(store, "a", NOW - 1, job("1", 8, R, started=NOW - 50, limit=None))
    observe(store, "b", NOW - 1, job("2", 8, R, started=NOW - 50, limit=None))
    reader = selection_engine.SnapshotReader(GRID)
    recorded = decide(store, reader, 4)
    site = recorded.decision.site
    assert recorded.decision.reasons[-1] == (
        f"queue delay at site {site} by Eq. W:"
        " 1 of its jobs have no time limit (the queue cannot be planned)"
    )


def test_without_a_wait_model_the_reader_decides_by_eq_w_as_before(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    alice_history(store)
    recorded = decide(store, selection_engine.SnapshotReader(GRID, wait_model=None), 4)
    a = recorded.decision.estimate_for("a")
    assert a is not None and a.queue_delay_s == 300.0  # Eq. W: half the 600 s runtime
    assert not any("wait model" in r or "Eq. W" in r for r in recorded.decision.reasons)


# -- a burst: our in-flight members queue ahead ----------------------------------------------


def test_a_bursts_later_members_queue_behind_its_earlier_ones(tmp_path: Path) -> None:
    """Both sites idle and observed: 8-processor members of 600 s. The first goes to a
    (tie by name), the second to b, the third waits 600 s behind the first (the model
    plans our in-flight member ahead of it), not Eq. W's 300 s."""
    store = make_store(tmp_path)
    observe(store, "a", NOW - 1)
    observe(store, "b", NOW - 1)
    reader = selection_engine.SnapshotReader(GRID)
    requests = [JobRequest(f"m{i}", 8, 600.0) for i in range(3)]
    recorded = selection_engine.select_and_record_batch(
        store, reader, requests, SelectionProtocol.EARLIEST_COMPLETION,
        InsufficientMode.BEST, "t", NOW, random.Random(1),
    )  # fmt: skip
    assert [r.decision.site for r in recorded] == ["a", "b", "a"]
    third = recorded[2].decision
    chosen = third.estimate_for("a")
    assert chosen is not None and (chosen.in_flight, chosen.queue_delay_s) == (8, 600.0)
    assert third.reasons[-1].startswith("queue delay at site a: 600 s by wait model")
    assert "1 queued ahead" in third.reasons[-1]
    first = recorded[0].decision.reasons[-1]
    assert first.startswith("queue delay at site a: 0 s by wait model predicted_backfill")


# -- VJM's cluster selection: the model's forecasts as T_avail -------------------------------


def test_vjm_selects_clusters_by_the_models_t_avail_and_says_so(tmp_path: Path) -> None:
    """Two virtual jobs of 4: site a frees its 8 processors at +50 s by alice's history
    (Eq. 1 has no starts to go on there beyond its cold values), b was never observed
    (Eq. 1). The reasons say which each cluster used; a's T_avails are the model's."""
    store = make_store(tmp_path)
    alice_history(store)
    runtime = GridRuntime(GRID, store, clock=lambda: NOW)
    engine = CoReservationEngine(runtime, "http://127.0.0.1:1")
    request = CoReservationRequest("co", "true", 8, vj_size=4, max_clusters=2)
    with store.begin() as conn:
        chosen = engine._selector(conn, request, 2, {}, (), NOW)(request.lifetime_floor_s)
    assert chosen.outcome is Outcome.FIT
    notes = [r for r in chosen.reasons if r.startswith("T_avail at cluster ")]
    assert notes[0].startswith("T_avail at cluster a: 50 to 50 s for 2 virtual jobs by wait model")
    assert notes[1] == "T_avail at cluster b by Eq. 1: no observation stored yet"
    at_a = [c.t_avail for c in chosen.choices if c.cluster == "a"]
    assert all(t == pytest.approx(50.0) for t in at_a)


def test_vjm_asks_its_forecasts_for_pilots_as_long_as_the_ones_it_sends(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The model forecasts 1,000 s wherever asked: Eq. 2 then gives a 2,000 s lifetime,
    whose pilots ask pilot_time_limit(2000, 600) = 2,900 s. The forecasts must have been
    asked for that limit too, not only for the lifetime floor's (as they were)."""
    store = make_store(tmp_path)
    runtime = GridRuntime(GRID, store, clock=lambda: NOW)
    engine = CoReservationEngine(runtime, "http://127.0.0.1:1")
    asked: list[float] = []

    def waits(
        book: object, snapshot: SiteSnapshot, g: int, count: int, limit_s: float, now: float
    ) -> tuple[tuple[float, ...], str]:
        asked.append(limit_s)
        return (1000.0,) * count, f"T_avail at cluster {snapshot.site}: 1000 s (test)"

    monkeypatch.setattr(coreservation_engine, "virtual_job_waits", waits)
    request = CoReservationRequest(
        "co", "true", 8, vj_size=4, max_clusters=2, resources=JobResources(time_limit_s=600)
    )
    with store.begin() as conn:
        job_id = coreservation_engine._insert_reservation(conn, request, NOW)
        made = engine._select_and_record(conn, job_id, request, 2, {}, (), NOW)
    assert made is not None
    sent = {p.resources.time_limit_s for p in made}
    assert sent == {pilot_time_limit(2000.0, 600.0)} == {2900}
    assert max(asked) == 2900
    assert min(asked) == pilot_time_limit(request.lifetime_floor_s, 600.0)  # the floor's


def test_a_sites_forecast_is_reused_for_a_second_then_made_again(tmp_path: Path) -> None:
    """Decisions on unchanged sites do not re-plan them (FORECAST_TTL_S); a change of our
    in-flight work there, or a second later, does."""
    store = make_store(tmp_path)
    alice_history(store)
    book = wait_models.WaitBook()
    with store.begin() as conn:
        book.refresh(conn, {"a": NOW - 1})
    request = JobRequest("m", 4, 600.0)
    snap = SiteSnapshot("a", 8, 0)
    first = book.wait_at(request, snap, NOW)
    assert book.wait_at(request, snap, NOW + 0.5) is first
    behind = book.wait_at(request, snap.add_in_flight(8), NOW + 0.5)
    assert behind is not first and behind.forecast is not None
    assert behind.forecast.wait_s == pytest.approx(649.5)  # +49.5 s, then ours for 600 s
    later = book.wait_at(request, snap, NOW + wait_models.FORECAST_TTL_S)
    assert later is not first and later.forecast is not None
    assert later.forecast.wait_s == pytest.approx(49.0)


def test_a_protocol_blind_to_our_in_flight_work_has_the_model_blind_to_it_too(
    tmp_path: Path,
) -> None:
    """Site a idle and observed, 8 of our processors in flight there: the stateful
    protocol's forecast queues the 8-processor request behind them (600 s), the naive
    protocol's does not (0 s), as neither protocol's Eq. W would."""
    store = make_store(tmp_path)
    observe(store, "a", NOW - 1)
    with store.begin() as conn:
        capacity.add(conn, HolderKind.SELECTION, "earlier", "a", 8, Ledger.CLAIMED, now=NOW)
    reader = selection_engine.SnapshotReader(GRID)
    delays = {}
    for protocol in (SelectionProtocol.STATEFUL, SelectionProtocol.NAIVE):
        recorded = selection_engine.select_and_record(
            store, reader, JobRequest(protocol.value, 8, 600.0), protocol,
            InsufficientMode.BEST, "t", NOW, random.Random(1),
        )  # fmt: skip
        a = recorded.decision.estimate_for("a")
        assert a is not None
        delays[protocol] = a.queue_delay_s
        if recorded.decision.site == "a":
            assert "by wait model" in recorded.decision.reasons[-1]
    assert delays == {SelectionProtocol.STATEFUL: 600.0, SelectionProtocol.NAIVE: 0.0}
