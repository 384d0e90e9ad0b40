"""The workloads' two rules on a log's times (gridcore.workloads): an unknown requested
time filled in (one filler for every consumer) and a duration on the command line."""

from __future__ import annotations

import pytest

from gridcore.model import ASSUMED_RUNTIME_S
from gridcore.workloads.durations import log_seconds
from gridcore.workloads.requested import RequestedTimes


def test_an_unknown_or_zero_requested_time_is_the_largest_given_before_it() -> None:
    times = RequestedTimes()
    given = [None, 0.0, 300.0, -1.0, 100.0, None, 900.0, 0.0]
    assert [times.fill(t) for t in given] == [
        ASSUMED_RUNTIME_S,  # nothing given yet: 600 s
        ASSUMED_RUNTIME_S,  # 0 is no time (EASY would plan the job as ending at once)
        300.0,
        300.0,
        100.0,  # a given time is kept, smaller or not
        300.0,  # filled-in times lend nothing: the largest GIVEN before
        900.0,
        900.0,
    ]
    assert times.filled == 5


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("90", 90.0),
        ("90s", 90.0),
        ("90m", 5400.0),
        ("1.5h", 5400.0),
        ("2d", 172_800.0),
        (" .5h ", 1800.0),
        ("100 h", 360_000.0),
    ],
)
def test_a_duration_is_seconds_or_a_number_with_s_m_h_or_d(text: str, seconds: float) -> None:
    assert log_seconds(text) == seconds


@pytest.mark.parametrize("text", ["", "soon", "-5", "1w", "1h30m", "h", "1e3"])
def test_anything_else_is_no_duration(text: str) -> None:
    assert log_seconds(text) is None
