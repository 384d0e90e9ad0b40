"""A batch-pipeline file rendered into an Airflow DAG: the plan first, then the DAG
(as astronomer-cosmos renders a dbt project), with Airflow's own mechanisms.

:func:`pipeline_dag` loads the pipeline file (``gridcore/dataplan/format.py``), plans it
on the grid's sites with every chooser (``gridcore plan``'s
:func:`~gridcore.dataplan.planning.plan_sites`), and writes the chosen plan's stages
(:func:`~gridcore.policies.dataplan_stages.plan_stages`) as tasks. The plan is made once
per content of the pipeline file and grid and cached in the state directory
(:func:`~gridcore.dataplan.planning.cached_plan`): a DAG processor parsing the file again
renders it from the cache and runs no simulation.

Tasks:

* ``prepare``: every batch volume and input is known to the replica catalog (an input
  given by path is registered at the origin), before anything is staged;
* a FETCH / EVICT stage: one :class:`DataPlanStageOperator` (stage the batch volumes to
  the site; delete them and release their bytes);
* a JOBS stage: one :class:`DataPlanPipelineOperator` mapped over the stage's pipelines
  (dynamic task mapping; each mapped instance labelled with its pipeline's name through
  ``map_index_template``), ``max_active_tis_per_dagrun`` = the stage's concurrency (the
  plan's ``C``); an instance runs its pipeline's jobs at the stage's depths in order;
* dependencies in stage order: the plan's barriers (a Slice's depth ends before the next
  one's batch volume is fetched).

The capacity ledger is the safety net under the DAG: every job holds its volumes' bytes
before it starts (:mod:`gridcore.engine.dataplan`), so an edited DAG (more concurrency, a
stage removed) may run slower or wait, never above the site's storage. The plan and the
reasons for it are the DAG's ``doc_md``.

Tasks wait for their site jobs in the worker (polling), not deferred: one task runs a
whole pipeline's depth-first jobs and the engine's step functions are synchronous.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from airflow.sdk import DAG, Context, get_current_context

from gridcore.dataplan.format import PipelineSpec, load_pipeline
from gridcore.dataplan.planning import DEFAULT_CHOOSER, ChosenPlan, cached_plan
from gridcore.engine.dataplan import (
    DataPlanRunner,
    PipelineRun,
    run_id_from,
    runtime_factory,
    stages_at_site,
)
from gridcore.model import ORIGIN, GridSpec
from gridcore.policies.dataplan import Strategy
from gridcore.policies.dataplan_stages import Stage, StageKind
from gridcore_airflow.operators.base import RESOURCE_FIELDS, GridcoreJobOperator, translated

PIPELINE_CONTEXT_KEY = "gridcore_pipeline"  # what map_index_template shows
DEFAULT_RETRIES = 2


class _DataPlanOperator(GridcoreJobOperator):
    """What the plan's tasks share: the pipeline file, the site and strategy the DAG was
    rendered with, where final outputs go, the emulated WAN rate, and what the pipeline's
    jobs ask of the site over the pipeline file's ``resources`` (``time_limit``,
    ``account``... templated, :class:`~operators.base.GridcoreJobOperator`; as sbatch's
    command line over ``#SBATCH`` lines; only the jobs stage's tasks run jobs)."""

    template_fields: Sequence[str] = ("home_dir", *RESOURCE_FIELDS)

    def __init__(
        self,
        *,
        pipeline_file: str,
        site: str,
        strategy: str,
        home_dir: str,
        wan_mbps: float | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.pipeline_file = pipeline_file
        self.site = site
        self.strategy = strategy
        self.home_dir = home_dir
        self.wan_mbps = wan_mbps

    def runner(self, context: Context, runtime_store: Any, grid: GridSpec) -> DataPlanRunner:
        spec = load_pipeline(self.pipeline_file)
        dag_run = context.get("dag_run")
        run_id = run_id_from(f"{self.dag_id}-{getattr(dag_run, 'run_id', 'manual')}")
        run = PipelineRun(
            run_id,
            spec,
            self.site,
            Strategy(self.strategy),
            (),
            os.path.join(str(self.home_dir), run_id),
            self.wan_mbps,
            self.plan_resources(),
        )
        return DataPlanRunner(grid, runtime_factory(grid, runtime_store), run)


class DataPlanStageOperator(_DataPlanOperator):
    """``prepare``, or one FETCH / EVICT stage of a plan: its batch volumes staged to
    the site, or deleted there and their bytes released.

    :param kind: ``prepare`` | ``fetch`` | ``evict``.
    :param depths: the depths whose batch volumes the stage moves.
    """

    def __init__(self, *, kind: str, depths: Sequence[int] = (), **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.kind = kind
        self.depths = tuple(depths)

    def execute(self, context: Context) -> dict[str, Any]:
        with translated(self.task_id), self.hook().runtime() as runtime:
            runner = self.runner(context, runtime.store, runtime.grid)
            if self.kind == "prepare":
                runner.prepare()
            else:
                stage = Stage(StageKind(self.kind), self.task_id, self.depths)
                runner.run_stage(stage)
        return {"site": self.site, "kind": self.kind, "depths": list(self.depths)}


class DataPlanPipelineOperator(_DataPlanOperator):
    """One pipeline's jobs at a JOBS stage's depths, in order (mapped over pipelines).

    :param pipeline: the pipeline's 0-based index in the file (``expand`` over them).
    :param depths: the depths this stage runs.

    Each job's output lines go into the task log as it runs, a failed job's stderr tail
    after them (:class:`gridcore.engine.dataplan.DataPlanRunner`). Returns (XCom)
    ``{"site", "pipeline", "depths", "output_files", "resources"}``; ``output_files``: job
    name -> ``{"stdout", "stderr"}`` of its latest job, or None; ``resources``: job name ->
    what it asked of the site (:meth:`gridcore.model.JobResources.as_json`).
    """

    def __init__(self, *, pipeline: int, depths: Sequence[int], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.pipeline = pipeline
        self.depths = tuple(depths)

    def execute(self, context: Context) -> dict[str, Any]:
        with translated(self.task_id), self.hook().runtime() as runtime:
            runner = self.runner(context, runtime.store, runtime.grid)
            name = runner.run_spec.spec.pipelines[self.pipeline].name
            get_current_context()[PIPELINE_CONTEXT_KEY] = name  # type: ignore[literal-required]
            runner.run_pipeline(self.pipeline, self.depths)
            files = runner.output_files(self.pipeline, self.depths)
            sent = runner.sent_resources(self.pipeline, self.depths)
        return {
            "site": self.site,
            "pipeline": name,
            "depths": list(self.depths),
            "output_files": files,
            "resources": sent,
        }


def pipeline_dag(
    pipeline_file: str | os.PathLike[str],
    *,
    grid_file: str | os.PathLike[str] | None = None,
    site: str | None = None,
    chooser: str = DEFAULT_CHOOSER,
    home_dir: str,
    emulate_wan: bool = False,
    dag_id: str | None = None,
    dag_kwargs: Mapping[str, Any] | None = None,
    operator_kwargs: Mapping[str, Any] | None = None,
) -> DAG:
    """The DAG of the chosen plan for ``pipeline_file`` (module docstring).

    :param grid_file: the grid the plan is made for and the tasks run on (default: the
        connection's / ``$GRIDCORE_GRID`` / the embedded default, as every operator).
    :param site: plan for this site only (default: every site; the fastest is chosen).
    :param chooser: whose pick is run (``gridcore plan``'s choosers); default
        ``simulation``.
    :param home_dir: where final outputs are written, per run ``<home_dir>/<run>/<pipeline>``.
    :param emulate_wan: pace copies between the origin and the site to the grid's
        bandwidth (one machine standing in for a WAN).
    :param operator_kwargs: more arguments for every task (default: ``retries`` 2 after
        10 s: a task whose worker died runs again and resumes where its steps got), e.g.
        ``time_limit`` or ``account`` for every job, over the pipeline file's.
    """
    from gridcore.config import GRID_ENV, default_grid, load_grid
    from gridcore.state.store import state_dir

    spec = load_pipeline(pipeline_file)
    path = grid_file or os.environ.get(GRID_ENV)
    grid = load_grid(path) if path else default_grid(state_dir())
    chosen = cached_plan(spec, grid, state_dir() / "plans", site=site, chooser=chooser)
    wan = grid.bandwidth(ORIGIN, chosen.site) if emulate_wan else None
    stages = stages_at_site(
        spec,
        grid,
        chosen.site,
        chosen.strategy,
        concurrency=chosen.concurrency,
        group_width=chosen.group_width,
    )
    common: dict[str, Any] = {
        "pipeline_file": str(Path(pipeline_file).resolve()),
        "site": chosen.site,
        "strategy": chosen.strategy.value,
        "home_dir": home_dir,
        "wan_mbps": wan,
        "grid_file": str(Path(grid_file).resolve()) if grid_file is not None else None,
        # a task whose worker died runs again and resumes its steps (none runs twice)
        "retries": DEFAULT_RETRIES,
        "retry_delay": timedelta(seconds=10),
        **dict(operator_kwargs or {}),
    }
    kwargs: dict[str, Any] = {
        "start_date": datetime(2026, 1, 1),
        "catchup": False,
        "tags": ["gridcore", "dataplan"],
        "doc_md": _doc(spec, chosen),
        **dict(dag_kwargs or {}),
    }
    schedule = kwargs.pop("schedule", None)  # a run per trigger unless given
    with DAG(dag_id or spec.name, schedule=schedule, **kwargs) as dag:
        previous: Any = DataPlanStageOperator(task_id="prepare", kind="prepare", **common)
        for stage in stages:
            current: Any
            if stage.kind is StageKind.JOBS:
                current = DataPlanPipelineOperator.partial(
                    task_id=stage.name,
                    depths=stage.depths,
                    max_active_tis_per_dagrun=stage.concurrency,
                    map_index_template="{{ " + PIPELINE_CONTEXT_KEY + " }}",
                    **common,
                ).expand(pipeline=list(stage.pipelines))
            else:
                current = DataPlanStageOperator(
                    task_id=stage.name, kind=stage.kind.value, depths=stage.depths, **common
                )
            previous >> current
            previous = current
    return dag


def _doc(spec: PipelineSpec, chosen: ChosenPlan) -> str:
    lines = [
        f"# {spec.name}: {chosen.strategy.label} at {chosen.site}",
        "",
        f"{spec.W} pipelines x {spec.D} depths, planned by `{chosen.chooser}`: {chosen.why}.",
        "",
        *(f"- {reason}" for reason in chosen.reasons),
    ]
    return "\n".join(lines)
