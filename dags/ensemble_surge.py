"""Storm-surge ensemble: one forcing file in, N members spread over the grid's sites.

A forcing file (JSON) dropped into ``$GRIDCORE_FORCING_DIR`` (default
``$GRIDCORE_HOME/forcing``) triggers a run through the ``gridcore_forcing`` asset's
watcher; the watcher claims the file and the run takes it, so each file is used by
exactly one run (``ForcingFileTrigger``: a claimed file whose event was lost with a
stopped triggerer is announced again after ``$GRIDCORE_FORCING_REEMIT_S``, default
600 s, and a second run with an already-taken file is skipped)::

    {"storm": "alberto", "members": 10, "processors": [4, 2], "runtime_s": 3,
     "wind_ms": 40}

``processors`` is one integer for every member or a list cycled over the members;
``wind_ms`` (default 35) is the peak wind the members perturb (0.8x to 1.2x). A manual
run (or ``dag.test()``) has no forcing event and uses the DAG params instead.

The members arrive as a burst, and the burst is decided at once:
:class:`~gridcore_airflow.operators.select_sites.SelectSitesOperator` chooses every
member's site in one decision (one snapshot, one transaction; gridcore's default,
earliest estimated completion, sees each member after the ones before it in flight), so
the burst spreads over the sites instead of piling onto the one that looked idlest. Each
member is then a :class:`~gridcore_airflow.operators.site_job.SiteJobOperator` given its
``selection_id``: it submits the selection made for it and waits for its job.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
from collections.abc import Iterable, Mapping, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

from airflow.sdk import Asset, AssetWatcher, Param, dag, task
from airflow.sdk.exceptions import AirflowSkipException

from gridcore_airflow.operators.select_sites import SelectSitesOperator, with_selections
from gridcore_airflow.operators.site_job import SiteJobOperator
from gridcore_airflow.sensors.triggers import (
    REEMIT_AFTER_S,
    ForcingFileTrigger,
    take_forcing_file,
)

MAX_MEMBERS = 256
DEFAULT_WIND_MS = 35.0
# Simulated storm hours per second of a member's runtime estimate. One storm hour costs
# about 0.1 s of one core here (2000 cells, a few drag variants batched), so a member
# needs about a third of its estimate alone, leaving room for a burst sharing the cores.
STORM_HOURS_PER_RUNTIME_S = 3.0


def forcing_dir() -> str:
    explicit = os.environ.get("GRIDCORE_FORCING_DIR")
    if explicit:
        return explicit
    home = os.environ.get("GRIDCORE_HOME") or str(Path.home() / ".gridcore")
    return str(Path(home) / "forcing")


gridcore_forcing = Asset(
    "gridcore_forcing",
    watchers=[
        AssetWatcher(
            name="forcing_watcher",
            trigger=ForcingFileTrigger(
                directory=forcing_dir(),
                pattern="*.json",
                # a claimed file no run took (its event lost) is announced again after
                reemit_after_s=float(os.environ.get("GRIDCORE_FORCING_REEMIT_S", REEMIT_AFTER_S)),
            ),
        )
    ],
)

# One member: a linear 1-D shallow-water model of a wind-driven surge over a shoaling
# shelf (coastal wall at the right), forward-backward time stepping at CFL 0.5. The
# member's processors each carry one bottom-drag variant, computed as one batched array.
SURGE_MODEL = """\
import os, time
import numpy as np
G, RHO_W, RHO_A, CD, L = 9.81, 1025.0, 1.2, 1.5e-3, 150e3
cells, hours = int(os.environ["SURGE_CELLS"]), float(os.environ["SURGE_HOURS"])
wind = float(os.environ["WIND_MS"])
cpus = os.environ.get("GRIDCORE_PROCESSORS") or os.environ.get("SLURM_CPUS_PER_TASK")
variants = max(1, int(cpus or 1))
dx = L / cells
x = (np.arange(cells) + 0.5) * dx
h = 4.0 + 196.0 * (1.0 - x / L) ** 2
hf = np.concatenate([[h[0]], 0.5 * (h[1:] + h[:-1]), [h[-1]]])
dt = 0.5 * dx / np.sqrt(G * h.max())
steps = int(hours * 3600 / dt)
drag = np.linspace(1.0e-3, 3.0e-3, variants)[:, None]
eta, u = np.zeros((variants, cells)), np.zeros((variants, cells + 1))
peak, t0 = np.zeros(variants), time.time()
for n in range(steps):
    w = wind * np.sin(np.pi * min(n * dt / (hours * 3600), 1.0))
    tau = RHO_A * CD * w * abs(w) / RHO_W
    u[:, 1:-1] += dt * (-G * np.diff(eta, axis=1) / dx + (tau - drag * u[:, 1:-1]) / hf[1:-1])
    u[:, 0], u[:, -1] = u[:, 1], 0.0
    eta -= dt * np.diff(hf * u, axis=1) / dx
    eta[:, 0] = 0.0
    np.maximum(peak, eta[:, -1], out=peak)
