"""``gridcore experiment dataplan --live`` (issue 10 item 7), on one example site: every
feasible plan run on a real local site through the same runner as the example DAG,
each chooser's prediction beside the measured makespans. Times are not asserted (a
shared machine): the structure, that every plan ran every time, and the rule deciding
the measured best are."""

from __future__ import annotations

import json
import math

import pytest

from gridcore.dataplan.live import _within_noise, live_ok, live_table, run_live


def test_every_feasible_plan_is_measured_beside_both_choosers_predictions() -> None:
    result = run_live(runs=2, only_sites=["local-c"])  # local-c: Minimal only, ~25 s a run
    json.dumps(result, allow_nan=False)  # plain JSON, no NaN
    assert set(result["sites"]) == {"local-c"}
    site = result["sites"]["local-c"]
    assert site["feasible"] == ["minimal"]
    (label,) = site["plans"]
    assert label == "minimal"
    plan = site["plans"][label]
    assert set(plan["predicted_s"]) == {"bent2009", "simulation"}
    assert all(v is not None and v > 0 for v in plan["predicted_s"].values())
    assert len(plan["measured_runs_s"]) == 2 and all(v > 0 for v in plan["measured_runs_s"])
    assert math.isclose(plan["measured_s"], sum(plan["measured_runs_s"]) / 2, abs_tol=2e-3)
    assert plan["interval_95_s"] is not None and plan["interval_95_s"] >= 0
    assert site["measured_best"] == "minimal"
    assert site["picks"] == {"bent2009": "minimal", "simulation": "minimal"}
    assert result["site"] == "local-c" and live_ok(result)
    assert "local-c (feasible: minimal)" in live_table(result)


@pytest.mark.parametrize(
    ("pick", "best", "within"),
    [
        ((10.0, 1.0), (9.0, 1.0), True),  # 1 s apart, 2 s of noise
        ((12.5, 1.0), (9.0, 1.0), False),
        ((10.0, None), (9.0, 1.0), False),  # one run: no noise known
    ],
)
def test_a_pick_is_within_noise_of_the_best_when_the_intervals_cover_the_gap(
    pick: tuple[float, float | None], best: tuple[float, float | None], within: bool
) -> None:
    def plan(mean: float, half: float | None) -> dict[str, float | None]:
        return {"measured_s": mean, "interval_95_s": half}

    assert _within_noise(plan(*pick), plan(*best)) is within
