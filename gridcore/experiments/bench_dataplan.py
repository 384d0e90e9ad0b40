"""``gridcore bench dataplan``: what choosing a storage plan costs (Bent et al., DADC 2009;
``docs/papers.md``).

* ``choose_100000x50_ms``: the paper's chooser
  (:func:`~gridcore.policies.dataplan.choose_bent2009`, closed-form models) on
  :data:`CANONICAL_WORKLOAD`, W = 100,000 pipelines of D = 50 jobs, on Table 2's cluster
  (:func:`~gridcore.policies.dataplan.table2_environment`); the median over
  :data:`CHOOSE_REPEATS` calls, against the target :data:`CHOOSE_TARGET_MS` = 5 ms. A
  noisy or slow machine moves it, so the same run times a fixed pure-Python loop
  (:func:`baseline_loop`) interleaved with those calls, and ``choose_to_baseline`` is the
  ratio of the two medians: machines compare by it.
* ``simulation_choose_small_ms``: for information, the simulation chooser
  (:func:`~gridcore.dataplan.choosers.choose_by_simulation`) on a small workload
  (:data:`SMALL_WORKLOAD`, Table 1's mixed pipelines, 20 of them), the median of
  :data:`SIMULATION_REPEATS` calls, with the seeds its pick was simulated on.
* ``dag_parse_s``: the example DAG's parse time: how long ``DagBag(dag_folder=FILE)``
  takes in a fresh subprocess once Airflow itself is imported (the DAG file's own imports,
  the plan, read from the plan cache once the first run has made it
  (:func:`~gridcore.dataplan.planning.cached_plan`), and the DAG's construction: what a
  DAG processor, which has Airflow loaded, spends on the file, and what
  ``dag_file_processor_timeout`` bounds), the median of :data:`DAG_PARSE_REPEATS` runs
  with ``AIRFLOW__CORE__LOAD_EXAMPLES=False``; ``dag_parse_process_s`` is the whole
  subprocess (interpreter start and Airflow's import included) beside it, and
  ``airflow_import_s`` that import alone. Only when ``dag_file`` (default
  :data:`DAG_FILE`, ``dags/batch_pipeline.py``) exists; otherwise, or when a run fails or
  reports import errors, ``null`` with ``dag_parse_reason``. Airflow 3's DagBag takes no
  ``include_examples`` (the setting is read from the configuration instead) and lives in
  ``airflow.dag_processing.dagbag`` (``airflow.models.dagbag`` is a deprecated alias).
  ``gridcore`` never imports Airflow: the subprocess does.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from gridcore.dataplan.choosers import choose_by_simulation
from gridcore.experiments.registry import Experiment, figures_line, run_bench_stages
from gridcore.policies.dataplan import (
    GB,
    TABLE1_WORKLOADS,
    Workload,
    choose_bent2009,
    table2_environment,
)

CANONICAL_WORKLOAD = Workload(W=100_000, D=50, S_B=2 * GB, S_P=GB / 1000, R_bar=5000.0, SD_R=500.0)
"""W = 100,000 pipelines of D = 50 jobs, Table 1's runtimes (5,000 s, SD 500 s); 2 GB batch
and 1 MB private volumes, so that on Table 2's 250 GB AllBatch, Slice and Minimal are all
possible and the chooser predicts each (All, needing W (D + 1) private volumes, never is
at this width)."""
SMALL_WORKLOAD = replace(TABLE1_WORKLOADS["mixed"], W=20)
CHOOSE_REPEATS = 200
CHOOSE_TARGET_MS = 5.0
BASELINE_LOOP_N = 10_000
SIMULATION_REPEATS = 3
DAG_PARSE_REPEATS = 3
DAG_PARSE_TIMEOUT_S = 300.0
DAG_FILE = Path(__file__).resolve().parents[2] / "dags" / "batch_pipeline.py"
"""The example DAG the lead writes; its parse time is measured only if it exists."""


def bench_dataplan(dag_file: Path | None = DAG_FILE) -> dict[str, Any]:
    """Every figure of the module docstring. ``dag_file``: the DAG whose parse time is
    ``dag_parse_s`` (``None``: not measured, reported ``null`` with the reason)."""
    stages: dict[str, Callable[[], dict[str, Any]]] = {
        "paper's chooser": bench_choose,
        "simulation chooser": bench_simulation_choose,
        "DAG parse": lambda: bench_dag_parse(dag_file),
    }
    return run_bench_stages("bench dataplan", stages)


def bench_choose(repeats: int = CHOOSE_REPEATS) -> dict[str, Any]:
    """The paper's chooser on :data:`CANONICAL_WORKLOAD` and the baseline loop, each
    call timed alternately so that both see the same machine."""
    env = table2_environment()
    plan = choose_bent2009(CANONICAL_WORKLOAD, env)  # a warm-up, and the plan reported
    choose, baseline = [], []
    for _ in range(repeats):
        choose.append(_seconds(lambda: choose_bent2009(CANONICAL_WORKLOAD, env)))
        baseline.append(_seconds(baseline_loop))
    choose_ms = statistics.median(choose) * 1e3
    baseline_ms = statistics.median(baseline) * 1e3
    return {
        "choose_100000x50_ms": choose_ms,
        "choose_target_ms": CHOOSE_TARGET_MS,
        "choose_within_target": choose_ms <= CHOOSE_TARGET_MS,
        "baseline_loop_ms": baseline_ms,
        "choose_to_baseline": choose_ms / baseline_ms,
        "choose_repeats": repeats,
        "choose_pick": plan.strategy.value,
        "choose_considered": [s.value for s in plan.considered],
    }


def baseline_loop() -> int:
    """The yardstick: a fixed pure-Python loop (squares summed over
    :data:`BASELINE_LOOP_N` integers), about half a millisecond on a 2020s core."""
    return sum(i * i for i in range(BASELINE_LOOP_N))


def bench_simulation_choose(repeats: int = SIMULATION_REPEATS) -> dict[str, Any]:
    """The simulation chooser on :data:`SMALL_WORKLOAD` (for information: it simulates)."""
    env = table2_environment()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        plan = choose_by_simulation(SMALL_WORKLOAD, env)
        samples.append(time.perf_counter() - start)
    return {
        "simulation_choose_small_ms": statistics.median(samples) * 1e3,
        "simulation_small_workload": {"W": SMALL_WORKLOAD.W, "D": SMALL_WORKLOAD.D},
        "simulation_small_pick": plan.label,
        "simulation_small_seeds": len(plan.seeds),
    }


def bench_dag_parse(
    dag_file: Path | None = DAG_FILE,
    repeats: int = DAG_PARSE_REPEATS,
    python: str = sys.executable,
) -> dict[str, Any]:
    """``dag_parse_s`` (module docstring) and ``dag_parse_reason`` (``None`` when
    measured). Airflow's home and gridcore's state directory (where the plan is cached)
    are a temporary directory unless ``AIRFLOW_HOME`` / ``GRIDCORE_HOME`` are set, so
    the bench never writes the user's ``~/airflow`` or ``~/.gridcore``; the first run
    plans, the others read the cached plan, as a DAG processor does."""
    if dag_file is None:
        return _no_parse("no DAG file given")
    if not dag_file.is_file():
        return _no_parse(f"{dag_file} does not exist")
    code = (
        "import json, sys, time\n"
        "t0 = time.perf_counter()\n"
        "from airflow.dag_processing.dagbag import DagBag\n"
        "t1 = time.perf_counter()\n"
        f"bag = DagBag(dag_folder={str(dag_file)!r})\n"
        "t2 = time.perf_counter()\n"
        "if bag.import_errors:\n"
        "    sys.exit('import errors in ' + ', '.join(sorted(bag.import_errors)))\n"
        "print(json.dumps({'import_s': t1 - t0, 'parse_s': t2 - t1}))\n"
    )
    with tempfile.TemporaryDirectory(prefix="gridcore-bench-airflow-") as home:
        homes = {"AIRFLOW_HOME": home, "GRIDCORE_HOME": os.path.join(home, "gridcore")}
        env = homes | dict(os.environ) | {"AIRFLOW__CORE__LOAD_EXAMPLES": "False"}
        parse, process, imports = [], [], []
        for _ in range(repeats):
            start = time.perf_counter()
            failed, timings = _parse_once(python, code, env, dag_file.parent.parent)
            process.append(time.perf_counter() - start)
            if failed is not None:
                return _no_parse(failed)
            parse.append(timings["parse_s"])
            imports.append(timings["import_s"])
    return {
        "dag_parse_s": statistics.median(parse),
        "dag_parse_process_s": statistics.median(process),
        "airflow_import_s": statistics.median(imports),
        "dag_parse_reason": None,
    }


def _parse_once(
    python: str, code: str, env: Mapping[str, str], cwd: Path
) -> tuple[str | None, dict[str, float]]:
    """One parse in a subprocess run from the repository (as ``python -c`` from there
    would, the repository's packages importable): why it failed (or ``None``) and its
    timings."""
    try:
        done = subprocess.run(
            [python, "-c", code],
            env=env,
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=DAG_PARSE_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        return f"the DagBag run did not complete: {error}", {}
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return f"the DagBag run exited {done.returncode}: {last}", {}
    try:
        timings = json.loads(done.stdout.strip().splitlines()[-1])
        return None, {"import_s": float(timings["import_s"]), "parse_s": float(timings["parse_s"])}
    except (ValueError, KeyError, IndexError, TypeError):
        return f"the DagBag run printed no timings: {done.stdout[-200:]!r}", {}


def _no_parse(reason: str) -> dict[str, Any]:
    return {
        "dag_parse_s": None,
        "dag_parse_process_s": None,
        "airflow_import_s": None,
        "dag_parse_reason": reason,
    }


def _seconds(call: Callable[[], object]) -> float:
    start = time.perf_counter()
    call()
    return time.perf_counter() - start


DATAPLAN = Experiment(
    "Bent et al. DADC 2009: the paper's chooser on 100,000 x 50 jobs (target 5 ms), the"
    " simulation chooser on a small workload, the example DAG's parse time",
    lambda options: bench_dataplan(),
    figures_line,
)
