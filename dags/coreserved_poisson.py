"""Co-reserved 2-D Poisson: one Jacobi solve whose ranks start together inside pilots
(VJM virtual jobs) that co-reserved processors on several clusters.

``processors / vj_size`` pilots go to the clusters with the smallest expected wait (the
default wait model over each site's observed queue and history, VJM Eq. 1 where a site
has not given what it needs: docs/coreservation.md; at most ``max_clusters`` clusters);
each pilot
queues like an ordinary job, registers with the VJ center when its site starts it, and
holds its processors; when every pilot holds, the solver is dispatched to all of them at
once, one strip per pilot (``gridcore.apps.poisson``: the strips exchange boundary
columns over TCP every sweep, so all ranks must run together).

Params: ``n``, ``iterations``, ``processors``, ``vj_size`` (processors per pilot = per
strip), ``max_clusters`` (M), ``sites`` (candidate clusters; empty: all). On the
embedded local sites the default 6 processors fit idle ``local-a`` (8) whole, where the
wait model forecasts every pilot starting at once; more than 8 span clusters.

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
from gridcore_airflow.operators.coreservation import CoReservationOperator


@dag(
    dag_id="coreserved_poisson",
    schedule=None,
    catchup=False,
    tags=["gridcore", "vjm", "coreservation"],
    # Every task survives the loss of its worker (a retry resumes: gridcore's steps are
    # keyed and idempotent); tasks that set their own retries keep them.
    default_args={"retries": 2, "retry_delay": timedelta(seconds=5)},
    params={
        "n": Param(48, type="integer", minimum=3),
        "iterations": Param(300, type="integer", minimum=1),
        "processors": Param(6, type="integer", minimum=1),
        "vj_size": Param(2, type="integer", minimum=1),
        "max_clusters": Param(3, type="integer", minimum=1),
        "sites": Param([], type="array", items={"type": "string"}),
    },
    doc_md=__doc__,
)
def coreserved_poisson() -> None:
    @task(multiple_outputs=True)
    def plan(**context: Any) -> dict[str, Any]:
        p = context["params"]
        if p["processors"] % p["vj_size"]:
            raise AirflowFailException(
                f"processors {p['processors']} is not a multiple of vj_size {p['vj_size']}"
            )
        ranks = p["processors"] // p["vj_size"]
        out = output_dir(context["run_id"])
        out.mkdir(parents=True, exist_ok=True)
        return {
            "command": component_command(p["n"], p["iterations"], [p["vj_size"]] * ranks, out),
            "processors": p["processors"],
            "vj_size": p["vj_size"],
            "max_clusters": p["max_clusters"],
            "sites": list(p.get("sites") or []) or None,
            "out_dir": str(out),
        }

    planned = plan()
    solve = CoReservationOperator(
        task_id="coreserve",
        retries=2,
        retry_delay=timedelta(seconds=2),
        command=planned["command"],
        processors=planned["processors"],
        vj_size=planned["vj_size"],
        max_clusters=planned["max_clusters"],
        sites=planned["sites"],
        lifetime_floor_s=120.0,
        poll_interval=0.5,
    )

    @task
    def check(out_dir: str, result: Mapping[str, Any], **context: Any) -> dict[str, Any]:
        p = context["params"]
        ranks = p["processors"] // p["vj_size"]
        difference = strips_difference(Path(out_dir), ranks, p["n"], p["iterations"])
        summary = {
            "max_abs_diff": difference,
            "clusters": result["clusters"],
            "coallocation_s": result["coallocation_s"],
            "dispatch_skew_s": result["dispatch_skew_s"],
            "t_avail_s": result["t_avail_s"],
            "lifetime_s": result["lifetime_s"],
        }
        print(json.dumps(summary))
        if difference > MAX_ABS_DIFF:
            raise AirflowFailException(
                f"max_abs_diff {difference:.3e} above {MAX_ABS_DIFF:g}: the split solve"
                " disagrees with the single-process one"
            )
        return summary

    check(planned["out_dir"], solve.output)


coreserved_poisson()
