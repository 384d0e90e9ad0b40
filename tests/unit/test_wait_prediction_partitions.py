"""wait-prediction on a multi-cluster log without ``--cluster``: each partition (SWF field
16) replayed on its own machine and queue, as ``--cluster N`` does, the figures pooled
(docs/wait-prediction.md, "Running it")."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from gridcore.experiments.wait_prediction import (
    WAITED_S,
    load_workload,
    metrics,
    replay,
    wait_prediction_experiment,
    wait_prediction_table,
)
from gridcore.policies.wait_prediction import WAIT_MODELS

SWF_LINE = "{n} {submit} {wait} {run} {procs} -1 -1 {procs} {req} -1 1 {user} 1 -1 1 {part} -1 -1"


def _without_cpu(figures: dict[str, Any]) -> dict[str, Any]:
    return {name: {"all": f["all"], "waited": f["waited"]} for name, f in figures.items()}


def test_each_partition_is_replayed_as_its_cluster_run_and_the_figures_pooled(
    tmp_path: Path,
) -> None:
    rows = [
        (1, 0, 10, 100, 8, 200, 1),
        (2, 5, 0, 50, 4, 60, 1),
        (3, 45, 2, 7, 32, 10, 2),
        (4, 50, 0, 10, 4, 20, 2),
    ]
    log = _write_log(tmp_path / "two.swf", rows)
    with open(log, "a") as out:  # a part of job 2 (status 2): skipped as part_line
        out.write("5 60 0 10 4 -1 -1 4 60 -1 2 1 1 -1 1 1 -1 -1\n")
    pooled = wait_prediction_experiment(log)
    alone = {n: wait_prediction_experiment(log, n) for n in (1, 2)}
    # the old replay put both partitions on one machine of MaxProcs in one queue
    assert pooled["trace"]["partitions_replayed"] == [1, 2]
    assert pooled["trace"]["cluster"] is None
    assert pooled["jobs"] == alone[1]["jobs"] + alone[2]["jobs"] == 4
    for number, run in alone.items():
        own = pooled["partitions"][str(number)]
        assert own["predictors"] == _without_cpu(run["predictors"])
        assert own["jobs"] == run["jobs"]
        assert own["skipped"] == run["skipped"]
        for key in ("waited", "processors", "processors_from", "requested_time_filled"):
            assert own[key] == run["trace"][key], key
    # sized from its own jobs (its 32 and 4 held at once for 4 of 13 s), not MaxProcs 64
    assert pooled["partitions"]["2"]["processors"] == 36
    assert pooled["skipped"] == {
        "part_line": 1, "unknown_wait": 0, "unknown_run_time": 0, "unknown_size": 0,
        "larger_than_machine": 0, "no_partition": 0,
    }  # fmt: skip
    assert pooled["trace"]["processors"] == 12 + 36  # each partition sized from its jobs


def _write_log(path: Path, rows: list[tuple[int, ...]]) -> str:
    """Rows of (number, submit, wait, run, processors, requested time, partition)."""
    lines = ["; Version: 2.2", "; Computer: test", "; MaxProcs: 64"]
    for n, submit, wait, run, procs, req, part in rows:
        fields = {"n": n, "submit": submit, "wait": wait, "run": run, "procs": procs}
        lines.append(SWF_LINE.format(**fields, req=req, user=n % 3, part=part))
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def test_pooled_figures_are_the_metrics_of_the_partitions_jobs_together(
    tmp_path: Path,
) -> None:
    # two 8-processor clusters, each busy: the jobs queue behind their own cluster's only
    rows = [
        (1, 0, 0, 1000, 8, 1000, 1),
        (2, 0, 0, 500, 8, 600, 2),
        (3, 10, 990, 100, 8, 200, 1),
        (4, 20, 480, 300, 4, 400, 2),
        (5, 30, 0, 50, 16, 100, -1),  # no partition: skipped
        (6, 40, 1160, 20, 2, 50, 1),
        (7, 50, 450, 10, 4, 30, 2),
        (8, 60, -1, 10, 4, 30, 2),
    ]
    log = _write_log(tmp_path / "grid.swf", rows)
    result = wait_prediction_experiment(log)
    assert result["skipped"]["no_partition"] == 1 and result["skipped"]["unknown_wait"] == 1
    parts = [load_workload(log, n) for n in (1, 2)]
    assert [w.processors for w in parts] == [8, 8]
    answers = [replay(w, {n: f() for n, f in WAIT_MODELS.items()})[0] for w in parts]
    actual = np.array([job.wait_s for w in parts for job in w.jobs])
    waited = actual > WAITED_S
    assert result["jobs"] == actual.size == 6 and result["trace"]["waited"] == int(waited.sum())
    for name in WAIT_MODELS:
        together = [a for own in answers for a in own[name]]
        point = np.array([a.wait_s for a in together])
        bound = np.array([math.inf if a.bound_s is None else a.bound_s for a in together])
        has_bound = any(a.confidence is not None for a in together)
        figures = result["predictors"][name]
        assert figures["all"] == metrics(point, actual, bound if has_bound else None)
        assert figures["waited"] == metrics(
            point[waited], actual[waited], bound[waited] if has_bound else None
        )
    # backfill on each cluster's own 8 processors: job 3 waits for job 1's requested end
    # (1000), job 6 for job 3's (1200); on partition 2 both wait for job 2's (600), 100 s
    # after its logged end
    assert [f.wait_s for f in answers[0]["backfill"]] == [0.0, 990.0, 1160.0]
    assert [f.wait_s for f in answers[1]["backfill"]] == [0.0, 580.0, 550.0]
    assert result["partitions"]["1"]["predictors"]["backfill"]["all"]["within_60s"] == 1.0
    assert result["predictors"]["backfill"]["all"]["within_60s"] == 4 / 6
    table = wait_prediction_table(result)
    assert "2 partitions replayed separately" in table.splitlines()[-1]


@pytest.mark.parametrize("other", [1, -1], ids=["one partition", "one and none"])
def test_a_log_of_one_partition_is_one_machine_as_before(tmp_path: Path, other: int) -> None:
    rows = [(1, 0, 0, 100, 4, 100, 1), (2, 5, 95, 10, 4, 20, other), (3, 6, 0, 10, 2, 20, 1)]
    result = wait_prediction_experiment(_write_log(tmp_path / "one.swf", rows))
    assert "partitions" not in result and "partitions_replayed" not in result["trace"]
    assert result["jobs"] == 3 and result["trace"]["processors_from"] == "MaxProcs"
    assert "no_partition" not in result["skipped"]
    assert "partitions replayed" not in wait_prediction_table(result)
