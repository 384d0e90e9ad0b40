"""The KOALA placement experiment of e-Science 2006 (Sec. 5-6, Fig. 7) with its defaults."""

from __future__ import annotations

import itertools
import json
import statistics
from pathlib import Path
from typing import Any

import pytest

from gridcore.errors import ConfigError
from gridcore.experiments.coallocation_placement import (
    METRICS,
    component_counts,
    koala_placement_experiment,
    plot_koala_placement,
    workload_trace,
)

POLICIES = ("WF", "CM", "FCM")


@pytest.fixture(scope="module")
def result() -> dict[str, Any]:
    return koala_placement_experiment()


def test_result_has_both_workloads_every_policy_and_metric(result: dict[str, Any]) -> None:
    assert set(result) == {"workloads", "setup"}
    assert set(result["workloads"]) == {"W1", "W2"}
    for policies in result["workloads"].values():
        assert tuple(policies) == POLICIES
        for metrics in policies.values():
            assert set(metrics) == {*METRICS, "jobs"}
            assert metrics["jobs"] == 200
            assert metrics["mean_response_s"] == pytest.approx(
                metrics["mean_wait_s"] + metrics["mean_execution_s"]
            )
            assert 1.0 <= metrics["mean_clusters_combined"] <= 5.0
    assert json.loads(json.dumps(result)) == result  # plain data


def test_setup_is_the_paper_s_testbed_and_workloads(result: dict[str, Any]) -> None:
    setup = result["setup"]
    assert (setup["seed"], setup["runs"], setup["jobs"], setup["comm_factor"]) == (0, 1, 200, 1.0)
    clusters = {c["name"]: (c["functioning_nodes"], c["processors"]) for c in setup["clusters"]}
    assert clusters == {
        "vu": (67, 134),
        "uva": (20, 40),
        "delft": (26, 52),
        "utrecht": (28, 56),
        "leiden": (19, 38),
    }
    assert setup["total_processors"] == 320
    assert setup["scan_interval_s"] == 4.0
    assert {w: v["mean_interarrival_s"] for w, v in setup["workloads"].items()} == {
        "W1": 80.0,
        "W2": 40.0,
    }
    assert setup["background"]["band_processors"] == [48, 64]


def test_w2_fcm_beats_cm_beats_wf_and_cm_combines_no_more_clusters_than_wf(
    result: dict[str, Any],
) -> None:
    w2 = result["workloads"]["W2"]
    response = {p: w2[p]["mean_response_s"] for p in POLICIES}
    assert response["FCM"] < response["CM"] < response["WF"]
    assert w2["CM"]["mean_clusters_combined"] <= w2["WF"]["mean_clusters_combined"]


def test_the_mechanisms_of_sec_6_2(result: dict[str, Any]) -> None:
    w1, w2 = result["workloads"]["W1"], result["workloads"]["W2"]
    # FCM also wins under low contention; WF is worst under both (Fig. 7(a)).
    assert w1["FCM"]["mean_response_s"] < w1["CM"]["mean_response_s"]
    assert w1["CM"]["mean_response_s"] < w1["WF"]["mean_response_s"]
    # FCM's gain under W2 is queue time: it splits to fit sooner...
    assert w2["FCM"]["mean_wait_s"] < w2["CM"]["mean_wait_s"] < w2["WF"]["mean_wait_s"]
    # ...at the cost of more clusters combined than CM, still fewer than WF (Fig. 7(d, e)).
    assert (
        w2["CM"]["mean_clusters_combined"]
        < w2["FCM"]["mean_clusters_combined"]
        < w2["WF"]["mean_clusters_combined"]
    )
    for workload in (w1, w2):
        # Fewer clusters, shorter execution (Fig. 7(c)).
        assert workload["CM"]["mean_execution_s"] < workload["WF"]["mean_execution_s"]
        assert workload["FCM"]["mean_execution_s"] < workload["WF"]["mean_execution_s"]
    for policy in POLICIES:
        # Execution times grow with contention, as more clusters are combined (Fig. 7(c)).
        assert w2[policy]["mean_execution_s"] > w1[policy]["mean_execution_s"]
        assert w2[policy]["mean_clusters_combined"] > w1[policy]["mean_clusters_combined"]
        # Low contention: every policy's queue time is low (Fig. 7(f)), under half a minute.
        assert w1[policy]["mean_wait_s"] < 30.0


def test_the_job_mix_is_sec_5_4_s() -> None:
    assert (component_counts(36), component_counts(64), component_counts(72)) == (
        (2, 3, 4),
        (4,),
        (3, 4),
    )
    w1, w2 = workload_trace(0, 200, 80.0), workload_trace(0, 200, 40.0)
    assert len(w1) == 200
    for job in w1:
        assert job.size in {36, 64, 72} and len(set(job.component_sizes)) == 1
        assert max(job.component_sizes) <= 24
        assert len(job.component_sizes) in component_counts(job.size)
        assert job.size in ({36, 64} if job.application == "laplace" else {36, 64, 72})
    # W2 holds the same jobs at twice the arrival rate.
    assert [j.component_sizes for j in w1] == [j.component_sizes for j in w2]
    assert all(a.arrival_s == pytest.approx(2 * b.arrival_s) for a, b in zip(w1, w2, strict=True))
    gaps = [b.arrival_s - a.arrival_s for a, b in itertools.pairwise(w1)]
    assert 60.0 < statistics.fmean(gaps) < 100.0


def test_the_plot_is_written(result: dict[str, Any], tmp_path: Path) -> None:
    path = tmp_path / "koala.png"
    plot_koala_placement(result, str(path))
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert path.stat().st_size > 10_000


def test_runs_pool_independent_repetitions() -> None:
    pooled = koala_placement_experiment(seed=1, jobs=20, runs=2)
    assert pooled["setup"]["runs"] == 2
    assert all(m["jobs"] == 40 for m in pooled["workloads"]["W1"].values())
    with pytest.raises(ConfigError, match="runs"):
        koala_placement_experiment(runs=0)
