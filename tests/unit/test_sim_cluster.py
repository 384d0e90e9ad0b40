"""The one simulated cluster (sim/cluster.py): processors and storage held by named
holders, the FIFO local queue, preemption, busy-time integrals, other users' load."""

from __future__ import annotations

import itertools
import random

import pytest

from gridcore.errors import ConfigError
from gridcore.sim.cluster import (
    Admission,
    Cluster,
    LoadStreams,
    LocalHooks,
    OtherUsers,
    Owner,
    Queued,
)
from gridcore.sim.core import SimulationError, Simulator
from gridcore.sim.workload import BackgroundLoad, LocalJob, SimSite, validate_loads

GRID, LOCAL = Owner.GRID, Owner.LOCAL
GB = 10**9


def cluster(processors: int = 8, storage_bytes: int = 0) -> tuple[Simulator, Cluster]:
    sim = Simulator()
    return sim, Cluster(sim, SimSite("A", processors, storage_bytes=storage_bytes))


# --- storage -------------------------------------------------------------------------------------


def test_storage_is_claimed_released_and_refused_beyond_capacity() -> None:
    _, site = cluster(storage_bytes=10 * GB)
    assert site.claim_storage("vol1", 6 * GB)
    assert site.claim_storage("vol2", 4 * GB)
    assert site.free_bytes == 0
    # A full disk refuses the write and holds nothing for it.
    assert not site.claim_storage("vol3", 1)
    assert site.stored("vol3") == 0
    assert site.release_storage("vol1") == 6 * GB
    assert site.free_bytes == 6 * GB
    assert not site.claim_storage("vol2", 7 * GB)  # 4 + 7 > 10: refused whole
    assert site.claim_storage("vol2", 6 * GB)  # a holder may grow to the capacity
    assert (site.stored("vol2"), site.free_bytes) == (10 * GB, 0)
    assert site.release_storage("nobody") == 0


def test_storage_without_capacity_refuses_every_byte_but_nothing() -> None:
    _, site = cluster()
    assert not site.claim_storage("vol", 1)
    assert site.claim_storage("vol", 0)
    with pytest.raises(SimulationError, match="-1 bytes"):
        site.claim_storage("vol", -1)


def test_byte_seconds_integrate_what_is_stored_over_time() -> None:
    sim, site = cluster(storage_bytes=100)
    assert site.claim_storage("v", 40)
    sim.schedule(10.0, lambda: site.claim_storage("w", 60))
    sim.schedule(15.0, lambda: site.release_storage("v"))
    sim.run(until=20.0)
    site.close()
    assert site.stored_byte_s == 40 * 10 + 100 * 5 + 60 * 5


# --- processors ----------------------------------------------------------------------------------


def test_a_claim_beyond_the_idle_processors_or_twice_is_a_model_bug() -> None:
    _, site = cluster(8)
    site.claim("j#0", 6, GRID)
    with pytest.raises(SimulationError, match="3 processors taken, only 2 idle"):
        site.claim("j#1", 3, GRID)
    with pytest.raises(SimulationError, match="already holds"):
        site.claim("j#0", 1, GRID)
    site.claim("j#0", 1, LOCAL)  # another user's job of the same name is another holder
    with pytest.raises(SimulationError, match="holds no processors"):
        site.release("nobody", GRID)
    assert [(h.holder, h.processors, h.kind) for h in site.holdings()] == [
        ("j#0", 6, GRID),
        ("j#0", 1, LOCAL),
    ]


def test_busy_seconds_per_kind_of_holder_and_the_peak() -> None:
    sim, site = cluster(8)
    site.claim("ours", 4, GRID)
    sim.schedule(10.0, lambda: site.claim("theirs", 2, LOCAL))
    sim.schedule(30.0, lambda: site.release("ours", GRID))
    sim.run(until=40.0)
    site.close()
    assert site.busy_s(GRID) == 4 * 30.0
    assert site.busy_s(LOCAL) == 2 * 30.0
    assert (site.peak, site.idle, site.used(LOCAL)) == (6, 6, 2)


# --- the local queue -----------------------------------------------------------------------------


def test_the_local_queue_is_strict_fifo_and_work_ends_by_itself() -> None:
    sim, site = cluster(8)
    trace: list[tuple[float, str]] = []

    def work(name: str, processors: int, duration: float) -> Queued:
        return Queued(
            name,
            processors,
            duration,
            LOCAL,
            lambda: trace.append((sim.now, f"start {name}")),
            lambda: trace.append((sim.now, f"end {name}")),
        )

    site.enqueue(work("a", 6, 10.0))
    site.enqueue(work("big", 8, 5.0))  # waits for a
    site.enqueue(work("small", 2, 1.0))  # fits now, but may not overtake big
    assert [q.name for q in site.waiting()] == ["big", "small"]
    sim.run()
    assert trace == [
        (0.0, "start a"),
        (10.0, "end a"),
        (10.0, "start big"),
        (15.0, "end big"),
        (15.0, "start small"),
        (16.0, "end small"),
    ]
    assert site.started[LOCAL] == 3 and site.idle == 8