print(f"RESULT storm={os.environ['STORM']} member={os.environ['MEMBER']}",
      f"site={os.environ.get('GRIDCORE_SITE') or os.environ.get('SLURM_CLUSTER_NAME', '?')}",
      f"wind_ms={wind:.1f} variants={variants}",
      f"steps={steps} peak_surge_m={peak.max():.3f} mean_peak_m={peak.mean():.3f}",
      f"wall_s={time.time() - t0:.2f}")
"""
# The DAG-processing interpreter has numpy; local sites and same-host Slurm clusters
# can run it by path.
MEMBER_COMMAND = (
    "OMP_NUM_THREADS=${GRIDCORE_PROCESSORS:-${SLURM_CPUS_PER_TASK:-1}} "
    f"{shlex.quote(sys.executable)} -c {shlex.quote(SURGE_MODEL)}"
)


# How a mapped member is shown in the UI instead of "Map Index N": its storm, member
# number and wind, and its site once chosen (the operator puts it in the context).
MEMBER_LABEL = (
    "{{ task.env['STORM'] }} #{{ task.env['MEMBER'] }} wind {{ task.env['WIND_MS'] }} m/s"
    "{% if gridcore_site is defined and gridcore_site %} @ {{ gridcore_site }}{% endif %}"
)


def member_rows(
    storm: str,
    members: int,
    processors: int | Sequence[int],
    runtime_s: float,
    wind_ms: float = DEFAULT_WIND_MS,
) -> list[dict[str, Any]]:
    """``expand_kwargs`` rows for one storm's members; ValueError names a bad field."""
    if isinstance(members, bool) or not isinstance(members, int) or not 0 < members <= MAX_MEMBERS:
        raise ValueError(f"members: must be an integer in 1..{MAX_MEMBERS}, got {members!r}")
    cycle = [processors] if isinstance(processors, int) else list(processors)
    if not cycle or any(isinstance(p, bool) or not isinstance(p, int) or p <= 0 for p in cycle):
        raise ValueError(
            f"processors: must be a positive integer or a list of them, got {processors!r}"
        )
    if isinstance(runtime_s, bool) or not isinstance(runtime_s, int | float) or runtime_s <= 0:
        raise ValueError(f"runtime_s: must be a positive number, got {runtime_s!r}")
    rows = []
    for i in range(members):
        spread = 0.8 + 0.4 * (i / (members - 1) if members > 1 else 0.5)
        env = {
            "STORM": storm,
            "MEMBER": str(i),
            "WIND_MS": f"{wind_ms * spread:.2f}",
            "SURGE_CELLS": "2000",
            "SURGE_HOURS": f"{runtime_s * STORM_HOURS_PER_RUNTIME_S:g}",
        }
        rows.append(
            {"processors": cycle[i % len(cycle)], "runtime_s": float(runtime_s), "env": env}
        )
    return rows


def plan_from_forcing(forcing: Mapping[str, Any], name: str, source: str) -> list[dict[str, Any]]:
    """Rows for one forcing file (``name`` as dropped, read from ``source``)."""
    try:
        return member_rows(
            storm=str(forcing.get("storm") or Path(name).stem),
            members=forcing.get("members", 8),
            processors=forcing.get("processors", 2),
            runtime_s=forcing.get("runtime_s", 2),
            wind_ms=float(forcing.get("wind_ms", DEFAULT_WIND_MS)),
        )
    except (TypeError, ValueError) as exc:
        raise ValueError(f"forcing file {source}: {exc}") from exc


