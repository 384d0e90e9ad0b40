"""Co-allocated 2-D Poisson: one Jacobi solve split over components that start together.

``gridcore.apps.poisson`` splits the unit square into vertical strips, one per component
(widths proportional to ``components``), and the strips exchange their boundary columns
over TCP every sweep, so every component must run at the same time: a co-allocated job.
KOALA places the components (``policy``), claims them and holds them at the start
barrier until all have started; the barrier hands each its index, its peers and its
listening data port.

Params: ``n`` (interior points per side), ``iterations`` (Jacobi sweeps), ``components``
(processors per component, e.g. ``[4, 8, 4]``), ``policy`` and ``sites``. ``policy``
defaults to ``WF`` (Worst Fit: each component, largest first, goes to the cluster with
the most idle processors left), which spreads the components over clusters, so the run
really is multi-site: on the embedded local sites (8, 4, 4 processors) ``[4, 8, 4]``
takes all three; ``CM`` would pack them onto as few clusters as possible. WF may still
put two components on one large cluster (the Slurm test grid's 16, 16, 4: beta, alpha,
beta); a non-empty ``sites`` (one per component) pins them instead (a fixed request).

The ``check`` task reassembles the strips and compares them with the single-process
solve (bit-identical by construction) and fails above ``MAX_ABS_DIFF``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import timedelta
from pathlib import Path
from typing import Any

from airflow.sdk import Param, dag, task
from airflow.sdk.exceptions import AirflowFailException

from gridcore.apps.launch import MAX_ABS_DIFF, component_command, output_dir, strips_difference
from gridcore_airflow.operators.coallocation import CoAllocationOperator


@dag(
    dag_id="coallocated_poisson",
    schedule=None,
    catchup=False,
    tags=["gridcore", "koala", "coallocation"],
    # Every task survives the loss of its worker (a retry resumes: gridcore's steps are
    # keyed and idempotent); tasks that set their own retries keep them.
    default_args={"retries": 2, "retry_delay": timedelta(seconds=5)},
    params={
        "n": Param(64, type="integer", minimum=3),
        "iterations": Param(400, type="integer", minimum=1),
        "components": Param([4, 8, 4], type="array", items={"type": "integer", "minimum": 1}),
        "policy": Param("WF", type="string", enum=["WF", "CF", "CM", "FCM"]),
        "sites": Param([], type="array", items={"type": "string"}),
    },
    doc_md=__doc__,
)
def coallocated_poisson() -> None:
    @task(multiple_outputs=True)
    def plan(**context: Any) -> dict[str, Any]:
        p = context["params"]
        out = output_dir(context["run_id"])
        out.mkdir(parents=True, exist_ok=True)
        sites = list(p.get("sites") or [])
        return {
            "command": component_command(p["n"], p["iterations"], p["components"], out),
            "components": list(p["components"]),
            "policy": p["policy"],
            "kind": "fixed" if sites else "non-fixed",
            "sites": sites or None,
            "out_dir": str(out),
        }

    planned = plan()
    # Retries are safe: a retry reattaches to the job its earlier try submitted (task
    # state store). They also absorb Airflow 3.3.2 failing a deferred task whose trigger
    # fired before the executor reported the defer-exit (apache/airflow#67287, #72716).
    solve = CoAllocationOperator(
        task_id="coallocate",
        retries=2,
        retry_delay=timedelta(seconds=2),
        command=planned["command"],
        components=planned["components"],
        kind=planned["kind"],
        sites=planned["sites"],
        policy=planned["policy"],
        poll_interval=0.5,
    )

    @task
    def check(out_dir: str, result: Mapping[str, Any], **context: Any) -> dict[str, Any]:
        p = context["params"]
        difference = strips_difference(Path(out_dir), len(result["sites"]), p["n"], p["iterations"])
        summary = {
            "max_abs_diff": difference,
            "barrier_skew_s": result["barrier_skew_s"],
            "sites": result["sites"],
        }
        print(json.dumps(summary))
        if difference > MAX_ABS_DIFF:
            raise AirflowFailException(
                f"max_abs_diff {difference:.3e} above {MAX_ABS_DIFF:g}: the split solve"
                " disagrees with the single-process one"
            )
        return summary

    check(planned["out_dir"], solve.output)


coallocated_poisson()