def test_a_preemptor_takes_the_freed_processors_before_the_local_queue() -> None:
    _, site = cluster(8)
    site.claim("low#0", 8, GRID)
    site.enqueue(Queued("user", 4, 10.0, LOCAL))
    assert site.preempt(["low#0"], GRID) == 8
    # Released, but the queue waits until the preemptor has claimed.
    assert (site.idle, len(site.waiting())) == (8, 1)
    site.claim("high#0", 6, GRID)
    site.start_queued()
    assert (site.idle, len(site.waiting()), site.preempted) == (2, 1, 1)


# --- other users ---------------------------------------------------------------------------------


def test_a_band_controlled_load_drops_what_does_not_fit_and_tops_up_with_dummies() -> None:
    sim = Simulator()
    sites = [Cluster(sim, SimSite("A", 10)), Cluster(sim, SimSite("B", 10))]
    load = BackgroundLoad(low_fraction=0.2, high_fraction=0.5, nodes=(1, 1), duration_s=(5, 5))
    events: list[tuple[float, str, str]] = []
    peaks: list[int] = []

    def started(job: LocalJob) -> None:
        events.append((sim.now, "start", job.name))
        peaks.append(users.busy)

    users = OtherUsers(
        sim,
        sites,
        load,
        Admission.DROP,
        streams=LoadStreams(
            random.Random(1),
            (f"local-{n}" for n in itertools.count(1)),
            random.Random(2),
            (f"dummy-{n}" for n in itertools.count(1)),
        ),
        active=lambda: sim.now < 20.0,
        hooks=LocalHooks(
            started,
            lambda j: events.append((sim.now, "end", j.name)),
            lambda j: events.append((sim.now, "drop", j.name)),
        ),
    )
    users.start()
    # Band (4, 10) of 20 processors, filled up to its midpoint 7 at time 0 by dummies of
    # one 2-processor node: four of them (8 >= 7).
    assert users.busy == 8
    assert [name for _, kind, name in events if kind == "start"] == [
        f"dummy-{n}" for n in (1, 2, 3, 4)
    ]
    users.submit(LocalJob("huge", "A", 0.0, 1.0, 4))  # 8 + 4 > 10 (the band's top): dropped
    assert events[-1] == (0.0, "drop", "huge")
    sim.run()
    assert max(peaks) <= 10  # never above the band's top
    assert {"local-1", "dummy-5"} <= {name for _, kind, name in events if kind == "start"}
    assert users.busy == 0  # every job ended once the model stopped being active


def test_a_queued_load_draws_the_same_jobs_whatever_the_model_does() -> None:
    def arrivals() -> list[tuple[str, float, float, int]]:
        sim = Simulator()
        site = Cluster(sim, SimSite("A", 16))
        drawn: list[LocalJob] = []
        users = OtherUsers(
            sim,
            [site],
            BackgroundLoad.at_site("A", 10.0, (2, 16), 60.0),
            Admission.QUEUE,
            streams=LoadStreams(random.Random(7), (f"A-user{n}" for n in itertools.count())),
            active=lambda: sim.now < 100.0,
            hooks=LocalHooks(started=drawn.append),
        )
        users.start()
        sim.run()
        return [(j.name, j.submit_s, j.runtime_s, j.processors) for j in drawn]

    first = arrivals()
    assert first == arrivals() and first
    assert all(2 <= size <= 16 for *_, size in first)


def test_background_loads_are_validated() -> None:
    with pytest.raises(ConfigError, match="low_fraction"):
        BackgroundLoad(low_fraction=0.3, high_fraction=0.2)
    with pytest.raises(ConfigError, match="means must be > 0"):
        BackgroundLoad.at_site("a", 0.0, (1, 2), 60.0)
    with pytest.raises(ConfigError, match="needs mean_interarrival_s"):
        BackgroundLoad(low_fraction=None)
    with pytest.raises(ConfigError, match="background load at 'a'"):
        validate_loads([BackgroundLoad.at_site("a", 10.0, (1, 16), 60.0)], [SimSite("a", 8)])
    with pytest.raises(SimulationError, match="cannot queue"):
        OtherUsers(Simulator(), [], BackgroundLoad(), Admission.QUEUE)
