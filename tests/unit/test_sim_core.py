"""The discrete-event core: exact event traces, tie-breaks and determinism."""

from __future__ import annotations

import functools
import math
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gridcore.errors import GridError
from gridcore.sim.core import SimulationError, Simulator


def _recorder(sim: Simulator, trace: list[tuple[float, str]], label: str) -> None:
    trace.append((sim.now, label))


def _at(
    sim: Simulator, trace: list[tuple[float, str]], at: float, label: str, prio: int = 0
) -> int:
    return sim.schedule(at, lambda: _recorder(sim, trace, label), prio)


def test_events_run_in_time_order_whatever_the_scheduling_order() -> None:
    sim = Simulator()
    trace: list[tuple[float, str]] = []
    _at(sim, trace, 3.0, "c")
    _at(sim, trace, 1.0, "a")
    _at(sim, trace, 2.0, "b")
    sim.run()
    assert trace == [(1.0, "a"), (2.0, "b"), (3.0, "c")]
    assert sim.now == 3.0
    assert sim.pending == 0
    assert sim.processed == 3


def test_lower_priority_runs_first_at_equal_times() -> None:
    sim = Simulator()
    trace: list[tuple[float, str]] = []
    _at(sim, trace, 5.0, "late-priority", prio=2)
    _at(sim, trace, 5.0, "early-priority", prio=-1)
    _at(sim, trace, 5.0, "middle", prio=0)
    sim.run()
    assert [label for _, label in trace] == ["early-priority", "middle", "late-priority"]


def test_equal_time_and_priority_break_ties_by_scheduling_order() -> None:
    sim = Simulator()
    trace: list[tuple[float, str]] = []
    counters = [_at(sim, trace, 1.0, label) for label in ("first", "second", "third")]
    sim.run()
    assert counters == sorted(counters)
    assert len(set(counters)) == 3
    assert [label for _, label in trace] == ["first", "second", "third"]


def test_an_event_scheduled_now_from_a_callback_runs_after_those_already_due() -> None:
    sim = Simulator()
    trace: list[tuple[float, str]] = []

    def spawn() -> None:
        trace.append((sim.now, "spawn"))
        _at(sim, trace, sim.now, "spawned-now")
        _at(sim, trace, sim.now + 0.5, "spawned-later")

    sim.schedule(1.0, spawn)
    _at(sim, trace, 1.0, "queued-before")
    _at(sim, trace, 1.25, "between")
    sim.run()
    assert trace == [
        (1.0, "spawn"),
        (1.0, "queued-before"),
        (1.0, "spawned-now"),
        (1.25, "between"),
        (1.5, "spawned-later"),
    ]


def test_run_until_is_exclusive_and_leaves_the_clock_there() -> None:
    sim = Simulator()
    trace: list[tuple[float, str]] = []
    _at(sim, trace, 1.0, "a")
    _at(sim, trace, 2.0, "at-horizon")
    _at(sim, trace, 3.0, "b")
    sim.run(until=2.0)
    assert trace == [(1.0, "a")]
    assert sim.now == 2.0
    assert sim.pending == 2
    assert sim.peek() == 2.0
    sim.run()
    assert trace == [(1.0, "a"), (2.0, "at-horizon"), (3.0, "b")]
    assert sim.peek() == math.inf


def test_run_until_with_nothing_due_only_advances_the_clock() -> None:
    sim = Simulator(start=10.0)
    sim.run(until=25.0)
    assert sim.now == 25.0
    assert sim.processed == 0


def test_schedule_in_is_relative_to_now() -> None:
    sim = Simulator()
    trace: list[tuple[float, str]] = []
    sim.schedule(4.0, lambda: sim.schedule_in(1.5, lambda: _recorder(sim, trace, "x")))
    sim.run()
    assert trace == [(5.5, "x")]


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_non_finite_times_are_refused(bad: float) -> None:
    sim = Simulator()
    with pytest.raises(SimulationError, match="finite"):
        sim.schedule(bad, lambda: None)


def test_the_past_cannot_be_scheduled_nor_run_to() -> None:
    sim = Simulator(start=5.0)
    with pytest.raises(SimulationError, match="before now"):
        sim.schedule(4.0, lambda: None)
    with pytest.raises(SimulationError, match="not before"):
        sim.run(until=4.0)
    with pytest.raises(SimulationError, match="no event left"):
        sim.step()


def test_simulation_errors_share_the_gridcore_root() -> None:
    assert issubclass(SimulationError, GridError)


def _cascade(seed: int) -> list[tuple[float, str]]:
    # A small model whose events schedule random follow-ups, many at colliding times.
    rng = random.Random(seed)
    sim = Simulator()
    trace: list[tuple[float, str]] = []

    def event(name: str, depth: int) -> None:
        trace.append((sim.now, name))
        if depth < 3:
            for child in range(rng.randint(1, 3)):
                sim.schedule_in(
                    float(rng.randint(0, 2)),
                    functools.partial(event, f"{name}.{child}", depth + 1),
                    rng.randint(0, 1),
                )

    for root in range(4):
        sim.schedule(float(rng.randint(0, 2)), functools.partial(event, f"r{root}", 0))
    sim.run()
    return trace


def test_the_same_schedule_calls_give_the_same_trace() -> None:
    first = _cascade(7)
    assert len(first) > 10
    assert first == _cascade(7)
    assert [t for t, _ in first] == sorted(t for t, _ in first)


@given(
    st.lists(
        st.tuples(st.integers(min_value=0, max_value=5), st.integers(min_value=-1, max_value=1)),
        max_size=40,
    )
)
def test_order_is_time_then_priority_then_counter(events: list[tuple[int, int]]) -> None:
    sim = Simulator()
    ran: list[tuple[float, int, int]] = []

    def record(at: int, prio: int, holder: list[int]) -> None:
        ran.append((float(at), prio, holder[0]))

    for at, prio in events:
        holder: list[int] = []
        holder.append(sim.schedule(float(at), functools.partial(record, at, prio, holder), prio))
    sim.run()
    assert ran == sorted(ran)
    assert len(ran) == len(events)