def forcing_payloads(triggering_events: Mapping[Any, Iterable[Any]]) -> list[dict[str, Any]]:
    """The ForcingFileTrigger payloads among a run's triggering asset events."""
    payloads = []
    for events in triggering_events.values():
        for event in events:
            payload = (event.extra or {}).get("payload")
            if isinstance(payload, dict) and "path" in payload:
                payloads.append(payload)
    return payloads


@dag(
    dag_id="ensemble_surge",
    schedule=[gridcore_forcing],
    catchup=False,
    tags=["gridcore", "ensemble"],
    # Every task survives the loss of its worker (a retry resumes: gridcore's steps are
    # keyed and idempotent); tasks that set their own retries keep them.
    default_args={"retries": 2, "retry_delay": timedelta(seconds=5)},
    params={
        "storm": Param("manual", type="string"),
        "members": Param(8, type="integer", minimum=1, maximum=MAX_MEMBERS),
        "processors": Param(2, type="integer", minimum=1),
        "runtime_s": Param(2, type="number", exclusiveMinimum=0),
    },
    doc_md=__doc__,
)
def ensemble_surge() -> None:
    @task
    def plan_members(**context: Any) -> list[dict[str, Any]]:
        payloads = forcing_payloads(context.get("triggering_asset_events") or {})
        if not payloads:
            p = context["params"]
            return member_rows(p["storm"], p["members"], p["processors"], p["runtime_s"])
        rows: list[dict[str, Any]] = []
        for payload in payloads:
            # the file this run takes (exactly one run takes a claimed file: another run
            # with the same file, from an event announced again, gets None)
            path = take_forcing_file(payload["path"], context["run_id"])
            if path is not None:
                rows += plan_from_forcing(json.loads(path.read_text()), payload["name"], str(path))
        if not rows:
            raise AirflowSkipException(
                "every forcing file of this run was taken by another run (a repeated event)"
            )
        return rows

    rows = plan_members()
    # One decision for the whole burst; a retry returns the same selections (task state
    # store) instead of deciding a second burst.
    burst = SelectSitesOperator(
        task_id="select_sites", members=rows, member_task_id="member", retries=2
    )

    @task
    def member_kwargs(
        planned: Sequence[Mapping[str, Any]], decided: Sequence[Mapping[str, Any]]
    ) -> list[dict[str, Any]]:
        return with_selections(planned, decided)

    # Retries are safe: a retry reattaches to the selection its earlier try submitted
    # (task state store) instead of submitting again. They also absorb Airflow 3.3.2
    # failing a deferred task whose trigger fired before the executor reported the
    # defer-exit (apache/airflow#67287, #72716).
    members = SiteJobOperator.partial(
        task_id="member",
        command=MEMBER_COMMAND,
        map_index_template=MEMBER_LABEL,
        poll_interval=0.5,
        retries=2,
        retry_delay=timedelta(seconds=2),
    ).expand_kwargs(member_kwargs(rows, burst.output))

    @task
    def summary(results: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        rows = [
            {
                "member": i,
                "site": r["site"],
                "job_id": r["job_id"],
                "state": r["state"],
                "queued_s": r["queued_s"],
                "run_s": _elapsed(r.get("started_at"), r.get("finished_at")),
            }
            for i, r in enumerate(results)
        ]
        table = render_table(rows)
        print(table)
        per_site: dict[str, int] = {}
        for row in rows:
            per_site[row["site"]] = per_site.get(row["site"], 0) + 1
        return {"members": rows, "per_site": per_site, "table": table}

    summary(members.output)


def _elapsed(start: float | None, end: float | None) -> float | None:
    return None if start is None or end is None else round(end - start, 3)


def render_table(rows: Sequence[Mapping[str, Any]]) -> str:
    def fmt(value: Any) -> str:
        return "-" if value is None else f"{value:.2f}" if isinstance(value, float) else str(value)

    header = ("member", "site", "job_id", "state", "queued_s", "run_s")
    lines = [header, *[tuple(fmt(row[key]) for key in header) for row in rows]]
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    return "\n".join(
        "  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)) for line in lines
    )


ensemble_surge()
